package runstate

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"time"
	"unicode/utf8"
)

// The JSON scanner under decodeFast (decode.go): tokens read the way
// encoding/json reads them, or a refusal that sends the line to it.

// parser reads JSON tokens from b at i, for decodeFast: each method
// returns false for anything it does not read the way encoding/json
// would.
type parser struct {
	b     []byte
	i     int
	plain bool // b is printable ASCII without a backslash (plainLine)
}

// plainLine reports whether line is printable ASCII without a backslash:
// then no string in it has an escape, a control character or a byte that
// needs UTF-8 checking, and str need only find each closing quote. Lines
// the package writes are, unless a text has such characters.
func plainLine(b []byte) bool {
	var acc uint64
	i := 0
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		bs := w ^ 0x5c5c5c5c5c5c5c5c // '\\' becomes 0
		acc |= w | (bs-0x0101010101010101)&^bs | (w-0x2020202020202020)&^w
	}
	for ; i < len(b); i++ {
		if c := b[i]; c < 0x20 || c >= 0x80 || c == '\\' {
			return false
		}
	}
	return acc&0x8080808080808080 == 0
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (p *parser) end() bool {
	p.ws()
	return p.i == len(p.b)
}

// str reads a string without escapes and returns its bytes (in b: copy
// them to keep them). A string with an escape, a control character or
// invalid UTF-8 is left to encoding/json.
func (p *parser) str() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	if p.plain {
		n := bytes.IndexByte(p.b[p.i:], '"')
		if n < 0 {
			return nil, false
		}
		s := p.b[p.i : p.i+n]
		p.i += n + 1
		return s, true
	}
	b := p.b
	start, i := p.i, p.i
	ascii := true
	for {
		// Eight bytes at a time while none is special: a quote, a
		// backslash, a control character or a byte of a multibyte
		// UTF-8 sequence.
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			q := w ^ 0x2222222222222222  // '"' becomes 0
			bs := w ^ 0x5c5c5c5c5c5c5c5c // '\\' becomes 0
			m := (q - 0x0101010101010101) &^ q
			m |= (bs - 0x0101010101010101) &^ bs
			m |= (w - 0x2020202020202020) &^ w // below 0x20
			if (m|w)&0x8080808080808080 != 0 {
				break
			}
			i += 8
		}
		if i >= len(b) {
			return nil, false
		}
		c := b[i]
		switch {
		case c == '"':
			s := b[start:i]
			if !ascii && !utf8.Valid(s) {
				return nil, false
			}
			p.i = i + 1
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
		i++
	}
}

// list reads a JSON array whose elements elem reads.
func list[T any](p *parser, elem func(*parser) (T, bool)) ([]T, bool) {
	if !p.byte('[') {
		return nil, false
	}
	out := []T{}
	p.ws()
	if p.byte(']') {
		return out, true
	}
	for {
		v, ok := elem(p)
		if !ok {
			return nil, false
		}
		out = append(out, v)
		p.ws()
		if p.byte(']') {
			return out, true
		}
		if !p.byte(',') {
			return nil, false
		}
		p.ws()
	}
}

// fields reads a JSON object, calling field with each key (the parser is
// then at the value); it refuses a key given twice. (decodeFast, on the
// replay's hot path, walks its objects inline: through fields, with a
// closure per field, a replay measured 7-8% slower.)
func fields(p *parser, field func(key []byte) (bit int, ok bool)) bool {
	if !p.byte('{') {
		return false
	}
	p.ws()
	if p.byte('}') {
		return true
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
		bit, ok := field(key)
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		p.ws()
		if p.byte('}') {
			return true
		}
		if !p.byte(',') {
			return false
		}
		p.ws()
	}
}

// text reads a free-text string (error, reason, note), which repeats too
// rarely to intern.
func (p *parser) text() (string, bool) {
	b, ok := p.str()
	return string(b), ok
}

// int64 reads a non-negative integer without leading zeros.
func (p *parser) int64() (int64, bool) {
	start := p.i
	var n int64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		if n > (1<<63-1)/10-1 {
			return 0, false // may overflow: let encoding/json say
		}
		n = n*10 + int64(p.b[p.i]-'0')
		p.i++
	}
	switch {
	case p.i == start:
		return 0, false
	case p.b[start] == '0' && p.i-start > 1:
		return 0, false
	case p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return 0, false
	}
	return n, true
}

// time reads a time in the writer's form, RFC 3339 in UTC with 0 to 9
// fractional digits: "2006-01-02T15:04:05.999999999Z".
func (p *parser) time() (time.Time, bool) {
	s, ok := p.str()
	if !ok || len(s) < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[len(s)-1] != 'Z' {
		return time.Time{}, false
	}
	num := func(b []byte) (int, bool) {
		n := 0
		for _, c := range b {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := num(s[0:4])
	month, ok2 := num(s[5:7])
	day, ok3 := num(s[8:10])
	hour, ok4 := num(s[11:13])
	min, ok5 := num(s[14:16])
	sec, ok6 := num(s[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || month < 1 || month > 12 || day < 1 ||
		day > daysIn(time.Month(month), year) || hour > 23 || min > 59 || sec > 59 {
		return time.Time{}, false
	}
	nsec := 0
	if frac := s[19 : len(s)-1]; len(frac) > 0 {
		if frac[0] != '.' || len(frac) < 2 || len(frac) > 10 {
			return time.Time{}, false
		}
		n, ok := num(frac[1:])
		if !ok {
			return time.Time{}, false
		}
		for i := len(frac) - 1; i < 9; i++ {
			n *= 10
		}
		nsec = n
	}
	return time.Date(year, time.Month(month), day, hour, min, sec, nsec, time.UTC), true
}

func daysIn(m time.Month, year int) int {
	return time.Date(year, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// raw reads any JSON value and returns a copy of its bytes, as
// json.RawMessage does. It finds the value's end by nesting and quotes,
// then has encoding/json check it.
func (p *parser) raw() (json.RawMessage, bool) {
	start := p.i
	depth := 0
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch c {
		case '"':
			p.i++
			for p.i < len(p.b) && p.b[p.i] != '"' {
				if p.b[p.i] == '\\' {
					p.i++
				}
				p.i++
			}
			if p.i >= len(p.b) {
				return nil, false
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth < 0 {
				return nil, false
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return p.rawEnd(start)
			}
		}
		p.i++
		if depth == 0 && (c == '}' || c == ']' || c == '"') {
			return p.rawEnd(start)
		}
	}
	return nil, false
}

func (p *parser) rawEnd(start int) (json.RawMessage, bool) {
	v := p.b[start:p.i]
	if len(v) == 0 || checkJSON(v, jsonDepth-1) != nil { // the line is one level more
		return nil, false
	}
	return append(json.RawMessage(nil), v...), true
}
