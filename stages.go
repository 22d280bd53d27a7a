package runstate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Input is a piece of evidence a stage starts from. Begin fingerprints each
// input and records the fingerprints; a completed stage is redone when one
// changed. Build inputs with File, Value, After and ValidFor. An Input is
// never changed once built: copy it, keep it and pass it to Begins in
// several goroutines at once.
type Input struct {
	kind     int
	name     string // the name reasons quote
	fp       string // Value: its fingerprint
	err      error  // Value: the marshalling error, reported by Begin
	validFor time.Duration
}

const (
	inputFile = iota + 1
	inputValue
	inputAfter
	inputValidFor
)

// File is the content of the file at path, relative to Options.SourceDir
// (by default the working directory at Open) unless it is absolute. Its
// name in the ledger, which reasons quote, is path relative to SourceDir,
// cleaned and with forward slashes ("parser/parser.go"); a path outside
// SourceDir is recorded as an absolute path. The file is hashed at Begin
// and again at Complete (a change in between makes Complete return
// ErrStale). A missing file is an error at Begin, never an empty
// fingerprint. A stage completed before SourceDir existed recorded its
// File inputs by the path as given; Begin matches those to the same path
// given again, so they keep their evidence. A file that is not a regular
// file (a FIFO, a device such as /dev/zero, a directory) is refused at
// Begin (ErrInvalid): it could block or never end. File only builds the
// Input (nothing is read until Begin): safe for concurrent use. An empty
// path is refused at Begin (ErrInvalid): it would name SourceDir itself.
func File(path string) Input {
	if path == "" {
		return Input{kind: inputFile, err: fmt.Errorf("%w: File(\"\"): an empty path names no file (it would be SourceDir itself): give the file's path", ErrInvalid)}
	}
	return Input{kind: inputFile, name: path}
}

// Value is the JSON encoding of v, named name: a parameter, a prompt, a
// model name. v must marshal with encoding/json (an error shows at
// Begin or Do); it is encoded at once, so later changes to v do not count.
// A name that begins with "after:" is refused at Begin (ErrInvalid): After
// records its inputs under such names. Safe for concurrent use (with v not
// being changed meanwhile).
func Value(name string, v any) Input {
	data, err := json.Marshal(v)
	if err != nil {
		return Input{kind: inputValue, name: name, err: fmt.Errorf("%w: Value(%q): %v", ErrInvalid, name, err)}
	}
	return Input{kind: inputValue, name: name, fp: fingerprint(data)}
}

// After is the outputs of stage: the stage must be done, and when it is
// redone with different outputs, this stage is redone too (invalidation
// cascades). Its name in the ledger is "after:" + stage. A stage After
// itself is refused at Begin (ErrInvalid): it could never be done first.
// After only builds the Input: safe for concurrent use.
func After(stage string) Input { return Input{kind: inputAfter, name: "after:" + stage} }

// ValidFor makes the stage's evidence expire: a stage completed longer than
// d ago is redone, with the reason "evidence expired". So is one whose
// completion time is after the clock's now (the clock was ahead then, or
// was set back since: a VM snapshot, an NTP step): its age is unknown.
// A d of zero or less sets no expiry, as if ValidFor were left out (a
// configured time-to-live whose zero means "never" may be passed on as
// is). ValidFor only builds the Input: safe for concurrent use.
func ValidFor(d time.Duration) Input { return Input{kind: inputValidFor, validFor: d} }

// expired says why evidence of a stage done at done is expired at now
// under ValidFor(d), or "". A done time after now (the clock was ahead
// then, or is behind now: a VM snapshot restored, an NTP step) proves no
// age: such evidence is expired, or it would stay valid for the gap.
func expired(done, now time.Time, d time.Duration) string {
	switch age := now.Sub(done); {
	case age < 0:
		return fmt.Sprintf("evidence expired: complete since %s, %s after this clock's now (was the clock ahead, or set back?); valid for %s", done.Format(time.RFC3339), (-age).Round(time.Second), d)
	case age > d:
		return fmt.Sprintf("evidence expired (valid for %s, complete since %s)", d, done.Format(time.RFC3339))
	}
	return ""
}

func fingerprint(data []byte) string {
	h := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(h[:])
}

// checkName refuses stage names a person could not read back.
func checkName(name string) error { return CheckName("stage name", name) }

// CheckName is the rule of stage names, for other names a person reads
// back and types (a store's run names): valid UTF-8 of at most 256 bytes,
// no control character (a NUL, a newline that would split a line of the
// handoff, a listing or an error), no space at either end. The error
// wraps ErrInvalid and names what, the kind of name ("stage name", "run
// name"), quoting the name. It reads and writes nothing; safe for
// concurrent use.
func CheckName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty %s", ErrInvalid, what)
	}
	if len(name) > 256 || !utf8.ValidString(name) {
		return fmt.Errorf("%w: %s %.40q... must be valid UTF-8 of at most 256 bytes", ErrInvalid, what, name)
	}
	for _, c := range name {
		if unicode.IsControl(c) {
			return fmt.Errorf("%w: %s %q has a control character", ErrInvalid, what, name)
		}
	}
	if strings.TrimSpace(name) != name {
		return fmt.Errorf("%w: %s %q starts or ends with a space", ErrInvalid, what, name)
	}
	return nil
}

// Plan records the work that exists, in order: the stages next-steps.txt
// and Status count as done and remaining. Planning the same stages again
// writes nothing; a different list is recorded (durably) and replaces it,
// and the stages it no longer names are dropped (see Stage.Plan). The
// stages that a stage discovered (Stage.Plan) stay in the plan, after
// that stage: Plan names only the run's own. Stages may be begun without
// being planned. A plan whose JSON exceeds 4 MiB is ErrInvalid, and
// nothing is recorded. Safe for concurrent use.
func (r *Run) Plan(ctx context.Context, stages ...string) error {
	if err := checkPlan(stages); err != nil {
		return err
	}
	data, _ := json.Marshal(stages)
	if err := checkSize(fmt.Sprintf("a plan of %d stages", len(stages)), len(data)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := r.commitCtx(ctx, true, func(s *state) ([]*Record, error) {
		if slices.Equal(s.top, stages) {
			return nil, nil
		}
		return []*Record{{Ev: evPlan, Data: data}}, nil
	})
	return err
}

// evidence is the fingerprints Begin computed outside the lock.
type evidence struct {
	list     []Input
	inputs   map[string]string // File and Value fingerprints
	given    map[string]string // File inputs recorded under another name than given: name -> as given
	after    []string          // stages named by After
	validFor time.Duration
}

func (r *Run) gather(inputs []Input) (*evidence, error) {
	if err := checkInputSet(inputs); err != nil {
		return nil, err
	}
	ev := &evidence{list: inputs, inputs: map[string]string{}}
	for _, in := range inputs {
		if in.err != nil {
			return nil, in.err
		}
		if in.kind == inputValidFor {
			ev.validFor = in.validFor
			continue
		}
		if strings.IndexByte(in.name, 0) >= 0 {
			return nil, fmt.Errorf("%w: input name %q has a NUL byte", ErrInvalid, in.name)
		}
		if !utf8.ValidString(in.name) {
			// Recorded altered, it would never match again after a resume.
			return nil, fmt.Errorf("%w: input name %q is not valid UTF-8", ErrInvalid, in.name)
		}
		if _, dup := ev.inputs[in.name]; dup || in.kind == inputAfter && slices.Contains(ev.after, strings.TrimPrefix(in.name, "after:")) {
			return nil, fmt.Errorf("%w: input %q given twice", ErrInvalid, in.name)
		}
		switch in.kind {
		case inputFile:
			name, path := r.sourcePath(in.name)
			if _, dup := ev.inputs[name]; dup {
				return nil, fmt.Errorf("%w: input %q given twice (as %q)", ErrInvalid, name, in.name)
			}
			fp, err := hashFile(path)
			if isNotExist(err) {
				return nil, fmt.Errorf("runstate: input %s: %w (an input must exist when the stage begins: create it first, or check the path; File paths are relative to Options.SourceDir, by default the working directory at Open)", in.name, err)
			}
			if nr := (*notRegular)(nil); errors.As(err, &nr) {
				return nil, fmt.Errorf("runstate: input %s is %w: an input is hashed whole at Begin and again at Complete; pass what it holds with Value, or copy it to a file first", in.name, err)
			}
			if err != nil {
				return nil, fmt.Errorf("runstate: input %s: %w", in.name, err)
			}
			ev.inputs[name] = fp
			if name != in.name {
				if ev.given == nil {
					ev.given = map[string]string{}
				}
				ev.given[name] = in.name
			}
		case inputValue:
			if strings.HasPrefix(in.name, "after:") {
				// After's fingerprints are recorded under these names: one
				// would silently replace the other.
				return nil, fmt.Errorf("%w: Value(%q): the prefix \"after:\" is reserved for After's inputs; name the value otherwise", ErrInvalid, in.name)
			}
			ev.inputs[in.name] = in.fp
		case inputAfter:
			st := strings.TrimPrefix(in.name, "after:")
			if err := checkName(st); err != nil {
				return nil, err
			}
			ev.after = append(ev.after, st)
		}
	}
	return ev, nil
}

// afterFingerprint is the fingerprint of a done stage's outputs: it changes
// when the stage is redone with other results, and only then. A stage
// redone (its inputs changed, or an operator invalidated it) that produces
// the same outputs does not redo the stages after it (After's evidence is
// that stage's output hashes; Bazel calls this early cutoff).
func afterFingerprint(st *StageStatus) string {
	var b strings.Builder
	for _, o := range st.Outputs {
		fmt.Fprintf(&b, "out %s %s %d\n", o.Path, o.SHA256, o.Size)
	}
	fmt.Fprintf(&b, "state %s\n", st.State)
	return fingerprint([]byte(b.String()))
}

// fingerprints completes ev with the After fingerprints from the state.
func (ev *evidence) fingerprints(s *state, stage string) (map[string]string, error) {
	fps := maps.Clone(ev.inputs)
	for _, dep := range ev.after {
		d := s.stages[dep]
		if d == nil || !done(d.State) {
			state := "unknown"
			if d != nil {
				state = d.State
			}
			return nil, fmt.Errorf("%w: %s needs %s, which is %s", ErrNotReady, stage, dep, state)
		}
		fps["after:"+dep] = afterFingerprint(d)
	}
	return fps, nil
}

// staleReason compares the recorded evidence of a done stage with the
// current one and says what changed, or "" when it all holds.
func staleReason(recorded, current map[string]string) string {
	if len(recorded) == 0 && len(current) == 0 {
		return "" // the common case, without sorting two empty key sets
	}
	for _, k := range slices.Sorted(maps.Keys(current)) {
		old, ok := recorded[k]
		switch {
		case !ok:
			return fmt.Sprintf("input %s added", k)
		case old != current[k]:
			if dep, ok := strings.CutPrefix(k, "after:"); ok {
				return fmt.Sprintf("input %s changed (stage %s was redone with other results)", k, dep)
			}
			return fmt.Sprintf("input %s changed", k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(recorded)) {
		if _, ok := current[k]; !ok {
			return fmt.Sprintf("input %s removed", k)
		}
	}
	return ""
}

// errRecheck makes Begin look at the outputs again: the stage changed
// between the look outside the lock and the decision under it.
var errRecheck = errors.New("runstate: stage changed; check again")

// errFetchFirst makes Begin fetch the After stages' outputs the decision
// under the lock found (Begin.want) before it records the begin: they
// were not the ones in place in the directory.
var errFetchFirst = errors.New("runstate: After outputs to fetch before the begin")

// mayBegin reports whether Begin, seeing st outside the lock, expects to
// record a begin (and so fetches the After stages' outputs first): not
// for a stage done, running or waiting for a person, whose Begin mostly
// records nothing.
func mayBegin(st *StageStatus) bool {
	return st == nil || st.State == StatePending || st.State == StateFailed || st.State == StateInterrupted
}

// sameOutputs reports whether a and b name the same outputs with the
// same bytes, in the same order.
func sameOutputs(a, b []Output) bool {
	return slices.EqualFunc(a, b, func(x, y Output) bool { return x.Path == y.Path && x.SHA256 == y.SHA256 && x.Size == y.Size })
}

// Begin starts an attempt of the named stage, with the evidence it starts
// from. It returns an error wrapping ErrDone, and no Stage, when the stage
// is complete (or skipped) and its evidence holds: the same input
// fingerprints, every recorded output present with its recorded hash, and
// not expired. When the evidence does not hold, Begin records why
// (invalidate, with a reason such as "input src/parser.go changed") and
// begins the stage again. In a store that keeps outputs' bytes
// (Store.Blobs: pgstore), an output missing or altered in the local
// directory is restored from them first; one the store has no bytes of
// (or others than recorded) makes the stage run again, and one that
// cannot be written here or read now is an error, with nothing recorded
// (ErrInvalid for a path that leads out of the directory): the stage
// stays complete for the run's other sessions. The outputs of the stages
// named with After are fetched the same way, before the begin is
// recorded: one that cannot be fetched (ErrCorrupt for bytes damaged in
// the store, with the stage to run again to store them anew) is an error
// with nothing recorded, so it counts no attempt against MaxAttempts.
//
// Begin fails with ErrBusy when a live session runs the stage, with
// ErrNeedsPerson when it awaits a person, with ErrFatal after a fatal
// failure, with ErrNotReady when an After stage is not done, and with
// ErrTransition when the run's Flow forbids it, and with ErrInvalid when
// the inputs' names and fingerprints encode to more than 4 MiB. A stage
// begun by a session that died is recorded as interrupted and begun again.
// An error means no attempt is under way and Begin recorded nothing,
// except when the After stages changed under each of ten fetches (the
// begin is then recorded first, and a fetch that fails is recorded as the
// attempt's failure) or the Run turned read-only in the begin's own batch.
//
// The begin record is written but not fsync'd: until Complete, Fail or
// Await, nothing is acknowledged. It does not wait for another goroutine's
// fsync either. logs/next-steps.txt shows the stage running once it has
// run for 50 ms, or shows its end: a begin alone does not rewrite the
// handoff. Safe for concurrent use.
func (r *Run) Begin(ctx context.Context, name string, inputs ...Input) (*Stage, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ev, err := r.gather(inputs)
	if err != nil {
		return nil, err
	}
	if slices.Contains(ev.after, name) {
		// It could never be done before it begins: ErrNotReady for ever
		// (a caller that waits for it, runstate exec -wait, would wait
		// all its time).
		return nil, fmt.Errorf("%w: stage %s cannot be After itself: drop After(%q), or name the stage it needs", ErrInvalid, name, name)
	}
	// The After stages' outputs are fetched before the begin is recorded:
	// one that cannot be fetched (damaged in the store, the server gone)
	// is an error with nothing recorded, not a failed attempt counted
	// against the stage. have is what is in place locally (hashed, or
	// fetched); want, what the last decision under the lock asked for.
	//
	// The session's view outside the lock may be older than the run (an
	// After stage another session of this directory is running again
	// right now): outside the lock Begin only hashes the local copies of
	// what the view names, and writes nothing; what it fetches is what
	// the decision under the lock asked for (fetchNow).
	var have, want []Output
	var wantOf []string
	fetchNow := false
	fetching := r.store.Blobs() != nil // a store without bytes has nothing to fetch
	for tries := 0; ; tries++ {
		// Look at a done stage's outputs outside the lock: hashing files
		// must not hold up other writers.
		r.stMu.RLock()
		var seen int64
		var outs []Output
		look := r.st.stages[name]
		if look != nil && look.State == StateComplete {
			seen, outs = look.DoneSeq, look.Outputs
		}
		var viewed []Output
		if fetching && tries == 0 && mayBegin(look) && ev.afterDone(r.st) {
			viewed, _ = ev.afterOutputs(r.st)
		}
		r.stMu.RUnlock()
		if len(viewed) > 0 && r.out.check(viewed) == "" { // the local copies are as recorded
			have = viewed
		}
		if fetchNow {
			if err := r.fetchOutputs(ctx, want, wantOf); err != nil { // blobs.go
				return nil, err
			}
			have, want, wantOf, fetchNow = want, nil, nil, false
		}
		outReason := ""
		if seen != 0 {
			if outReason, err = r.restoreOutputs(ctx, name, outs, r.out.check(outs)); err != nil { // blobs.go
				return nil, err
			}
		}
		var fps map[string]string
		var attempt int
		var why string
		var afterOuts []Output
		var afterOf []string
		var orphan *Stage // an attempt of this session whose end record could not be written
		_, err := r.commitTx(&tx{lazy: true, ctx: ctx, fn: func(s *state) ([]*Record, error) {
			st := s.stages[name]
			if st == nil {
				st = &StageStatus{Name: name, State: StatePending}
			}
			var recs []*Record
			orphan = nil
			switch st.State {
			case StateRunning:
				if o, reason := r.orphan(st); o != nil {
					orphan = o
					recs = append(recs, &Record{Ev: evInterrupted, Stage: name, Attempt: st.Attempt, Reason: reason})
				} else if r.alive(st.Session) {
					if st.Session == r.session {
						// Never a dead process: a Stage of this Run that has
						// not ended (a fn calling Do of its own stage, a
						// Begin whose Stage was dropped, two goroutines).
						return nil, fmt.Errorf("%w: %s attempt %d is running in this session: its Stage has not ended (Complete, Fail or Await it; a Do's fn must not Do or Begin its own stage)", ErrBusy, name, st.Attempt)
					}
					return nil, fmt.Errorf("%w: %s attempt %d is running in another session (%s): wait for it to end (if that process died, the next Begin records it as interrupted and runs it again)", ErrBusy, name, st.Attempt, st.Session)
				} else {
					recs = append(recs, &Record{Ev: evInterrupted, Stage: name, Attempt: st.Attempt,
						Reason: "session " + st.Session + " is gone"})
				}
			case StateAwaiting:
				reason := st.Reason
				if reason == "" {
					reason = st.Error
				}
				return nil, fmt.Errorf("%w: %s: %s; approve it with: %s", ErrNeedsPerson, name, reason, r.where.approve(name))
			case StateFatal:
				return nil, fmt.Errorf("%w: %s: %s; fix the cause, then: %s", ErrFatal, name, st.Error, r.where.invalidate(name))
			case StateSkipped:
				attempt, why = st.Attempt, "skipped: "+st.Reason
				return nil, fmt.Errorf("%w: %s was skipped: %s", ErrDone, name, st.Reason)
			}
			var err error
			fps, err = ev.fingerprints(s, name)
			if err != nil {
				return nil, err
			}
			if st.State == StateComplete {
				if st.DoneSeq != seen {
					return nil, errRecheck
				}
				reason := staleReason(ev.recorded(st.Inputs), fps)
				if reason == "" && outReason != "" {
					reason = outReason + sharedOutput(s, name, st.Outputs, outReason)
				}
				if reason == "" && ev.validFor > 0 {
					reason = expired(st.DoneAt, time.Now(), ev.validFor)
				}
				if reason == "" {
					attempt, why = st.Attempt, reasonHolds
					return nil, fmt.Errorf("%w: %s (seq %d)", ErrDone, name, st.DoneSeq)
				}
				recs = append(recs, &Record{Ev: evInvalidate, Stage: name, Reason: reason})
			}
			if err := r.checkFlow(s, name, st); err != nil {
				return nil, err
			}
			if st.Attempt < 0 || st.Attempt >= maxAttempt {
				return nil, fmt.Errorf("%w: stage %s has begun %d times, and a ledger record counts 1 to %d (the ledger or manifest.json was edited?); nothing recorded", ErrInvalid, name, st.Attempt, maxAttempt)
			}
			attempt = st.Attempt + 1
			why = attemptReason(st, recs)
			afterOuts, afterOf = ev.afterOutputs(s)
			if fetching && !sameOutputs(afterOuts, have) && tries < 10 {
				want, wantOf, fetchNow = afterOuts, afterOf, true
				return nil, errFetchFirst
			}
			recs = append(recs, &Record{Ev: evBegin, Stage: name, Attempt: attempt, Inputs: fps, Reason: why})
			return recs, nil
		}})
		if (errors.Is(err, errRecheck) || errors.Is(err, errFetchFirst)) && tries < 10 {
			continue
		}
		if errors.Is(err, errRecheck) {
			return nil, fmt.Errorf("%w: stage %s was completed again under each of %d looks at its outputs (other sessions keep running it); nothing recorded: begin it again later", ErrBusy, name, tries+1)
		}
		if errors.Is(err, ErrDone) {
			r.c.mu.Lock()
			r.c.skipped++
			r.c.mu.Unlock()
			r.noticeDone(name, attempt, why)
		}
		if orphan != nil && err == nil {
			r.att.interrupted(orphan)
		}
		if err != nil {
			return nil, err
		}
		if err := r.hit(hookAfterBegin, name); err != nil {
			return nil, err
		}
		st := &Stage{run: r, name: name, attempt: attempt, ev: ev, fps: fps, outputs: map[string]Output{}, began: time.Now(), reason: why, caller: ctx}
		sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
		st.ctx = sctx
		r.att.add(st, cancel)
		if sctx.Err() != nil {
			// The Run turned read-only in the begin's own batch (a store
			// whose begins land at Unlock could not commit it): no
			// record of this attempt can be written.
			return nil, context.Cause(sctx)
		}
		if fetching && !sameOutputs(afterOuts, have) {
			// The After stages changed under every one of ten fetches:
			// fetched after the begin, a failure counts.
			if err := r.fetchOutputs(ctx, afterOuts, afterOf); err != nil { // blobs.go
				_ = st.Fail(err)
				return nil, err
			}
		}
		return st, nil
	}
}

// Skip records that the named stage is not needed, with the reason; it then
// counts as done. Skipping a done stage writes nothing. When Skip returns
// nil the record is durable. Safe for concurrent use.
func (r *Run) Skip(ctx context.Context, name, reason string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var orphan *Stage // an attempt of this session whose end record could not be written
	_, err := r.commitCtx(ctx, true, func(s *state) ([]*Record, error) {
		st := s.stages[name]
		orphan = nil
		if st != nil {
			if done(st.State) {
				return nil, nil
			}
			if orphan, _ = r.orphan(st); orphan == nil && st.State == StateRunning && r.alive(st.Session) {
				return nil, fmt.Errorf("%w: cannot skip %s: attempt %d is running", ErrBusy, name, st.Attempt)
			}
		}
		return []*Record{{Ev: evSkip, Stage: name, Reason: reason}}, nil
	})
	if orphan != nil && err == nil {
		r.att.interrupted(orphan)
	}
	return err
}

// Do runs one stage: Begin, then fn, then Complete when fn returns nil or
// Fail when it returns an error. When the stage is done and its evidence
// holds, Do returns nil at once without calling fn. A panic in fn is
// recorded as a failure and then re-raised (bbolt's Update does the same);
// a fn that calls runtime.Goexit (t.Fatal in a test) is recorded as
// failed too, and Goexit goes on: Do does not return. A nil fn is
// ErrInvalid, with nothing recorded.
// When Do returns nil the stage's completion is durable. When fn ends the
// attempt itself (Stage.Complete, Fail or Await), Do records nothing more
// and returns fn's error; if fn returns nil, Do returns nil only when the
// attempt completed, and otherwise what ended it: the error given to
// Fail, Await's error (wrapping ErrNeedsPerson), or Complete's ErrStale.
//
// The ctx fn gets is ctx, also cancelled when the session is lost
// (context.Cause wraps ErrSessionLost: the store's lease is gone, another
// session may begin the stage again) or the Run turns read-only (see
// Stage.Context). When the end record could not be written and the Run
// stayed writable (Do returns that error), the next Begin or Do of the
// stage in this Run records the attempt as interrupted and begins it
// again (attempts.go says why). When ctx ends while fn runs and fn returns
// its error (context.Canceled or DeadlineExceeded, with no class), the
// attempt is recorded as failed but not counted toward
// Options.MaxAttempts: a cancellation interrupts the work, it is not the
// work failing. Safe for concurrent use.
func (r *Run) Do(ctx context.Context, name string, fn func(ctx context.Context, st *Stage) error, inputs ...Input) error {
	if fn == nil {
		return fmt.Errorf("%w: Do of stage %q needs a fn to run", ErrInvalid, name)
	}
	st, err := r.Begin(ctx, name, inputs...)
	if errors.Is(err, ErrDone) {
		return nil
	}
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.att.addFn(st, cancel) // cancelled when the session is lost (attempts.go)
	panicked := true
	defer func() {
		if panicked {
			p := recover()
			if p == nil {
				// runtime.Goexit: t.Fatal or require in a test's fn. The
				// attempt fails and the goroutine goes on exiting;
				// panic(nil) here would crash the process.
				_ = st.Fail(fmt.Errorf("fn %w", errGoexit))
				return
			}
			_ = st.Fail(fmt.Errorf("panic: %v", p))
			panic(p)
		}
	}()
	ferr := fn(fctx, st)
	panicked = false
	st.mu.Lock()
	ended, why := st.ended, st.endErr
	st.mu.Unlock()
	if ended {
		// fn ended the attempt itself (Await, Complete or Fail). Returning
		// nil, it still gets nil only for a completed stage.
		if ferr == nil {
			return why
		}
		return ferr
	}
	if ferr != nil {
		if err := st.Fail(ferr); err != nil { // not counted when ctx ended (canceledBy)
			if errors.Is(ferr, err) {
				return ferr // the same error twice (the run closed under fn: ErrClosed), said once
			}
			return errors.Join(ferr, err)
		}
		return ferr
	}
	err = st.Complete()
	if err != nil && diskFull(err) {
		// The complete record found no space: end the attempt as failed
		// (not counted, see Fail) where that still fits, so that this
		// session may begin the stage again once there is space.
		if ferr := st.Fail(err); ferr != nil {
			return errors.Join(err, ferr)
		}
	}
	return err
}

// errGoexit is the failure recorded for a fn (or an Effect's Do) that
// called runtime.Goexit instead of returning.
var errGoexit = errors.New("called runtime.Goexit instead of returning (t.Fatal, t.FailNow or a failed require check in a test?)")

// segment returns the first segment of a hierarchical stage name.
func segment(name string) string {
	first, _, _ := strings.Cut(name, "/")
	return first
}

// Approve records that a person cleared a stage that awaits one: a review
// (Stage.Await) becomes complete; a failure (NeedsPerson, or retries
// exhausted) may be begun again with a fresh retry budget. by names the
// person. When Approve returns nil the record is durable. Safe for
// concurrent use.
func (r *Run) Approve(ctx context.Context, stage, by, note string) error {
	if err := checkName(stage); err != nil {
		return err
	}
	if strings.TrimSpace(by) == "" {
		return fmt.Errorf("%w: Approve needs the name of the person who approves", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := r.commitCtx(ctx, true, func(s *state) ([]*Record, error) {
		st := s.stages[stage]
		if st == nil || st.State != StateAwaiting {
			state := "unknown to the run"
			if st != nil {
				state = st.State
			}
			return nil, fmt.Errorf("%w: %s does not await a person: it is %s", ErrInvalid, stage, state)
		}
		return []*Record{{Ev: evApprove, Stage: stage, By: by, Note: note}}, nil
	})
	return err
}

// Invalidate forces a stage to be redone: its completion (or fatal
// failure, or skip) no longer counts, and stages that depend on it through
// After are redone in turn. The record names reason and the user who asked
// (from the operating system). When Invalidate returns nil the record is
// durable. Safe for concurrent use.
func (r *Run) Invalidate(ctx context.Context, stage, reason string) error {
	if err := checkName(stage); err != nil {
		return err
	}
	if strings.TrimSpace(reason) == "" {
		return fmt.Errorf("%w: Invalidate needs a reason", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	by := operator()
	_, err := r.commitCtx(ctx, true, func(s *state) ([]*Record, error) {
		if s.stages[stage] == nil {
			return nil, fmt.Errorf("%w: %s is unknown to the run", ErrInvalid, stage)
		}
		return []*Record{{Ev: evInvalidate, Stage: stage, Reason: reason, By: by}}, nil
	})
	return err
}

// sharedOutput says, for a done stage that runs again because its output
// was altered (why, from outputs.check), which other done stage records
// that path too: two stages that write one file redo each other on every
// run (each one's attempt replaces the other's recorded output), which
// the reason alone ("output x altered") does not explain. It returns ""
// when no other stage does. O(stages), on this path alone.
func sharedOutput(s *state, stage string, outs []Output, why string) string {
	for _, o := range outs {
		if !strings.HasPrefix(why, "output "+o.Path+" altered") {
			continue
		}
		var other *StageStatus
		for _, st := range s.stages {
			if st.Name == stage || st.State != StateComplete || (other != nil && st.DoneSeq < other.DoneSeq) {
				continue
			}
			for _, p := range st.Outputs {
				if p.Path == o.Path {
					other = st
					break
				}
			}
		}
		if other != nil {
			return fmt.Sprintf("; stage %s records it too (seq %d): two stages writing one file redo each other: give each its own path", other.Name, other.DoneSeq)
		}
	}
	return ""
}
