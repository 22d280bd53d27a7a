package runstate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"
)

// manifestFile is the snapshot of the state, relative to the run directory.
const manifestFile = "manifest.json"

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
	// Sum is the hex SHA-256 of the manifest encoded with Sum empty: a
	// manifest edited by hand, or damaged, is not a snapshot to resume
	// from (Open replays the ledger instead).
	Sum string `json:"sum"`
}

// encode renders m as manifest.json's bytes.
func (m *manifest) encode() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sum returns the checksum of m: the hash of its encoding with Sum empty.
func (m *manifest) sum() (string, error) {
	saved := m.Sum
	m.Sum = ""
	data, err := m.encode()
	m.Sum = saved
	if err != nil {
		return "", err
	}
	return lineHash(data), nil
}

// artifacts lists the outputs of done stages in stage order.
func (s *state) artifacts() []Artifact {
	out := []Artifact{}
	for _, name := range s.stageNames() {
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
	m := manifest{
		Format:      FormatVersion,
		ID:          s.identity.ID,
		Request:     s.identity.Request,
		Revision:    s.revision,
		Environment: s.env,
		Created:     s.created,
		Seq:         s.pos.seq,
		Updated:     now.UTC(),
		Plan:        s.plan,
		Artifacts:   s.artifacts(),
		Metrics:     s.metrics,
		Ledger:      snapshotPos{Offset: s.pos.offset - s.lastLen, End: s.pos.offset, Hash: s.pos.hash},
		Identity:    s.identity,
		Last:        s.last,
		LastDone:    s.lastDone,
		Stages:      []*StageStatus{},
		Effects:     []*EffectStatus{},
		Sessions:    []*SessionStatus{},
	}
	if m.Plan == nil {
		m.Plan = []string{}
	}
	for _, name := range s.stageNames() {
		m.Stages = append(m.Stages, s.stages[name])
	}
	for _, k := range slices.Sorted(maps.Keys(s.effects)) {
		m.Effects = append(m.Effects, s.effects[k])
	}
	for _, k := range slices.Sorted(maps.Keys(s.sessions)) {
		m.Sessions = append(m.Sessions, s.sessions[k])
	}
	// Encode once, with Sum empty, and write the sum into its place: Sum
	// is the last field, so the encoding ends with `"sum": ""` and the
	// closing brace. (Encoding twice doubled a rewrite's cost, and a
	// rewrite is O(stages).)
	data, err := m.encode()
	if err != nil {
		return nil, err
	}
	tail := []byte("\"sum\": \"\"\n}\n")
	if !bytes.HasSuffix(data, tail) {
		return nil, fmt.Errorf("runstate: manifest encoding does not end with the sum field")
	}
	out := make([]byte, 0, len(data)+64)
	out = append(out, data[:len(data)-len(tail)]...)
	out = append(out, "\"sum\": \""...)
	out = append(out, lineHash(data)...)
	out = append(out, "\"\n}\n"...)
	return out, nil
}

// decodeManifest turns manifest.json back into a state. It checks the
// manifest's own shape only; the caller checks it against the ledger.
func decodeManifest(data []byte) (*state, snapshotPos, error) {
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, snapshotPos{}, err
	}
	if sum, err := m.sum(); err != nil || sum != m.Sum {
		return nil, snapshotPos{}, fmt.Errorf("checksum does not match its content (edited by hand, or damaged?)")
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
	s.plan = m.Plan
	for _, st := range m.Stages {
		if st == nil || st.Name == "" {
			return nil, snapshotPos{}, fmt.Errorf("stage without a name")
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
