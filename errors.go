package runstate

import (
	"errors"
	"fmt"
)

// Sentinel errors. Test for them with errors.Is: the errors returned by this
// package wrap them with the file, line or stage they concern.
var (
	// ErrDone is returned by Begin when the stage is complete (or skipped)
	// and its evidence still holds: the caller should not run it again.
	ErrDone = errors.New("runstate: stage already complete")

	// ErrBusy is returned by Begin when the stage is running in a session
	// that is still alive (this one or another process).
	ErrBusy = errors.New("runstate: stage is running in a live session")

	// ErrClosed is returned by every method of a Run after Close (but
	// Close, which returns nil, and Dir, ID and Session, which still
	// answer), and by the methods of a Stage whose attempt already ended.
	ErrClosed = errors.New("runstate: run is closed")

	// ErrCorrupt is wrapped by *CorruptError: the ledger has a bad line, a
	// gap in seq or a broken hash chain before its last line, or it ends
	// before records that manifest.json shows were acknowledged (records
	// lost from its end; see the package documentation). Nothing is
	// written to a corrupt run.
	ErrCorrupt = errors.New("runstate: ledger is corrupt")

	// ErrVersion means the run directory was written in a format version
	// this package does not read. It is never reported as corruption.
	ErrVersion = errors.New("runstate: unsupported format version")

	// ErrMismatch means Open was given a Request different from the one
	// the run was created for (or a directory that names a run kept
	// elsewhere: WorkDirFile), or Run.Effect a Request different from the
	// one its key was recorded with.
	ErrMismatch = errors.New("runstate: run identity mismatch")

	// ErrUnconfirmed means an external side effect may or may not have
	// happened and nothing could confirm it: a person must decide, then
	// call Resolve.
	ErrUnconfirmed = errors.New("runstate: side effect unconfirmed")

	// ErrNeedsPerson is returned by Begin when the stage awaits a person
	// (a review, a failure classed NeedsPerson, or retries exhausted).
	// Approve clears it.
	ErrNeedsPerson = errors.New("runstate: stage needs a person")

	// ErrFatal is returned by Begin when the stage's last attempt failed
	// with a Fatal error. Invalidate clears it.
	ErrFatal = errors.New("runstate: stage failed fatally")

	// ErrTransition is returned by Begin when the run's Flow does not allow
	// the stage to start after the last stage that ran.
	ErrTransition = errors.New("runstate: transition not allowed")

	// ErrNotReady is returned by Begin when an After input names a stage
	// that is not complete.
	ErrNotReady = errors.New("runstate: stage depends on a stage that is not complete")

	// ErrStale is returned by Complete when an input changed while the
	// stage ran. The stage is invalidated, not complete; run it again.
	// Complete, Fail and Await also return it, recording nothing, when
	// the attempt no longer runs (an operator invalidated it, or another
	// session took the stage over).
	ErrStale = errors.New("runstate: evidence changed while the stage ran")

	// ErrReadOnly is returned after a write to the ledger failed in a way
	// that cannot be retried safely (a failed fsync): the Run keeps the
	// first such error and refuses every later write. Open the run again
	// in a new process to continue.
	ErrReadOnly = errors.New("runstate: run is read-only after a failed write")

	// ErrPending may be returned by an Effect's Do when the receiving system
	// accepted the request but has not confirmed it yet. The effect stays
	// unconfirmed until a later Check finds it.
	ErrPending = errors.New("runstate: side effect accepted, not yet confirmed")

	// ErrLockTimeout is wrapped by the error of a call that gave up
	// waiting for logs/ledger.lock: its context's deadline passed, or
	// Options.LockTimeout ran out. Nothing was recorded by that call. The
	// error names the process that holds the lock where it can be found
	// (a stopped or hung process: resume it, or end it).
	ErrLockTimeout = errors.New("runstate: timed out waiting for the ledger lock")

	// ErrSessionLost is wrapped by a Store's error from Lock or Sync when
	// the session's liveness is gone (its lease expired, the connection
	// that held it ended): other sessions may already count it dead and
	// take its stages over. The Run turns read-only (ErrReadOnly for every
	// later write) and cancels its running stages' contexts (Do's ctx for
	// the stage function, Stage.Context) with a cause wrapping
	// ErrSessionLost, at once when the Store reports the loss itself
	// (LeaseWatcher); open the run again to continue as a new session.
	ErrSessionLost = errors.New("runstate: session lost its liveness")

	// ErrConflict is wrapped by the error of an optimistic Batch's Sync
	// or Confirm (OptimisticBatch) when the run's head was no longer the
	// Position the batch was decided on, or the batch cannot be proven
	// right without the run's lock: nothing was written. The committer
	// answers it by rolling its state back and deciding the batch again
	// with the run's lock (TryLock or Lock); callers never see it.
	ErrConflict = errors.New("runstate: the run's head moved under an optimistic batch")

	// ErrInvalid is wrapped by errors about bad arguments: an empty stage
	// name, a path that escapes the run directory, an unknown stage, a
	// receipt that is not JSON, a value larger than a ledger record may
	// hold (see the package documentation). Nothing was recorded for
	// the call that returned it (but see Run.Effect for a receipt Do
	// returned).
	ErrInvalid = errors.New("runstate: invalid argument")
)

// CorruptError reports damage in the ledger, or in a projection that had to
// be rebuilt from it, with the position of the first bad byte.
// It wraps ErrCorrupt.
type CorruptError struct {
	Path   string // file, as passed to Open joined with its name in the run
	Line   int    // 1-based line number; 0 when not known
	Offset int64  // byte offset of the start of that line
	Err    error  // what is wrong
	// Run is the run as 'runstate verify' takes it, unquoted, for a store
	// other than the file store: its Addresser.Address ("" for a store no
	// command reads). For a run directory it is "": Path names it.
	Run string
}

// Error names the file, the line and its byte offset, what is wrong, and
// the command that reports every problem of the run, on the run directory
// (the absolute path) or the store's address, quoted for a shell.
func (e *CorruptError) Error() string {
	return fmt.Sprintf("runstate: %s line %d (byte %d): %v; %s", e.Path, e.Line, e.Offset, e.Err, e.verifyAdvice())
}

// Unwrap returns ErrCorrupt and the underlying cause, so errors.Is works for
// both.
func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

// WriteError reports that appending to the ledger failed (a full disk, a
// short write, an I/O error). Records that were not acknowledged were cut
// back; nothing acknowledged before is lost. When Sticky is true (a failed
// fsync) the Run refuses every later write with ErrReadOnly.
type WriteError struct {
	Path   string // the ledger (or, creating a run, a directory being synced)
	Op     string // "write", "sync", "truncate"
	Sticky bool   // the Run is read-only now (ErrReadOnly for every later write)
	Err    error  // the operating system's error (ENOSPC, EIO ...)
}

// Error names the operation and the file, and says what to do: open the
// run again when it turned read-only, call again after a failed write.
func (e *WriteError) Error() string {
	s := fmt.Sprintf("runstate: %s %s: %v", e.Op, e.Path, e.Err)
	if e.Sticky {
		s += "; the run is read-only now: open it again in a fresh process"
	} else if e.Op == "write" {
		s += "; nothing acknowledged was lost: fix the cause (free space?) and call again"
	}
	return s
}

// Unwrap returns the operating system's error, so that errors.Is finds
// syscall.ENOSPC, for instance.
func (e *WriteError) Unwrap() error { return e.Err }

// classed is an error with a restart class attached by Retryable,
// NeedsPerson or Fatal.
type classed struct {
	class  string
	reason string
	err    error
}

func (e *classed) Error() string {
	if e.err == nil {
		return e.reason
	}
	return e.err.Error()
}
func (e *classed) Unwrap() error { return e.err }

// Failure classes, recorded in the class field of a fail record.
const (
	ClassRetryable = "retryable"
	ClassPerson    = "person"
	ClassFatal     = "fatal"
)

// Retryable marks err as worth retrying: Begin allows the stage again until
// Options.MaxAttempts failures, then it awaits a person. An error that
// carries no class is retryable. Like NeedsPerson and Fatal, Retryable only
// wraps err and records nothing: Stage.Fail (or Do, when fn returns it)
// records the class. A nil err stays nil. Safe for concurrent use.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &classed{class: ClassRetryable, err: err}
}

// NeedsPerson marks err as needing a person: the stage awaits Approve, and
// reason is what the person is asked to do. A nil err becomes an error
// whose text is reason. It only wraps err and records nothing (see
// Retryable); safe for concurrent use.
func NeedsPerson(err error, reason string) error {
	if err == nil {
		err = errors.New(reason)
	}
	return &classed{class: ClassPerson, reason: reason, err: err}
}

// Fatal marks err as final: Begin refuses the stage with ErrFatal until an
// operator invalidates it. A nil err stays nil. It only wraps err and
// records nothing (see Retryable); safe for concurrent use.
func Fatal(err error) error {
	if err == nil {
		return nil
	}
	return &classed{class: ClassFatal, err: err}
}

// classOf returns the restart class of err and the reason a person is
// asked for, if any.
func classOf(err error) (class, reason string) {
	var c *classed
	if errors.As(err, &c) {
		return c.class, c.reason
	}
	return ClassRetryable, ""
}
