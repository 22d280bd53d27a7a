package runstate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// manifestFile is the snapshot of the state, relative to the run directory.
const manifestFile = "manifest.json"

// maxManifest caps what a reader reads of manifest.json: a larger file is
// not used as a snapshot (the state is then replayed from the ledger), so
// that a file put in its place (a link to /dev/zero, a huge file) cannot
// exhaust memory.
const maxManifest = 256 << 20

// Artifact is an output of a done stage, as the manifest lists it.
type Artifact struct {
	Path   string `json:"path"`   // relative to the run directory, with forward slashes
	SHA256 string `json:"sha256"` // hex SHA-256 of the content the stage completed with
	Size   int64  `json:"size"`   // in bytes
	Stage  string `json:"stage"`  // the stage that produced it
	Seq    int64  `json:"seq"`    // the complete record that recorded it
}

// snapshotPos names the last ledger record a manifest reflects: Open checks
// that record (its bytes hash to Hash) and replays only what follows End.
type snapshotPos struct {
	Offset int64  `json:"offset"` // byte offset where that record's line starts
	End    int64  `json:"end"`    // byte offset just past its '\n'
	Hash   string `json:"hash"`   // hex SHA-256 of the line without '\n'
}

// manifest is the JSON form of manifest.json. Its first fields are what a
// person reads; the rest is what Open needs to resume without a replay.
type manifest struct {
	Format      int               `json:"format"`
	ID          string            `json:"id"`
	Request     string            `json:"request"`
	Revision    string            `json:"revision,omitempty"`
	Environment map[string]string `json:"environment,omitempty"`
	Created     time.Time         `json:"created"`
	Seq         int64             `json:"seq"`
	Updated     time.Time         `json:"updated"`
	Plan        []string          `json:"plan"`
	Stages      []*StageStatus    `json:"stages"`
	Artifacts   []Artifact        `json:"artifacts"`
	Effects     []*EffectStatus   `json:"effects"`
	Sessions    []*SessionStatus  `json:"sessions"`
	Metrics     Metrics           `json:"metrics"`
	Ledger      snapshotPos       `json:"ledger"`
	Identity    runIdentity       `json:"identity"` // the create record's data
	Last        string            `json:"last,omitempty"`
	LastDone    string            `json:"last_done,omitempty"`

	// With stages' parts of the plan (Stage.Plan): the run's part, and
	// each stage's. Plan is what they make (plan.go).
	TopPlan []string            `json:"top_plan,omitempty"`
	Plans   map[string][]string `json:"plans,omitempty"`

	// Sum is the hex SHA-256 of the manifest encoded with Sum empty: a
	// manifest edited by hand, or damaged, is not a snapshot to resume
	// from (Open replays the ledger instead).
	Sum string `json:"sum"`
}

// encode renders m as manifest.json's bytes: byte for byte what
// encoding/json gives for the whole struct (no HTML escaping, indented by
// two spaces), but for the effects' requests and receipts, which are
// written compact (appendEffect); sum relies on it. The stages, artifacts
// and effects are written by appendStage, appendArtifact and appendEffect
// and spliced in. The stages and artifacts grow with the run: through
// encoding/json (reflection, then a second pass to indent), the manifest
// of 100,000 stages with an input and an output each (72 MB) took 0.6-1.3
// s, holding the ledger lock. hint is how long the last
// encoding was (0 if unknown): the buffer is made that large at once.
func (m *manifest) encode(hint int) ([]byte, error) {
	head := *m
	head.Stages, head.Artifacts, head.Effects = []*StageStatus{}, []Artifact{}, []*EffectStatus{}
	var hb bytes.Buffer
	enc := json.NewEncoder(&hb)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&head); err != nil {
		return nil, err
	}
	skel := hb.Bytes()
	const stages, artifacts, effects = "\n  \"stages\": [],\n", "\n  \"artifacts\": [],\n", "\n  \"effects\": [],\n"
	i := bytes.Index(skel, []byte(stages))
	j := i + len(stages) - 1    // the artifacts follow the stages
	k := j + len(artifacts) - 1 // and the effects the artifacts
	if i < 0 || !bytes.HasPrefix(skel[j:], []byte(artifacts)) || !bytes.HasPrefix(skel[k:], []byte(effects)) {
		return nil, errors.New("runstate: manifest encoding has its stages, artifacts and effects elsewhere")
	}
	// About what the lists take, and room for the sum (encodeManifest).
	out := make([]byte, 0, max(hint, len(skel)+512*len(m.Stages)+256*len(m.Artifacts))+128)
	out = append(out, skel[:i]...)
	out = append(out, "\n  \"stages\": ["...)
	var err error
	for k, st := range m.Stages {
		out = appendElem(out, k)
		if out, err = appendStage(out, st); err != nil {
			return nil, err
		}
	}
	out = endList(out, len(m.Stages))
	out = append(out, "\n  \"artifacts\": ["...)
	for k := range m.Artifacts {
		out = appendElem(out, k)
		out = appendArtifact(out, &m.Artifacts[k])
	}
	out = endList(out, len(m.Artifacts))
	if m.Effects == nil { // as encoding/json writes a nil slice
		out = append(out, "\n  \"effects\": null,"...)
	} else {
		out = append(out, "\n  \"effects\": ["...)
		for n, e := range m.Effects {
			out = appendElem(out, n)
			if out, err = appendEffect(out, e); err != nil {
				return nil, err
			}
		}
		out = endList(out, len(m.Effects))
	}
	return append(out, skel[k+len(effects)-1:]...), nil
}

// appendEffect appends e as an element of manifest.json's effects. Its
// request and receipt, JSON a receiving system returned, are written
// compact: indenting a value nested a few hundred levels deep (a legitimate
// receipt may be) writes each line below a level that many spaces further
// in, which made a manifest.json of 82 MB from a receipt of 400 KB.
func appendEffect(b []byte, e *EffectStatus) ([]byte, error) {
	if e == nil {
		return append(b, "null"...), nil
	}
	o := jsonObject{b: b, indent: "\n      "}
	o.str("key", e.Key)
	o.str("state", e.State)
	if e.Payload != "" {
		o.str("payload", e.Payload)
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"request", e.Request}, {"receipt", e.Receipt}} {
		if len(f.raw) == 0 {
			continue
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, f.raw); err != nil {
			return nil, fmt.Errorf("runstate: manifest: effect %s: %s: %w", e.Key, f.name, err)
		}
		o.key(f.name)
		o.b = append(o.b, buf.Bytes()...)
	}
	o.int("intents", int64(e.Intents))
	if e.Session != "" {
		o.str("session", e.Session)
	}
	if e.Error != "" {
		o.str("error", e.Error)
	}
	if e.By != "" {
		o.str("by", e.By)
	}
	o.int("seq", e.Seq)
	o.timeAlways("at", e.At) // not omitempty, as encoding/json writes it
	if e.Pending {
		o.key("pending")
		o.b = append(o.b, "true"...)
	}
	if o.err != nil {
		return nil, o.err
	}
	return o.end("\n    "), nil
}

// appendElem starts element k of a top-level list of manifest.json.
func appendElem(b []byte, k int) []byte {
	if k > 0 {
		b = append(b, ',')
	}
	return append(b, "\n    "...)
}

// endList closes a top-level list of n elements.
func endList(b []byte, n int) []byte {
	if n > 0 {
		b = append(b, "\n  "...)
	}
	return append(b, "],"...)
}

// jsonObject writes one JSON object's fields as encoding/json indents
// them, each line starting with indent. err is the first field that
// could not be written.
type jsonObject struct {
	b      []byte
	indent string
	n      int
	err    error
}

// key starts the field named k, a Go field's JSON name (nothing to escape).
func (o *jsonObject) key(k string) {
	o.next()
	o.b = append(o.b, '"')
	o.b = append(o.b, k...)
	o.b = append(o.b, "\": "...)
}

// entry writes a map entry: a key that may need escaping, and its value.
func (o *jsonObject) entry(k, v string) {
	o.next()
	o.b = appendJSONString(o.b, k)
	o.b = append(o.b, ": "...)
	o.b = appendJSONString(o.b, v)
}

func (o *jsonObject) next() {
	if o.n == 0 {
		o.b = append(o.b, '{')
	} else {
		o.b = append(o.b, ',')
	}
	o.n++
	o.b = append(o.b, o.indent...)
}

func (o *jsonObject) str(k, v string) {
	o.key(k)
	o.b = appendJSONString(o.b, v)
}

func (o *jsonObject) int(k string, v int64) {
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
}

// time writes t, unless it is zero (omitzero), as its MarshalJSON does:
// RFC 3339 with the nanoseconds, and an error for a year outside 0-9999.
func (o *jsonObject) time(k string, t time.Time) {
	if !t.IsZero() {
		o.timeAlways(k, t)
	}
}

// timeAlways is time for a field without omitempty: the zero time too.
func (o *jsonObject) timeAlways(k string, t time.Time) {
	o.key(k)
	b, err := t.AppendText(append(o.b, '"'))
	if err != nil && o.err == nil {
		o.err = fmt.Errorf("runstate: manifest: %s: %w", k, err)
	}
	o.b = append(b, '"')
}

// end closes the object; its closing brace is on a line of its own,
// starting with outer (the enclosing indent).
func (o *jsonObject) end(outer string) []byte {
	if o.n == 0 {
		return append(o.b, "{}"...)
	}
	o.b = append(o.b, outer...)
	return append(o.b, '}')
}

// appendStage appends st as an element of manifest.json's stages.
func appendStage(b []byte, st *StageStatus) ([]byte, error) {
	if st == nil {
		return append(b, "null"...), nil
	}
	const in, in2 = "\n      ", "\n        "
	o := jsonObject{b: b, indent: in}
	o.str("name", st.Name)
	o.str("state", st.State)
	o.int("attempts", int64(st.Attempt))
	if st.Failures != 0 {
		o.int("failures", int64(st.Failures))
	}
	if st.Session != "" {
		o.str("session", st.Session)
	}
	if len(st.Inputs) > 0 {
		o.key("inputs")
		m := jsonObject{b: o.b, indent: in2}
		for _, k := range slices.Sorted(maps.Keys(st.Inputs)) {
			m.entry(k, st.Inputs[k])
		}
		o.b = m.end(o.indent)
	}
	if len(st.Outputs) > 0 {
		o.key("outputs")
		o.b = append(o.b, '[')
		for k, out := range st.Outputs {
			if k > 0 {
				o.b = append(o.b, ',')
			}
			o.b = append(o.b, in2...)
			e := jsonObject{b: o.b, indent: in2 + "  "}
			e.str("path", out.Path)
			e.str("sha256", out.SHA256)
			e.int("size", out.Size)
			o.b = e.end(in2)
		}
		o.b = append(o.b, in...)
		o.b = append(o.b, ']')
	}
	if st.Reason != "" {
		o.str("reason", st.Reason)
	}
	if st.Error != "" {
		o.str("error", st.Error)
	}
	if st.Class != "" {
		o.str("class", st.Class)
	}
	if st.Review {
		o.key("review")
		o.b = append(o.b, "true"...)
	}
	if st.Dropped {
		o.key("dropped")
		o.b = append(o.b, "true"...)
	}
	if st.DoneSeq != 0 {
		o.int("done_seq", st.DoneSeq)
	}
	o.time("done_at", st.DoneAt)
	o.int("seq", st.Seq)
	o.time("at", st.At)
	o.time("began_at", st.BeganAt)
	if o.err != nil {
		return nil, o.err
	}
	return o.end("\n    "), nil
}

// appendArtifact appends a as an element of manifest.json's artifacts.
func appendArtifact(b []byte, a *Artifact) []byte {
	o := jsonObject{b: b, indent: "\n      "}
	o.str("path", a.Path)
	o.str("sha256", a.SHA256)
	o.int("size", a.Size)
	o.str("stage", a.Stage)
	o.int("seq", a.Seq)
	return o.end("\n    ")
}

// appendJSONString appends s as encoding/json writes a string with HTML
// escaping off: quotes, backslashes and control characters escaped,
// invalid UTF-8 as U+FFFD, U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// sum returns the checksum of m: the hash of its encoding with Sum empty.
// hint is about how long that encoding is.
func (m *manifest) sum(hint int) (string, error) {
	saved := m.Sum
	m.Sum = ""
	data, err := m.encode(hint)
	m.Sum = saved
	if err != nil {
		return "", err
	}
	return lineHash(data), nil
}

// artifacts lists the outputs of done stages in the order of names
// (stageNames).
func (s *state) artifacts(names []string) []Artifact {
	out := []Artifact{}
	for _, name := range names {
		st := s.stages[name]
		if st.State != StateComplete && !(st.State == StateAwaiting && st.Review) {
			continue
		}
		for _, o := range st.Outputs {
			out = append(out, Artifact{Path: o.Path, SHA256: o.SHA256, Size: o.Size, Stage: name, Seq: st.DoneSeq})
		}
	}
	return out
}

// encodeManifest renders the state as manifest.json.
func (s *state) encodeManifest(now time.Time) ([]byte, error) {
	m := s.snapshot(now)
	// Encode once, with Sum empty, and write the sum into its place: Sum
	// is the last field, so the encoding ends with `"sum": ""` and the
	// closing brace. (Encoding twice doubled a rewrite's cost, and a
	// rewrite is O(stages).)
	data, err := m.encode(s.manifestLen)
	if err != nil {
		return nil, err
	}
	tail := []byte("\"sum\": \"\"\n}\n")
	if !bytes.HasSuffix(data, tail) {
		return nil, fmt.Errorf("runstate: manifest encoding does not end with the sum field")
	}
	sum := lineHash(data)
	out := append(data[:len(data)-len(tail)], "\"sum\": \""...) // in place, where encode left room
	out = append(out, sum...)
	out = append(out, "\"\n}\n"...)
	s.manifestLen = len(out)
	return out, nil
}

// snapshot is the state as manifest.json holds it, with Sum empty.
func (s *state) snapshot(now time.Time) *manifest {
	names := s.stageNames()
	m := &manifest{
		Format:      FormatVersion,
		ID:          s.identity.ID,
		Request:     s.identity.Request,
		Revision:    s.revision,
		Environment: s.env,
		Created:     s.created,
		Seq:         s.pos.seq,
		Updated:     now.UTC(),
		Plan:        s.plan,
		Artifacts:   s.artifacts(names),
		Metrics:     s.metrics,
		Ledger:      snapshotPos{Offset: s.pos.offset - s.lastLen, End: s.pos.offset, Hash: s.pos.hash},
		Identity:    s.identity,
		Last:        s.last,
		LastDone:    s.lastDone,
		Stages:      make([]*StageStatus, 0, len(names)),
		Effects:     []*EffectStatus{},
		Sessions:    []*SessionStatus{},
	}
	if m.Plan == nil {
		m.Plan = []string{}
	}
	if len(s.sub) > 0 {
		m.TopPlan, m.Plans = s.top, s.sub
	}
	for _, name := range names {
		m.Stages = append(m.Stages, s.stages[name])
	}
	for _, k := range slices.Sorted(maps.Keys(s.effects)) {
		m.Effects = append(m.Effects, s.effects[k])
	}
	for _, k := range slices.Sorted(maps.Keys(s.sessions)) {
		m.Sessions = append(m.Sessions, s.sessions[k])
	}
	return m
}
