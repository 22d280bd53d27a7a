package runstate

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// Status is a read-only picture of a run as of ledger seq Seq: what exists,
// what is done, what blocks it. Run.Status and Inspect return it; it is a
// copy, safe to keep and to read from any goroutine.
type Status struct {
	Dir string `json:"dir"`
	// Address is the run as the commands in the Blockers' Actions name
	// it, unquoted: the run directory's absolute path, or the store's
	// Addresser.Address; "" for a store that no runstate command reads
	// (its Actions name Run methods instead).
	Address string `json:"address,omitempty"`
	ID      string `json:"id"`
	Request string `json:"request"` // the run's identity (Options.Request), from its create record
	// Revision and Environment are each the last one a session named
	// when it opened the run (Options.Revision, Options.Environment; the
	// creator's until another names one): on a run that sessions on
	// several machines share, the newest session's, not the creator's.
	// The ledger's open records keep each session's.
	Revision    string            `json:"revision,omitempty"`
	Environment map[string]string `json:"environment,omitempty"`
	Format      int               `json:"format"`
	Created     time.Time         `json:"created"`
	Seq         int64             `json:"seq"`
	Plan        []string          `json:"plan"`
	Stages      []StageStatus     `json:"stages"`
	Artifacts   []Artifact        `json:"artifacts"`
	Effects     []EffectStatus    `json:"effects"`
	Sessions    []SessionStatus   `json:"sessions"` // opened, not closed
	Blockers    []Blocker         `json:"blockers"`
	Next        string            `json:"next,omitempty"` // first planned stage not done
	Done        int               `json:"done"`           // planned stages done
	Remaining   int               `json:"remaining"`      // planned stages not done
	Metrics     Metrics           `json:"metrics"`
	// Torn is the size in bytes of a torn last line the reader ignored
	// (0 when there is none). The next writer cuts it.
	Torn int64 `json:"torn,omitempty"`
}

// Blocker is something that keeps a run from going on by itself.
type Blocker struct {
	Kind   string `json:"kind"` // awaiting, fatal, interrupted, in-doubt, unconfirmed
	Stage  string `json:"stage,omitempty"`
	Key    string `json:"key,omitempty"`
	Reason string `json:"reason"`
	// Action is what clears it: what the next run does by itself, and
	// what a person runs where one must, as the handoff says it: a
	// runstate command on the run's address (the run directory's absolute
	// path, or the store's Addresser.Address), with it and the names and
	// keys quoted for a shell (escape.Arg); for a store that no command
	// reads (an Addresser whose Address is "", as runstatetest's memory
	// store), the Run method to call instead.
	Action string `json:"action"`
}

// Stage returns the status of the named stage, and false if the run has
// never heard of it. It only reads s: safe for concurrent use with other
// reads.
func (s *Status) Stage(name string) (StageStatus, bool) {
	for _, st := range s.Stages {
		if st.Name == name {
			return st, true
		}
	}
	return StageStatus{}, false
}

// status builds a Status from the state.
func (s *state) status(dir string, at place) *Status {
	names := s.stageNames()
	out := &Status{
		Dir:         dir,
		Address:     at.addr,
		ID:          s.identity.ID,
		Request:     s.identity.Request,
		Revision:    s.revision,
		Environment: maps.Clone(s.env),
		Format:      s.identity.Format,
		Created:     s.created,
		Seq:         s.pos.seq,
		Plan:        slices.Clone(s.plan),
		Artifacts:   s.artifacts(names),
		Metrics:     s.metrics,
		Stages:      []StageStatus{},
		Effects:     []EffectStatus{},
		Sessions:    []SessionStatus{},
		Blockers:    s.blockers(at),
	}
	if out.Plan == nil {
		out.Plan = []string{}
	}
	for _, name := range names {
		out.Stages = append(out.Stages, *s.stages[name])
	}
	for _, k := range slices.Sorted(maps.Keys(s.effects)) {
		out.Effects = append(out.Effects, *s.effects[k])
	}
	for _, k := range slices.Sorted(maps.Keys(s.sessions)) {
		out.Sessions = append(out.Sessions, *s.sessions[k])
	}
	for _, name := range s.plan {
		if done(s.stages[name].State) {
			out.Done++
		} else {
			out.Remaining++
			if out.Next == "" {
				out.Next = name
			}
		}
	}
	return out
}

// blockers lists what needs a person or a look, stages first; their
// commands name the run at at.
func (s *state) blockers(at place) []Blocker {
	out := []Blocker{}
	for _, name := range s.stageNames() {
		st := s.stages[name]
		switch st.State {
		case StateAwaiting:
			reason := st.Reason
			if reason == "" {
				reason = st.Error
			}
			out = append(out, Blocker{Kind: "awaiting", Stage: name, Reason: reason,
				Action: at.approve(name)})
		case StateFatal:
			out = append(out, Blocker{Kind: "fatal", Stage: name, Reason: st.Error,
				Action: "fix the cause, then: " + at.invalidate(name)})
		case StateInterrupted:
			out = append(out, Blocker{Kind: "interrupted", Stage: name,
				Reason: fmt.Sprintf("attempt %d's session died before it ended", st.Attempt),
				Action: "run the pipeline again: the stage begins anew"})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(s.effects)) {
		e := s.effects[k]
		resolve := at.resolve(k, "-sent RECEIPT -by NAME (or -not-sent)")
		switch e.State {
		case EffectInDoubt:
			// Open cannot know whether the next caller passes a Check:
			// say what happens either way.
			out = append(out, Blocker{Kind: "in-doubt", Key: k, Reason: e.Error,
				Action: "run the pipeline again: its next Effect call for this key asks the receiving system (Check) and settles it; " +
					"only if it has no Check, or Check fails, must a person check the receiving system, then: " + resolve})
		case EffectUnconfirmed:
			action := "check the receiving system, then: " + resolve +
				"; a later Effect call for this key asks its Check again first, if it has one"
			if e.Pending {
				action = "run the pipeline again later: its next Effect call for this key asks the receiving system (Check) whether the accepted request landed; " +
					"without a Check, or if it fails, a person must check the receiving system, then: " + resolve
			}
			out = append(out, Blocker{Kind: "unconfirmed", Key: k, Reason: e.Error, Action: action})
		}
	}
	return out
}
