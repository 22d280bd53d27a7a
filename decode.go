package runstate

// A fast path for reading ledger lines. Replaying a ledger is mostly JSON
// decoding, and encoding/json's reflection made a full replay several
// times slower than the budget of a million records a second. decodeFast
// reads the lines this package writes, in any field order, and gives up
// (ok == false) on anything else: an unknown or repeated field (or input
// name), an escape in a string, null, a number that is not a plain
// integer, a time not in the writer's format. The caller (parse) then
// decodes the line with encoding/json and applies the exact-key rules
// encoding/json does not (checkLine), so what is accepted, rejected or
// ignored is what encoding/json decides, less the lines with a key given
// twice or given in another case; FuzzDecodeFast checks that both agree.
// Neither checks the crc field's value: parse does (checkCRC).

// decoder keeps strings that repeat from line to line (session ids, stage
// names, events, paths), so that a replay does not allocate each again.
type decoder struct {
	strs    map[string]string
	session string // the last session: most lines name that of the line before
	crc     bool   // the line decoded last has a crc field (see parse)
}

// maxInterned bounds the decoder's string table.
const maxInterned = 1 << 12

// intern returns b as a string, shared with earlier equal strings.
func (d *decoder) intern(b []byte) string {
	if s, ok := d.strs[string(b)]; ok { // no allocation for the lookup
		return s
	}
	s := string(b)
	if d.strs == nil {
		d.strs = make(map[string]string)
	}
	if len(d.strs) < maxInterned {
		d.strs[s] = s
	}
	return s
}

// Field bits, to refuse a field given twice.
const (
	fSeq = 1 << iota
	fAt
	fEv
	fSession
	fStage
	fAttempt
	fInputs
	fOutputs
	fKey
	fClass
	fError
	fReason
	fNote
	fBy
	fData
	fPrev
	fCRC
)

// decodeFast decodes line (without '\n') into r. prev is the chain hash
// the line should name: when it does, r.Prev shares that string. ok is
// false when the line is not in the form the fast path reads; r is then
// in an unspecified state.
func (d *decoder) decodeFast(line []byte, prev string, r *Record) (ok bool) {
	p := parser{b: line, plain: plainLine(line)}
	p.ws()
	if !p.byte('{') {
		return false
	}
	p.ws()
	if p.byte('}') {
		return p.end()
	}
	seen := 0
	for {
		key, ok := p.str()
		if !ok {
			return false
		}
		p.ws()
		if !p.byte(':') {
			return false
		}
		p.ws()
		bit := 0
		switch string(key) {
		case "seq":
			bit = fSeq
			r.Seq, ok = p.int64()
		case "at":
			bit = fAt
			r.At, ok = p.time()
		case "ev":
			bit = fEv
			var b []byte
			if b, ok = p.str(); ok {
				r.Ev = eventName(b)
			}
		case "session":
			bit = fSession
			var b []byte
			if b, ok = p.str(); ok {
				if string(b) != d.session {
					d.session = d.intern(b)
				}
				r.Session = d.session
			}
		case "stage":
			bit = fStage
			r.Stage, ok = d.str(&p)
		case "attempt":
			bit = fAttempt
			var n int64
			n, ok = p.int64()
			if n > 1<<31-1 { // int may have 32 bits
				return false
			}
			r.Attempt = int(n)
		case "inputs":
			bit = fInputs
			r.Inputs, ok = d.inputs(&p)
		case "outputs":
			bit = fOutputs
			r.Outputs, ok = d.outputs(&p)
		case "key":
			bit = fKey
			r.Key, ok = d.str(&p)
		case "class":
			bit = fClass
			r.Class, ok = d.str(&p)
		case "error":
			bit = fError
			r.Error, ok = p.text()
		case "reason":
			bit = fReason
			r.Reason, ok = p.text()
		case "note":
			bit = fNote
			r.Note, ok = p.text()
		case "by":
			bit = fBy
			r.By, ok = d.str(&p)
		case "data":
			bit = fData
			r.Data, ok = p.raw()
		case "prev":
			bit = fPrev
			var b []byte
			b, ok = p.str()
			switch {
			case !ok:
			case string(b) == prev:
				r.Prev = prev
			default:
				r.Prev = string(b)
			}
		case "crc":
			bit = fCRC
			var b []byte
			b, ok = p.str() // parse checks it
			ok = ok && len(b) == 8
			d.crc = true
		default:
			return false
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		p.ws()
		if p.byte('}') {
			return p.end()
		}
		if !p.byte(',') {
			return false
		}
		p.ws()
	}
}

// eventName returns the constant for a known event, without allocating.
func eventName(b []byte) string {
	switch string(b) {
	case evBegin:
		return evBegin
	case evComplete:
		return evComplete
	case evOpen:
		return evOpen
	case evClose:
		return evClose
	case evFail:
		return evFail
	case evIntent:
		return evIntent
	case evConfirm:
		return evConfirm
	}
	return string(b)
}

// str reads a string value and interns it.
func (d *decoder) str(p *parser) (string, bool) {
	b, ok := p.str()
	if !ok {
		return "", false
	}
	return d.intern(b), true
}

// inputs reads {"name": "fingerprint", ...}.
func (d *decoder) inputs(p *parser) (map[string]string, bool) {
	if !p.byte('{') {
		return nil, false
	}
	m := make(map[string]string, 2)
	p.ws()
	if p.byte('}') {
		return m, true
	}
	for {
		k, ok := p.str()
		if !ok {
			return nil, false
		}
		p.ws()
		if !p.byte(':') {
			return nil, false
		}
		p.ws()
		v, ok := p.str()
		if !ok {
			return nil, false
		}
		n := len(m)
		if m[d.intern(k)] = string(v); len(m) == n {
			return nil, false // a repeated name: parse refuses it
		}
		p.ws()
		if p.byte('}') {
			return m, true
		}
		if !p.byte(',') {
			return nil, false
		}
		p.ws()
	}
}

// outputs reads [{"path": ..., "sha256": ..., "size": N}, ...].
func (d *decoder) outputs(p *parser) ([]Output, bool) {
	if !p.byte('[') {
		return nil, false
	}
	outs := make([]Output, 0, 1)
	p.ws()
	if p.byte(']') {
		return outs, true
	}
	for {
		var o Output
		if !p.byte('{') {
			return nil, false
		}
		p.ws()
		if !p.byte('}') {
			seen := 0
			for {
				k, ok := p.str()
				if !ok {
					return nil, false
				}
				p.ws()
				if !p.byte(':') {
					return nil, false
				}
				p.ws()
				bit := 0
				switch string(k) {
				case "path":
					bit = 1
					o.Path, ok = d.str(p)
				case "sha256":
					bit = 2
					var b []byte
					b, ok = p.str()
					o.SHA256 = string(b)
				case "size":
					bit = 4
					o.Size, ok = p.int64()
				default:
					return nil, false
				}
				if !ok || seen&bit != 0 {
					return nil, false
				}
				seen |= bit
				p.ws()
				if p.byte('}') {
					break
				}
				if !p.byte(',') {
					return nil, false
				}
				p.ws()
			}
		}
		outs = append(outs, o)
		p.ws()
		if p.byte(']') {
			return outs, true
		}
		if !p.byte(',') {
			return nil, false
		}
		p.ws()
	}
}
