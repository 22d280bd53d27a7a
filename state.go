package runstate

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"sort"
	"time"
)

// runIdentity is the data of the create record: what the run serves.
type runIdentity struct {
	ID          string            `json:"id"`
	Request     string            `json:"request"`
	Revision    string            `json:"revision,omitempty"`
	Environment map[string]string `json:"environment,omitempty"`
	Format      int               `json:"format"`
}

// openData is the data of an open record.
type openData struct {
	PID         int               `json:"pid"`
	Host        string            `json:"host,omitempty"`
	Revision    string            `json:"revision,omitempty"`
	Environment map[string]string `json:"environment,omitempty"`
}

// closeData is the data of a close record: what the session counted that
// left no record of its own.
type closeData struct {
	Skipped      int `json:"skipped,omitempty"`      // Begin found the stage done
	Deduplicated int `json:"deduplicated,omitempty"` // Effect returned a stored receipt
}

// sessionGone is the data of an interrupted record with no stage: a
// session that died between stages.
type sessionGone struct {
	Session string `json:"session"`
}

// Stage states, as Status and manifest.json report them.
const (
	StatePending     = "pending"     // planned or invalidated; may begin
	StateRunning     = "running"     // begun, no end yet
	StateComplete    = "complete"    // done; evidence recorded
	StateSkipped     = "skipped"     // skipped with a reason; counts as done
	StateFailed      = "failed"      // last attempt failed, retryable
	StateAwaiting    = "awaiting"    // needs a person: Approve
	StateFatal       = "fatal"       // failed for good: Invalidate to redo
	StateInterrupted = "interrupted" // its session died mid-attempt; may begin
)

// StageStatus is what the ledger says of one stage, as Status reports it.
// It is also the stage's form in manifest.json, so its JSON is stable.
type StageStatus struct {
	Name     string            `json:"name"`
	State    string            `json:"state"`
	Attempt  int               `json:"attempts"`           // begins so far
	Failures int               `json:"failures,omitempty"` // retryable failures since the last success or approval
	Session  string            `json:"session,omitempty"`  // session of the last begin
	Inputs   map[string]string `json:"inputs,omitempty"`   // as of the last begin or complete
	Outputs  []Output          `json:"outputs,omitempty"`  // of the last complete
	Reason   string            `json:"reason,omitempty"`   // skip, await, invalidate reason
	Error    string            `json:"error,omitempty"`    // last failure
	Class    string            `json:"class,omitempty"`    // last failure's class
	Review   bool              `json:"review,omitempty"`   // awaiting a review (Stage.Await), not a failure
	Dropped  bool              `json:"dropped,omitempty"`  // planned once, no longer (see Stage.Plan)
	DoneSeq  int64             `json:"done_seq,omitempty"` // seq of the complete or skip
	DoneAt   time.Time         `json:"done_at,omitzero"`
	Seq      int64             `json:"seq"`         // seq of the last record about it
	At       time.Time         `json:"at,omitzero"` // time of that record
	BeganAt  time.Time         `json:"began_at,omitzero"`
}

// EffectStatus is what the ledger says of one side effect, as Status
// reports it and manifest.json stores it.
type EffectStatus struct {
	Key     string          `json:"key"`
	State   string          `json:"state"`             // intent, confirmed, in-doubt, unconfirmed, not-sent
	Payload string          `json:"payload,omitempty"` // hash of the request recorded with the first intent
	Request json.RawMessage `json:"request,omitempty"`
	Receipt json.RawMessage `json:"receipt,omitempty"`
	Intents int             `json:"intents"` // times Do was (about to be) called
	Session string          `json:"session,omitempty"`
	Error   string          `json:"error,omitempty"`
	By      string          `json:"by,omitempty"`
	Seq     int64           `json:"seq"`
	At      time.Time       `json:"at"`
	Pending bool            `json:"pending,omitempty"` // unconfirmed because Do returned ErrPending
}

// Effect states.
const (
	EffectIntent      = "intent"      // recorded before Do; outcome not known yet
	EffectConfirmed   = "confirmed"   // the receiving system confirmed it
	EffectUnconfirmed = "unconfirmed" // outcome unknown: a person must Resolve it
	EffectNotSent     = "not-sent"    // a person resolved it as never sent
	// EffectInDoubt: the session that recorded the intent died before a
	// confirmation. The next Effect call for the key asks its Check and
	// settles it; only without a Check, or when Check fails, does it
	// become unconfirmed and need a person.
	EffectInDoubt = "in-doubt"
)

// SessionStatus is a session that opened and has not closed (it may have
// died: a killed process writes no close record).
type SessionStatus struct {
	ID      string    `json:"id"`
	PID     int       `json:"pid,omitempty"`
	Host    string    `json:"host,omitempty"`
	At      time.Time `json:"at"`
	Working bool      `json:"working,omitempty"` // wrote a record other than open
}

// Metrics are derived from the ledger. They say whether resumption works:
// duplicated work and duplicate effects should stay 0.
type Metrics struct {
	Sessions        int `json:"sessions"`         // open records
	ResumedSessions int `json:"resumed_sessions"` // sessions that opened an existing run
	Interrupted     int `json:"interrupted"`      // attempts whose session died mid-stage
	// SkippedOnResume counts Begin calls that found a stage already done in
	// a resumed session (work not redone), as reported in close records; a
	// killed session's count is lost with it.
	SkippedOnResume int `json:"skipped_on_resume"`
	// DuplicatedWork counts begins of a stage that was complete with no
	// invalidate between: work redone although its evidence held. Should be 0.
	DuplicatedWork int `json:"duplicated_work"`
	// StaleRejections counts stages invalidated because their evidence
	// changed, their outputs were altered or missing, or it expired.
	StaleRejections int `json:"stale_rejections"`
	Invalidations   int `json:"invalidations"` // by an operator
	Failures        int `json:"failures"`
	// EffectsDeduplicated counts Effect calls that did not send: a stored
	// receipt returned (from close records) or a Check that found the
	// effect had landed.
	EffectsDeduplicated int `json:"effects_deduplicated"`
	// EffectsDuplicated counts intents for a key already confirmed: a side
	// effect sent twice. Should be 0.
	EffectsDuplicated  int `json:"effects_duplicated"`
	EffectsUnconfirmed int `json:"effects_unconfirmed"` // now: a person must resolve them
	// EffectsInDoubt counts, now, effects whose session died between the
	// intent and a confirmation: the next Effect call asks Check.
	EffectsInDoubt int `json:"effects_in_doubt"`
	// TimeToFirstRecord is, over resumed sessions, the longest time from a
	// session's open to its first record of work (time to useful handoff).
	TimeToFirstRecord time.Duration `json:"time_to_first_record_ns"`
}

// state is the projection of the ledger that every decision is made on.
// It grows with stages, artifacts, effects and live sessions, never with
// ledger length. It is not safe for concurrent use: Run guards it.
type state struct {
	identity runIdentity
	created  time.Time
	revision string            // as of the last open
	env      map[string]string // as of the last open
	pos      chain
	lastLen  int64 // length of the last record's line, with '\n'
	plan     []string
	stages   map[string]*StageStatus
	effects  map[string]*EffectStatus
	sessions map[string]*SessionStatus
	last     string // stage of the last begin (for Flow)
	lastDone string // stage of the last complete or skip
	metrics  Metrics

	// Kept up to date by apply (and derive), so that the handoff, written
	// after every append, need not look at every stage.
	blocking int       // stages and effects that blockers lists
	stageAt  time.Time // the latest At of any stage
	planned  planIndex // which planned stages are not done

	manifestLen int // length of the last manifest.json encoded or read: the next one's size hint

	// The plan's parts (plan.go): plan is top with each stage's part
	// placed after it. dropped: the stages planned once and no longer,
	// by name.
	top     []string
	sub     map[string][]string
	dropped []string

	u *undo // on: apply saves what it changes (state_undo.go)
}

func newState() *state {
	return &state{
		stages:   map[string]*StageStatus{},
		effects:  map[string]*EffectStatus{},
		sessions: map[string]*SessionStatus{},
	}
}

func (s *state) stage(name string) *StageStatus {
	st := s.stages[name]
	if st == nil {
		st = &StageStatus{Name: name, State: StatePending}
		s.stages[name] = st
	}
	return st
}

// replay applies the record of one checked ledger line (without its '\n')
// to the state: the apply function every reader and writer passes to
// replay, Tail and Read.
func (s *state) replay(rec *Record, line []byte) error {
	s.apply(rec)
	s.lastLen = int64(len(line) + 1)
	return nil
}

// position is the state's place in the ledger, as a Store names it.
func (s *state) position() Position { return s.pos.position(s.lastLen) }

// apply advances the state by one record. It never fails: the reader has
// already checked the chain, and a record this version does not know is
// skipped (forward compatible).
func (s *state) apply(r *Record) {
	if s.u != nil {
		s.u.save(s, r)
	}
	before := s.blocks(r)
	defer func() { s.blocking += s.blocks(r) - before }()
	if r.Session != "" && r.Ev != evOpen && r.Ev != evClose {
		if ss := s.sessions[r.Session]; ss != nil && !ss.Working {
			ss.Working = true
			if s.metrics.Sessions > 1 {
				if d := r.At.Sub(ss.At); d > s.metrics.TimeToFirstRecord {
					s.metrics.TimeToFirstRecord = d
				}
			}
		}
	}
	switch r.Ev {
	case evCreate:
		_ = json.Unmarshal(r.Data, &s.identity) // checked by chain.check
		s.created = r.At
		s.revision = s.identity.Revision
		s.env = s.identity.Environment
	case evOpen:
		var d openData
		_ = json.Unmarshal(r.Data, &d)
		s.metrics.Sessions++
		if s.metrics.Sessions > 1 {
			s.metrics.ResumedSessions++
		}
		s.sessions[r.Session] = &SessionStatus{ID: r.Session, PID: d.PID, Host: d.Host, At: r.At}
		// A session that names no revision or environment (a tool, an
		// operator's command) leaves the run's as they were.
		if d.Revision != "" {
			s.revision = d.Revision
		}
		if d.Environment != nil {
			s.env = d.Environment
		}
	case evClose:
		var d closeData
		_ = json.Unmarshal(r.Data, &d)
		s.metrics.SkippedOnResume += d.Skipped
		s.metrics.EffectsDeduplicated += d.Deduplicated
		delete(s.sessions, r.Session)
	case evPlan:
		var names []string
		_ = json.Unmarshal(r.Data, &names)
		s.replan(r.Stage, names)
	case evBegin:
		st := s.stage(r.Stage)
		if st.State == StateComplete {
			s.metrics.DuplicatedWork++
		}
		st.State = StateRunning
		st.Attempt = r.Attempt
		st.Session = r.Session
		st.Inputs = r.Inputs
		st.BeganAt = r.At
		st.Review = false
		s.last = r.Stage
	case evComplete:
		st := s.stage(r.Stage)
		st.State = StateComplete
		st.Inputs = r.Inputs
		st.Outputs = r.Outputs
		st.Failures = 0
		st.Error, st.Class, st.Reason = "", "", ""
		st.DoneSeq, st.DoneAt = r.Seq, r.At
		s.lastDone = r.Stage
	case evSkip:
		st := s.stage(r.Stage)
		st.State = StateSkipped
		st.Reason = r.Reason
		st.Outputs = nil
		st.DoneSeq, st.DoneAt = r.Seq, r.At
		s.lastDone = r.Stage
	case evFail:
		st := s.stage(r.Stage)
		s.metrics.Failures++
		st.Error, st.Class = r.Error, r.Class
		switch r.Class {
		case ClassFatal:
			st.State = StateFatal
		case ClassPerson:
			st.State = StateAwaiting
		default:
			st.State = StateFailed
			st.Reason = r.Reason
			if r.Reason != diskFullReason && r.Reason != canceledReason {
				st.Failures++ // a full disk, a cancellation: not the work's fault
			}
		}
	case evAwait:
		st := s.stage(r.Stage)
		st.State = StateAwaiting
		st.Reason = r.Reason
		st.Review = r.Class == "" && st.Error == ""
		if st.Review {
			st.Outputs = r.Outputs
			st.Inputs = r.Inputs
		}
	case evApprove:
		st := s.stage(r.Stage)
		if st.Review {
			st.State = StateComplete
			st.DoneSeq, st.DoneAt = r.Seq, r.At
			s.lastDone = r.Stage
		} else {
			st.State = StatePending
		}
		st.Failures = 0
		st.Review = false
		st.Reason = "approved by " + r.By
		st.Error, st.Class = "", ""
	case evInterrupted:
		if r.Stage == "" {
			var d sessionGone
			_ = json.Unmarshal(r.Data, &d)
			delete(s.sessions, d.Session)
			break
		}
		st := s.stage(r.Stage)
		if st.State == StateRunning {
			st.State = StateInterrupted
			st.Reason = fmt.Sprintf("attempt %d was interrupted: %s", r.Attempt, r.Reason)
		}
		s.metrics.Interrupted++
		delete(s.sessions, st.Session)
	case evInvalidate:
		st := s.stage(r.Stage)
		if r.By != "" {
			s.metrics.Invalidations++
		} else {
			s.metrics.StaleRejections++
		}
		st.State = StatePending
		st.Reason = r.Reason
		st.Failures = 0
		st.Review = false
		st.Error, st.Class = "", ""
		st.DoneSeq, st.DoneAt = 0, time.Time{}
	case evIntent:
		e := s.effect(r.Key)
		if e.State == EffectConfirmed {
			s.metrics.EffectsDuplicated++
		}
		s.settle(e)
		e.State = EffectIntent
		e.Pending = false
		e.Intents++
		e.Session = r.Session
		if e.Payload == "" && len(r.Data) > 0 {
			e.Request = r.Data
			e.Payload = r.Reason
		}
	case evConfirm:
		e := s.effect(r.Key)
		s.settle(e)
		if r.Note == checkedNote {
			s.metrics.EffectsDeduplicated++
		}
		e.State = EffectConfirmed
		e.Pending = false
		e.Receipt = r.Data
		e.By = r.By
		e.Error = ""
	case evUnconfirmed:
		e := s.effect(r.Key)
		s.settle(e)
		if r.Reason == inDoubtReason {
			e.State = EffectInDoubt
			s.metrics.EffectsInDoubt++
		} else {
			e.State = EffectUnconfirmed
			s.metrics.EffectsUnconfirmed++
		}
		e.Error = r.Error
		e.Pending = r.Reason == pendingReason
	case evResolve:
		e := s.effect(r.Key)
		s.settle(e)
		e.State = EffectNotSent
		e.Pending = false
		e.By = r.By
		e.Error = ""
	}
	if st := s.stages[r.Stage]; st != nil && r.Stage != "" {
		s.planned.mark(st)
		st.Seq, st.At = r.Seq, r.At
		if r.At.After(s.stageAt) {
			s.stageAt = r.At
		}
	}
	if e := s.effects[r.Key]; e != nil && r.Key != "" {
		e.Seq, e.At = r.Seq, r.At
	}
}

// blocks counts what blockers would list of the stage and the effect that
// r is about: apply touches no other.
func (s *state) blocks(r *Record) int {
	n := 0
	if st := s.stages[r.Stage]; st != nil && blocked(st.State) {
		n++
	}
	if e := s.effects[r.Key]; e != nil && unsettled(e.State) {
		n++
	}
	return n
}

// blocked reports whether blockers lists a stage in this state.
func blocked(state string) bool {
	return state == StateAwaiting || state == StateFatal || state == StateInterrupted
}

// derive sets what apply keeps up to date, for a state that was not built
// by apply (decodeManifest).
func (s *state) derive() {
	for _, n := range s.plan {
		s.stage(n)
	}
	s.planned.build(s)
	s.listDropped()
	s.blocking, s.stageAt = 0, time.Time{}
	for _, st := range s.stages {
		if blocked(st.State) {
			s.blocking++
		}
		if st.At.After(s.stageAt) {
			s.stageAt = st.At
		}
	}
	for _, e := range s.effects {
		if unsettled(e.State) {
			s.blocking++
		}
	}
}

// unsettled reports whether blockers lists an effect in this state.
func unsettled(state string) bool {
	return state == EffectUnconfirmed || state == EffectInDoubt
}

// settle takes e out of the count of unconfirmed or in-doubt effects, as a
// record moves it to another state.
func (s *state) settle(e *EffectStatus) {
	switch e.State {
	case EffectUnconfirmed:
		s.metrics.EffectsUnconfirmed--
	case EffectInDoubt:
		s.metrics.EffectsInDoubt--
	}
}

// checkedNote marks a confirm written because Check found the effect.
const checkedNote = "confirmed by Check"

func (s *state) effect(key string) *EffectStatus {
	e := s.effects[key]
	if e == nil {
		e = &EffectStatus{Key: key}
		s.effects[key] = e
	}
	return e
}

// stageNames returns the planned stages in plan order, then every other
// stage the ledger knows, sorted.
func (s *state) stageNames() []string {
	names := append([]string(nil), s.plan...)
	inPlan := make(map[string]bool, len(s.plan))
	for _, n := range s.plan {
		inPlan[n] = true
	}
	var extra []string
	for n := range s.stages {
		if !inPlan[n] {
			extra = append(extra, n)
		}
	}
	sort.Strings(extra)
	return append(names, extra...)
}

// done reports whether a stage's state counts as done.
func done(state string) bool { return state == StateComplete || state == StateSkipped }

// planIndex is one bit per position of the plan: set while the stage
// there is not done. The handoff, rendered after every append, reads the
// plan through it: counting and finding the next stages is a scan of
// len(plan)/64 words, where a look-up of every planned stage made a
// checkpoint of a 100,000-stage plan ten times slower than one of a
// small plan. apply keeps it up to date.
type planIndex struct {
	at   map[string]int // plan position of each planned stage
	open []uint64       // bit i: plan[i] is not done
	n    int            // len(plan)
	// dup: the plan names a stage twice, or names "" (a ledger edited by
	// hand; Plan refuses both). Not indexed: the handoff looks up every
	// planned stage.
	dup bool
}

// build indexes s.plan afresh (a plan record; a state from a manifest).
func (p *planIndex) build(s *state) {
	*p = planIndex{at: make(map[string]int, len(s.plan)), open: make([]uint64, (len(s.plan)+63)/64), n: len(s.plan)}
	for i, name := range s.plan {
		if _, seen := p.at[name]; seen || name == "" {
			p.dup = true
		}
		p.at[name] = i
		if st := s.stages[name]; st == nil || !done(st.State) {
			p.open[i/64] |= 1 << (i % 64)
		}
	}
}

// mark records whether st, if planned, is done now.
func (p *planIndex) mark(st *StageStatus) {
	i, ok := p.at[st.Name]
	if !ok || p.dup {
		return
	}
	if done(st.State) {
		p.open[i/64] &^= 1 << (i % 64)
	} else {
		p.open[i/64] |= 1 << (i % 64)
	}
}

// each calls fn with the plan positions whose bit is want (true: not
// done), in plan order, until fn returns false.
func (p *planIndex) each(want bool, fn func(i int) bool) {
	for w, word := range p.open {
		if !want {
			word = ^word
		}
		for word != 0 {
			i := w*64 + bits.TrailingZeros64(word)
			if i >= p.n || !fn(i) {
				return
			}
			word &= word - 1
		}
	}
}

// remaining counts the planned stages that are not done.
func (p *planIndex) remaining() int {
	n := 0
	for _, word := range p.open {
		n += bits.OnesCount64(word)
	}
	return n
}
