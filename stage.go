package runstate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"sync"
	"time"
)

// A Stage: one attempt, from Begin to its end (Complete, Fail, Await),
// with the outputs it wrote or declared.

// Stage is one attempt of a stage, from Begin until Complete, Fail or
// Await. Its methods are safe for concurrent use; after the attempt ends
// they return ErrClosed.
type Stage struct {
	run     *Run
	name    string
	attempt int
	ev      *evidence
	fps     map[string]string

	began time.Time // when Begin returned it (for the group commit: stageEnded)

	// ctx is the attempt's context (Context): cancelled when the attempt
	// ends, or when the Run turns read-only (attempts.go holds its cancel).
	ctx context.Context
	// caller is Begin's ctx, kept only for its Err: Fail tells the
	// caller's cancellation from a failure of the work (canceledBy).
	caller context.Context

	mu        sync.Mutex
	outputs   map[string]Output // recorded by WriteFile, hashed
	kept      map[string]kept   // WriteFile's bytes of small outputs (blobs.go)
	keptBytes int               // their sum
	declared  []string          // recorded by Output, hashed at Complete
	ended     bool
	// endErr is why the attempt that ended did not complete (nil: it
	// did): what Do returns when fn ended the attempt and returned nil.
	endErr error

	plan   []string // declared by Plan (nil: not called)
	reason string   // why this attempt runs (Reason)
}

// Name returns the stage's name. Safe for concurrent use, also after the
// attempt ended.
func (st *Stage) Name() string { return st.name }

// Attempt returns the attempt number, 1 for the first begin of the stage in
// the run. Safe for concurrent use, also after the attempt ended.
func (st *Stage) Attempt() int { return st.attempt }

// Run returns the run the stage belongs to. Safe for concurrent use.
func (st *Stage) Run() *Run { return st.run }

// Context returns the attempt's context, for the work the stage does: it
// carries the values of the context given to Begin, not its deadline or
// cancellation, and is done when the attempt ends (Complete, Fail, Await:
// its cause is context.Canceled), when another record of this session
// ended it (cause ErrStale), when the session is lost (its cause wraps
// ErrSessionLost: the store's lease is gone, another session may begin the
// stage again, and no end record of this attempt can be written: stop the
// work), or when the Run turned read-only for another reason (a failed
// fsync: the cause wraps ErrReadOnly). Close does not cancel it. Safe for
// concurrent use.
func (st *Stage) Context() context.Context { return st.ctx }

// end marks the attempt ended, its end record written (or another record
// ended it): its context is cancelled. why is nil for a complete record,
// else the error that says why the stage is not complete (endErr). The
// caller holds st.mu.
func (st *Stage) end(why error) {
	st.ended, st.endErr = true, why
	st.run.att.done(st, nil)
}

// endFailed notes that the end record could not be written (err) and the
// attempt is still running in the ledger: the next Begin of the stage in
// this session records it as interrupted (attempts.go). The caller holds
// st.mu.
func (st *Stage) endFailed(err error) {
	if err != nil && !st.ended {
		st.run.att.endFailed(st, err)
	}
}

func (st *Stage) check() error {
	if st.ended {
		return &endedError{stage: st.name, attempt: st.attempt, why: st.endErr}
	}
	return st.run.checkOpen()
}

// endedError is the error of a Stage's method after its attempt ended:
// ErrClosed, saying how it ended, without "run is closed" (the Run is
// not).
type endedError struct {
	stage   string
	attempt int
	why     error // st.endErr: nil for a complete
}

func (e *endedError) Error() string {
	how := "completed"
	switch {
	case errors.Is(e.why, ErrStale):
		how = "stale"
	case errors.Is(e.why, ErrNeedsPerson):
		how = "awaiting a person"
	case e.why != nil:
		how = "failed"
	}
	return fmt.Sprintf("runstate: stage %s attempt %d already ended (%s): this Stage is done; Begin (or Do) the stage again for a new attempt", e.stage, e.attempt, how)
}

func (e *endedError) Unwrap() error { return ErrClosed }

// closedOr returns ErrClosed for err when the Run was closed meanwhile (its
// files are closed: that is why err happened), else err.
func (st *Stage) closedOr(err error) error {
	if cerr := st.run.checkOpen(); cerr != nil {
		return cerr
	}
	return err
}

// WriteFile writes data to path inside the run directory atomically, so a
// reader never sees half a file (on Linux a new file is written unnamed
// and then linked in, and a file it replaces is swapped with a temp file
// in logs/tmp, which is then removed; elsewhere a temp file in logs/tmp is
// renamed over it), and records it as an output of this
// attempt with its SHA-256. The file is not fsync'd:
// Complete records its hash, and a later Begin redoes the stage if the
// file did not survive. path is relative to the run directory (or absolute
// inside it) and may not escape it, even through a symbolic link; it may
// not name runstate's own files (logs/ and manifest.json, in any letter
// case or spelling a file system takes for them, or through a symbolic
// link), a device name Windows reserves (NUL, CON, COM1 ...) or hold a NUL
// byte (ErrInvalid). A new file gets mode 0o644 less the umask and less
// the group and other bits the ledger lacks (see the package doc).
// Nothing is written to the ledger until Complete or Await records the
// output. Where the store keeps outputs' bytes (pgstore), WriteFile also
// keeps a copy of an output of up to 64 KiB (up to 1 MiB a stage), and
// Complete stores those bytes, the ones its record names, without reading
// the file again; any other output is read from its file then, and
// Complete fails if it changed since WriteFile. An output is one stage's
// (see Output). Safe for concurrent use; after the attempt ended it
// returns ErrClosed.
func (st *Stage) WriteFile(path string, data []byte) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.check(); err != nil {
		return err
	}
	rel, err := st.run.out.rel(path)
	if err != nil {
		return err
	}
	if err := st.run.out.write(rel, data); err != nil {
		return st.closedOr(err)
	}
	h := sha256.Sum256(data)
	sum := hex.EncodeToString(h[:])
	st.outputs[rel] = Output{Path: rel, SHA256: sum, Size: int64(len(data))}
	st.keep(rel, sum, data)
	return nil
}

// running returns the stage's state when this attempt still runs, and an
// ErrStale error naming what happened to it otherwise (an operator
// invalidated it, another session took it over after this one was thought
// dead).
func (st *Stage) running(s *state) (*StageStatus, error) {
	cur := s.stages[st.name]
	if cur == nil || cur.State != StateRunning || cur.Session != st.run.session || cur.Attempt != st.attempt {
		state := "gone"
		if cur != nil {
			state = fmt.Sprintf("%s (attempt %d)", cur.State, cur.Attempt)
		}
		return nil, fmt.Errorf("%w: %s attempt %d is no longer running: it is %s", ErrStale, st.name, st.attempt, state)
	}
	return cur, nil
}

// Output records a file that the stage wrote by other means as one of its
// outputs. It is hashed when the stage completes (or awaits); it must exist
// then. Like WriteFile, path must stay inside the run directory. Output
// writes nothing: the ledger records the output with Complete or Await.
// An output is one stage's: two stages that write one file replace each
// other's recorded output. In a run directory they then redo each other
// on every run (the reason of the redo names the other stage); where the
// store keeps outputs' bytes (pgstore), each one's Begin puts its own
// bytes back instead, and the file holds the last one's. Safe for
// concurrent use; after the attempt ended it returns ErrClosed.
func (st *Stage) Output(path string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.check(); err != nil {
		return err
	}
	rel, err := st.run.checkOutput(path)
	if err != nil {
		return err
	}
	if !slices.Contains(st.declared, rel) {
		st.declared = append(st.declared, rel)
	}
	return nil
}

// CheckOutput checks path as Stage.Output checks an output's path, with
// no stage begun: it returns ErrInvalid for a path outside the run
// directory, or one that leads out of it through a symbolic link (the
// file itself, or a directory on the way), or that is a directory. A
// program checks its outputs' paths with it before Begin, so that a path it cannot use is an error
// with nothing recorded rather than a failed attempt. A file that does
// not exist yet is checked again when the stage completes. CheckOutput
// writes nothing. Safe for concurrent use; after Close it returns
// ErrClosed.
func (r *Run) CheckOutput(path string) error {
	if err := r.checkOpen(); err != nil {
		return err
	}
	_, err := r.checkOutput(path)
	return err
}

// checkOutput is Output's check of path; it returns path relative to the
// run directory.
func (r *Run) checkOutput(path string) (string, error) {
	rel, err := r.out.rel(path)
	if err != nil {
		return "", err
	}
	// Refuse now, not only at Complete, a path that leads out of the run
	// directory through a symbolic link (the file itself, or a directory
	// on the way). A file that does not exist yet is checked at Complete.
	dir, err := r.out.stat(rel)
	if err != nil {
		if cerr := r.checkOpen(); cerr != nil {
			return "", cerr
		}
		return "", fmt.Errorf("%w: output %s: %v (outputs must stay inside the run directory %s)", ErrInvalid, rel, err, r.dir)
	}
	if dir {
		return "", fmt.Errorf("%w: output %s is a directory: an output is a file: give a file's path (%s/NAME)", ErrInvalid, rel, rel)
	}
	if err := r.out.checkLanding(rel, true); err != nil {
		return "", err
	}
	return rel, nil
}

// endOutputs is the start of Complete and Await (the caller holds st.mu):
// the attempt must still be open, and its outputs are hashed and, where
// the store keeps outputs' bytes (blobs.go), stored before the end record
// names them.
func (st *Stage) endOutputs() ([]Output, error) {
	if err := st.check(); err != nil {
		return nil, err
	}
	outs, err := st.collectOutputs()
	if err != nil {
		return nil, st.closedOr(err)
	}
	if err := st.run.storeOutputs(context.Background(), outs, st.kept); err != nil {
		return nil, st.closedOr(err)
	}
	return outs, nil
}

// collectOutputs hashes the declared outputs and returns every output in
// path order.
func (st *Stage) collectOutputs() ([]Output, error) {
	outs := maps.Clone(st.outputs)
	for _, rel := range st.declared {
		if err := st.run.out.checkLanding(rel, true); err != nil { // a link made since Output
			return nil, fmt.Errorf("runstate: stage %s: %w", st.name, err)
		}
		sum, size, err := st.run.out.hash(rel)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("runstate: stage %s: output %s does not exist: write it before Complete, or do not declare it with Output", st.name, rel)
			}
			return nil, fmt.Errorf("runstate: stage %s: output %s: %w", st.name, rel, err)
		}
		outs[rel] = Output{Path: rel, SHA256: sum, Size: size}
	}
	var list []Output
	for _, k := range slices.Sorted(maps.Keys(outs)) {
		list = append(list, outs[k])
	}
	return list, nil
}

// Complete ends the attempt successfully: it checks the inputs again,
// hashes the outputs and appends the complete record. When Complete
// returns nil the record is in the ledger and durable (fdatasync'd there
// or in its journal: see the package doc) and logs/next-steps.txt is
// current. When an input changed while the stage ran, Complete records the
// stage as invalidated instead and returns ErrStale: run it again.
// ErrStale with nothing recorded means the attempt no longer runs (an
// operator invalidated it, or another session took the stage over).
// Any other error acknowledges nothing. While the Run stays writable
// (not ErrReadOnly) the attempt stays open: call Complete again (after
// writing a missing output, say) or Fail; left so, the next Begin or Do
// of the stage in this Run records it as interrupted. Safe for
// concurrent use; once the attempt ended (nil, or ErrStale), a later call
// returns ErrClosed.
func (st *Stage) Complete() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	outs, err := st.endOutputs()
	if err != nil {
		st.endFailed(err)
		return err
	}
	now, err := st.run.gather(st.ev.list)
	stale := ""
	if err != nil {
		stale = fmt.Sprintf("an input became unreadable while the stage ran: %v", err)
	} else {
		stale = staleReason(st.ev.inputs, now.inputs)
	}
	var staleErr error
	_, err = st.run.commitEnd(st, func(s *state) ([]*Record, error) {
		if _, err := st.running(s); err != nil {
			return nil, err
		}
		reason := stale
		if reason == "" {
			fps, err := st.ev.fingerprints(s, st.name)
			if err != nil {
				reason = err.Error()
			} else if r := staleReason(st.fps, fps); r != "" {
				reason = r
			}
		}
		if reason != "" {
			reason += " while the stage ran"
			staleErr = fmt.Errorf("%w: %s: %s", ErrStale, st.name, reason)
			return []*Record{{Ev: evInvalidate, Stage: st.name, Attempt: st.attempt, Reason: reason}}, nil
		}
		return append(st.planRecords(s), &Record{Ev: evComplete, Stage: st.name, Attempt: st.attempt, Inputs: st.fps, Outputs: outs}), nil
	})
	if err != nil {
		if errors.Is(err, ErrStale) {
			st.end(err)
		}
		st.endFailed(err)
		return err
	}
	st.end(staleErr)
	return staleErr
}

// Fail ends the attempt as failed and records err with its class:
// Retryable (the default for an unclassified error), NeedsPerson or Fatal.
// After Options.MaxAttempts retryable failures the stage awaits a person.
// An unclassified or Retryable err that is a full disk or quota (ENOSPC,
// EDQUOT) is recorded retryable with that reason and does not count: the
// stage runs again once there is space, without a person. An error text
// longer than 64 KiB is recorded cut, with a marker (see the package
// documentation). An unclassified err that is context.Canceled or
// context.DeadlineExceeded, once the ctx given to Begin has ended, is the
// caller's cancellation, not a failure of the work: it is recorded with
// the reason "canceled: ..." and does not count either. When Fail returns
// nil the record is durable. Fail returns nil for a nil err without
// ending the attempt. Any other error acknowledges nothing, as for
// Complete (ErrStale: the attempt no longer runs; ErrClosed: it already
// ended). Safe for concurrent use.
func (st *Stage) Fail(err error) error { return st.fail(err, canceledBy(st.caller, err)) }

// canceledReason marks a fail record of an attempt that its caller
// cancelled (the ctx given to Begin or Do ended, and the work returned
// that: Stage.Fail): an interruption,
// not a failure of the work, so it does not count toward MaxAttempts.
const canceledReason = "canceled: the caller's context ended; not counted toward MaxAttempts"

// canceledBy reports whether err, what a stage's work returned, is the
// end of the caller's ctx (cancelled, or its deadline passed) rather than
// a failure of the work: ctx has ended, err is context.Canceled or
// context.DeadlineExceeded, and err has no class (Fatal, NeedsPerson and
// Retryable say what the caller wants).
func canceledBy(ctx context.Context, err error) bool {
	var c *classed
	return ctx != nil && ctx.Err() != nil && !errors.As(err, &c) &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// fail is Fail; canceled records err as the caller's cancellation
// (canceledReason).
func (st *Stage) fail(err error, canceled bool) error {
	if err == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if cerr := st.check(); cerr != nil {
		st.endFailed(cerr)
		return cerr
	}
	class, reason := classOf(err)
	full := class == ClassRetryable && diskFull(err)
	max := st.run.opts.MaxAttempts
	_, cerr := st.run.commitEnd(st, func(s *state) ([]*Record, error) {
		cur, rerr := st.running(s)
		if rerr != nil {
			return nil, rerr
		}
		recs := []*Record{{Ev: evFail, Stage: st.name, Attempt: st.attempt, Class: class, Error: err.Error()}}
		switch {
		case full:
			recs[0].Reason = diskFullReason
		case canceled:
			recs[0].Reason = canceledReason
		case class == ClassPerson:
			recs = append(recs, &Record{Ev: evAwait, Stage: st.name, Attempt: st.attempt, Class: class, Reason: reason})
		case class == ClassRetryable && cur.Failures+1 >= max:
			recs = append(recs, &Record{Ev: evAwait, Stage: st.name, Attempt: st.attempt, Class: class,
				Reason: fmt.Sprintf("retries exhausted: %d attempts failed; last error: %s", cur.Failures+1, oneLine(err.Error()))})
		}
		return recs, nil
	})
	switch {
	case cerr == nil:
		st.end(err)
	case errors.Is(cerr, ErrStale):
		st.end(cerr)
	}
	st.endFailed(cerr)
	return cerr
}

// Await ends the attempt as waiting for a person's review: the outputs
// written so far are recorded, and the stage is complete once Approve is
// called. Await returns an error wrapping ErrNeedsPerson when the await
// record is durable (see Complete), so that Do and the pipeline stop there; any
// other error means the await was not acknowledged. Safe for concurrent
// use; after the attempt ended it returns ErrClosed.
func (st *Stage) Await(reason string) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	outs, err := st.endOutputs()
	if err != nil {
		st.endFailed(err)
		return err
	}
	_, err = st.run.commitEnd(st, func(s *state) ([]*Record, error) {
		if _, err := st.running(s); err != nil {
			return nil, err
		}
		return append(st.planRecords(s), &Record{Ev: evAwait, Stage: st.name, Attempt: st.attempt, Reason: reason, Inputs: st.fps, Outputs: outs}), nil
	})
	if err != nil {
		if errors.Is(err, ErrStale) {
			st.end(err) // the attempt no longer runs, as Complete and Fail find
		}
		st.endFailed(err)
		return err
	}
	err = fmt.Errorf("%w: %s: %s", ErrNeedsPerson, st.name, reason)
	st.end(err)
	return err
}
