package runstate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Reading manifest.json back into a state: the fast path for the shape
// this package writes, encoding/json for anything else.

// decodeManifest turns manifest.json back into a state. It checks the
// manifest's own shape only; the caller checks it against the ledger.
func decodeManifest(data []byte) (*state, snapshotPos, error) {
	m, ok := decodeManifestFast(data)
	if ok {
		// Used only if it encodes back to the manifest's checksum: then
		// it is what the writer wrote, whatever the fast path's limits.
		sum, err := m.sum(len(data))
		ok = err == nil && sum == m.Sum
	}
	if !ok {
		m = manifest{}
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, snapshotPos{}, err
		}
		if sum, err := m.sum(len(data)); err != nil || sum != m.Sum {
			return nil, snapshotPos{}, fmt.Errorf("checksum does not match its content (edited by hand, or damaged?)")
		}
	}
	if m.Format != FormatVersion {
		return nil, snapshotPos{}, fmt.Errorf("format %d", m.Format)
	}
	if m.Seq <= 0 || m.Ledger.End <= m.Ledger.Offset || m.Ledger.Offset < 0 || len(m.Ledger.Hash) != 64 {
		return nil, snapshotPos{}, fmt.Errorf("no usable ledger position")
	}
	s := newState()
	s.identity = m.Identity
	s.created = m.Created
	s.revision = m.Revision
	s.env = m.Environment
	s.pos = chain{seq: m.Seq, hash: m.Ledger.Hash, offset: m.Ledger.End}
	s.lastLen = m.Ledger.End - m.Ledger.Offset
	s.plan, s.top = m.Plan, m.Plan
	if len(m.Plans) > 0 {
		s.top, s.sub = m.TopPlan, m.Plans
	}
	for _, st := range m.Stages {
		if st == nil || st.Name == "" {
			return nil, snapshotPos{}, fmt.Errorf("stage without a name")
		}
		if st.Attempt < 0 || st.Attempt > maxAttempt {
			return nil, snapshotPos{}, fmt.Errorf("stage %q: attempts %d out of range", st.Name, st.Attempt)
		}
		for _, o := range st.Outputs {
			if o.Size < 0 {
				return nil, snapshotPos{}, fmt.Errorf("stage %q: output %q has a negative size", st.Name, o.Path)
			}
		}
		s.stages[st.Name] = st
	}
	for _, e := range m.Effects {
		if e == nil || e.Key == "" {
			return nil, snapshotPos{}, fmt.Errorf("effect without a key")
		}
		// manifest.json is indented, and so are the raw JSON values in
		// it: compact them back to the ledger's bytes, so that a stored
		// receipt is the same whether Open resumed from the manifest or
		// replayed the ledger.
		e.Receipt, e.Request = compactJSON(e.Receipt), compactJSON(e.Request)
		s.effects[e.Key] = e
	}
	for _, ss := range m.Sessions {
		if ss == nil || ss.ID == "" {
			return nil, snapshotPos{}, fmt.Errorf("session without an id")
		}
		s.sessions[ss.ID] = ss
	}
	s.metrics = m.Metrics
	s.last, s.lastDone = m.Last, m.LastDone
	s.manifestLen = len(data)
	s.derive()
	return s, m.Ledger, nil
}

// compactJSON returns m without insignificant white space.
func compactJSON(m json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if len(m) == 0 || json.Compact(&b, m) != nil {
		return m
	}
	return b.Bytes()
}

// decodeManifestFast reads a manifest as this package writes it: the
// stages and artifacts, which grow with the run, with the ledger's fast
// parser (decode.go), the rest with encoding/json. encoding/json took
// 0.6 s for the 72 MB manifest of 100,000 stages. ok is false for
// anything it does not read (an escape in a string, a field it does not
// know, another layout); decodeManifest then reads the whole with
// encoding/json, as it does when what this returns does not encode back
// to the checksum. FuzzDecodeManifestFast checks it against encoding/json.
func decodeManifestFast(data []byte) (m manifest, ok bool) {
	const stagesKey, artifactsKey = "\n  \"stages\": [", "\"artifacts\""
	i := bytes.Index(data, []byte(stagesKey))
	if i < 0 {
		return m, false
	}
	var d decoder
	p := parser{b: data, i: i + len(stagesKey) - 1}
	stages, ok := list(&p, func(p *parser) (*StageStatus, bool) { return d.stage(p) })
	if !ok {
		return m, false
	}
	p.ws()
	if !p.byte(',') {
		return m, false
	}
	p.ws()
	if !bytes.HasPrefix(data[p.i:], []byte(artifactsKey)) {
		return m, false
	}
	p.i += len(artifactsKey)
	p.ws()
	if !p.byte(':') {
		return m, false
	}
	p.ws()
	artifacts, ok := list(&p, func(p *parser) (Artifact, bool) { return d.artifact(p) })
	if !ok {
		return m, false
	}
	head := make([]byte, 0, i+len(data)-p.i+64)
	head = append(head, data[:i]...)
	head = append(head, "\n  \"stages\": [],\n  \"artifacts\": []"...)
	head = append(head, data[p.i:]...)
	if json.Unmarshal(head, &m) != nil || !uniqueKeys(head) {
		return manifest{}, false // not JSON, or a field given twice: encoding/json decides
	}
	m.Stages, m.Artifacts = stages, artifacts
	return m, true
}

// stage reads one element of manifest.json's stages.
func (d *decoder) stage(p *parser) (*StageStatus, bool) {
	st := &StageStatus{}
	ok := fields(p, func(key []byte) (bit int, ok bool) {
		var n int64
		switch string(key) {
		case "name":
			st.Name, ok = p.text()
			return 1 << 0, ok
		case "state":
			st.State, ok = d.str(p)
			return 1 << 1, ok
		case "attempts":
			n, ok = p.int64()
			st.Attempt = int(n)
			return 1 << 2, ok && n <= 1<<31-1
		case "failures":
			n, ok = p.int64()
			st.Failures = int(n)
			return 1 << 3, ok && n <= 1<<31-1
		case "session":
			st.Session, ok = d.str(p)
			return 1 << 4, ok
		case "inputs":
			st.Inputs, ok = d.inputs(p)
			return 1 << 5, ok
		case "outputs":
			st.Outputs, ok = d.outputs(p)
			return 1 << 6, ok
		case "reason":
			st.Reason, ok = p.text()
			return 1 << 7, ok
		case "error":
			st.Error, ok = p.text()
			return 1 << 8, ok
		case "class":
			st.Class, ok = d.str(p)
			return 1 << 9, ok
		case "review":
			st.Review = bytes.HasPrefix(p.b[p.i:], []byte("true"))
			if st.Review {
				p.i += len("true")
			}
			return 1 << 10, st.Review // false is never written
		case "dropped":
			st.Dropped = bytes.HasPrefix(p.b[p.i:], []byte("true"))
			if st.Dropped {
				p.i += len("true")
			}
			return 1 << 16, st.Dropped // false is never written
		case "done_seq":
			st.DoneSeq, ok = p.int64()
			return 1 << 11, ok
		case "done_at":
			st.DoneAt, ok = p.time()
			return 1 << 12, ok
		case "seq":
			st.Seq, ok = p.int64()
			return 1 << 13, ok
		case "at":
			st.At, ok = p.time()
			return 1 << 14, ok
		case "began_at":
			st.BeganAt, ok = p.time()
			return 1 << 15, ok
		}
		return 0, false
	})
	return st, ok
}

// artifact reads one element of manifest.json's artifacts.
func (d *decoder) artifact(p *parser) (Artifact, bool) {
	var a Artifact
	ok := fields(p, func(key []byte) (bit int, ok bool) {
		switch string(key) {
		case "path":
			a.Path, ok = p.text()
			return 1 << 0, ok
		case "sha256":
			a.SHA256, ok = p.text()
			return 1 << 1, ok
		case "size":
			a.Size, ok = p.int64()
			return 1 << 2, ok
		case "stage":
			a.Stage, ok = p.text()
			return 1 << 3, ok
		case "seq":
			a.Seq, ok = p.int64()
			return 1 << 4, ok
		}
		return 0, false
	})
	return a, ok
}

// uniqueKeys reports whether no key of the top-level object of b (valid
// JSON) is given twice: encoding/json would keep the last one, and the
// fast path has read the first stages and artifacts. encoding/json matches
// keys to fields without regard to case (with Unicode folding) and after
// unescaping them: a key that is not plain ASCII is refused, and keys are
// compared in lower case.
func uniqueKeys(b []byte) bool {
	seen := map[string]bool{}
	depth, key := 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '{', '[':
			depth++
			key = c == '{' && depth == 1
		case '}', ']':
			depth--
		case ',':
			key = depth == 1
		case '"':
			start := i + 1
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if key {
				k := b[start:min(i, len(b))]
				for _, c := range k {
					if c == '\\' || c >= utf8.RuneSelf {
						return false
					}
				}
				lower := strings.ToLower(string(k))
				if seen[lower] {
					return false
				}
				seen[lower] = true
				key = false
			}
		}
	}
	return true
}
