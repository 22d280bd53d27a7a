package runstate

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"time"
)

// Options configure Open. A nil *Options and the zero Options mean the
// defaults. Open copies what it needs and never writes into Options, so
// one Options may be passed to several Opens at once, while no one
// changes it.
type Options struct {
	// Request is the run's identity: what it serves. Open refuses a run
	// created for another Request with ErrMismatch. Required to create a
	// run; empty on resume means "whatever the run serves" (tools use that).
	// It, Revision and Environment must be valid UTF-8 (Open fails with
	// ErrInvalid): the ledger records text.
	Request string

	// Revision is the source revision the session works on. A different
	// Revision than the run's is recorded in the open record and allowed.
	Revision string

	// Environment describes where the session runs. Like Revision it is
	// recorded and allowed to differ; nil equals empty.
	Environment map[string]string

	// MaxAttempts bounds retryable failures of one stage: after that many,
	// the stage awaits a person. Zero (or less) means 3.
	MaxAttempts int

	// Flow names the allowed transitions between stages (see AgentFlow).
	// Nil allows any order. A name in it that breaks the rule of stage
	// names (CheckName) is refused at Open (ErrInvalid).
	Flow *Flow

	// ManifestInterval is how often, at most, a running session rewrites
	// manifest.json (it is also written on Open and Close). Zero means one
	// second; a negative value writes it after every append (tests). A
	// session waits longer when a rewrite is slow (it is O(stages)), so
	// that rewrites take at most about 2% of its time.
	ManifestInterval time.Duration

	// Logger receives warnings (a torn tail cut, a projection that could
	// not be written) and debug records. Nil discards them.
	Logger *slog.Logger

	// LockTimeout bounds how long Open, Close, a Stage's Complete, Fail
	// and Await, and Run.Effect's record of the outcome after Do wait for
	// logs/ledger.lock while another process holds it (the calls that
	// take a context wait as long as it allows, and Open no longer than
	// this either). A wait that runs out fails with ErrLockTimeout,
	// naming the holder where it can be found. Zero waits forever, as
	// bbolt's Options.Timeout does; a wait longer than a few seconds is
	// logged with the holder either way.
	LockTimeout time.Duration

	// NoSync skips every fsync. Unsafe: an acknowledged record may be lost
	// in a power failure, and a run whose manifest.json survived records
	// its ledger lost is then refused as corrupt (lost records) until
	// RepairOptions.AcceptLoss drops them. Tests only.
	NoSync bool

	// SourceDir is the directory that File paths are relative to, and
	// that File inputs are recorded relative to: a File path inside it is
	// recorded cleaned and with forward slashes ("parser/parser.go"), so
	// the same checkout opened from another directory, or moved, keeps
	// its evidence; a File path outside it is recorded as an absolute
	// path. Empty means the working directory at Open. A relative
	// SourceDir is taken relative to the working directory at Open.
	SourceDir string

	// OnRecord, when set, is called with each record this Run appends,
	// in ledger order, once it is durable (the invalidate, interrupted and
	// begin records that Begin writes: once written, like the begin, which
	// the stage's end makes durable), with no lock of the Run's held, never
	// by two goroutines at once. It may be called on another goroutine
	// than the one whose call wrote the record, and after that call
	// returned; records of a batch that did not land are not reported.
	// When Begin (or Do) finds a stage done and its evidence holding,
	// which writes no record, OnRecord gets a notice: a Record with Seq 0,
	// Ev "skip", the stage, its attempt and Reason "done, evidence holds"
	// (or "skipped: REASON" for a stage that Skip skipped). Records that
	// other processes append are not reported (Refresh, then Status, or
	// Inspect, read them). OnRecord must not block: the committing
	// goroutine runs it, and every other waits for the commit after it.
	// It may call the Run's methods. Nil means no calls, at no cost.
	OnRecord func(Record)

	// fs replaces the operating system's file system (fault injection in
	// tests). Nil means the real one.
	fs fileSystem

	// durable forces one way of making a batch durable (tests): 0 lets
	// the Run measure which is faster (see journal.pick).
	durable durableWay
}

// Run is an open run directory: one session of work on it. All its methods
// are safe for concurrent use by multiple goroutines, and any number of
// processes may have the same directory open at once. A method that takes a
// context waits for logs/ledger.lock (held by another process for each of
// its appends) as long as the context allows: when it ends first, the call
// records nothing and returns an error wrapping the context's error (and
// ErrLockTimeout for a deadline) that names the holder. The records that
// end a stage's attempt (Complete, Fail, Await, also within Do) and an
// effect's outcome wait as long as Options.LockTimeout allows instead:
// giving up at a context's end would leave the stage running, the effect
// in doubt.
type Run struct {
	dir     string // as passed to Open, for messages and Dir
	opts    Options
	log     *slog.Logger
	session string
	host    string // this machine's name, as the open record gives it

	store Store    // where the records live (store.go; the file store: store_file.go)
	pacer Pacer    // store, when it paces the projections' writes (store.go), else nil
	out   *outputs // the local directory: stages' outputs (outputs.go)

	// stMu guards st and cur. The leader holds it for a whole batch but
	// its fsync (commit.go: the lock order).
	stMu sync.RWMutex
	st   *state // the projection every decision is made on (state.go)
	cur  Batch  // the batch under way: decisions ask it who is alive

	c     committer // group commit, the handoff's lag, counters (commit.go)
	notes notifier  // Options.OnRecord (onrecord.go)
	att   attempts  // this session's attempts: their contexts, the unended (attempts.go)

	// unwatch stops the goroutine that waits for the store's word that
	// the session is lost (watchLease), once.
	unwatch     chan struct{}
	unwatchOnce sync.Once

	src   string // Options.SourceDir, absolute (sourcedir.go)
	where place  // where the handoff says the run is (placeOf)
	// damaged: the sha256s whose bytes in the store (Blobs) were found
	// not to hash to them: the next Complete that names one puts it again
	// without asking (blobs.go).
	damaged sync.Map
}

// Open creates the run in dir, or resumes the run that is there, and starts
// a session on it. A missing dir is created. When Open returns, the
// session's open record (and, for a new run, its create record) is in the
// ledger, the create record durably; logs/next-steps.txt and manifest.json
// reflect the ledger. Open is safe for concurrent use: several goroutines
// and processes may Open one directory at once, exactly one creates the
// run and the others resume it, each as its own session.
//
// Open fails with ErrMismatch when the run serves another Request, with a
// *CorruptError when the ledger is damaged anywhere but in a torn last line
// (one without its '\n'; nothing is written then), with ErrVersion for an
// unknown format, and with ErrInvalid when Request, Revision and
// Environment encode to more than 4 MiB. Records that a machine crash
// left only in the journal (see the package doc) are copied into the
// ledger first (and fdatasync'd there), with a warning in the log. A torn
// last line, left by a writer that died mid-append, is moved aside to
// logs/ledger.jsonl.torn-<time> and cut off.
func Open(dir string, opts *Options) (*Run, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	return OpenStore(newDirStore(dir, o), dir, opts)
}

// OpenStore is Open for the run that s holds: it resumes the run or
// creates it in s, and starts a session on it; dir is the local working
// directory, where outputs and local projections live (a missing one is
// created). When it returns, what Open says is in the ledger is in s: the
// session's open record (and, for a new run, its create record,
// durably). A store that keeps a view of the run in dir (WorkDirViewer,
// as pgstore's DB.Store) has started it, as the store's own Open does;
// one that can refuse dir (WorkDirChecker) has checked it before the
// session recorded anything.
// Safe for concurrent use as Open is; s serves the returned
// Run alone, which closes it (also when OpenStore fails). Its waits for
// the run's lock are bounded by Options.LockTimeout alone:
// OpenStoreContext bounds them by a context too.
func OpenStore(s Store, dir string, opts *Options) (*Run, error) {
	return OpenStoreContext(context.Background(), s, dir, opts)
}

// OpenStoreContext is OpenStore whose waits (the store's Open and the
// run's lock, for the session's first records) also end when ctx does:
// it then fails with ctx's error (a store wraps ErrLockTimeout for a
// deadline), having written nothing. ctx bounds the opening only, not
// the Run. Safe for concurrent use as OpenStore is.
func OpenStoreContext(ctx context.Context, s Store, dir string, opts *Options) (*Run, error) {
	var o Options
	if opts != nil {
		o = *opts
		o.Environment = copyEnv(opts.Environment)
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 3
	}
	if o.ManifestInterval == 0 {
		o.ManifestInterval = time.Second
	}
	if err := checkIdentity(&o); err != nil {
		return nil, err
	}
	if err := o.Flow.check(); err != nil {
		return nil, err
	}
	r := &Run{dir: dir, opts: o, log: o.Logger, store: s, notes: notifier{fn: o.OnRecord}, src: sourceDir(o.SourceDir), where: placeOf(s, dir)}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.pacer, _ = s.(Pacer)
	r.c.policy.init()
	if err := r.open(ctx); err != nil {
		r.out.close()
		_ = s.Close(true) // no open record was written: nothing to prove gone
		return nil, err
	}
	r.watchLease()
	if v, ok := s.(WorkDirViewer); ok {
		if err := v.ViewWorkDir(dir, r.ID()); err != nil {
			_ = r.Close()
			return nil, err
		}
	}
	r.notes.deliver()
	return r, nil
}

func copyEnv(env map[string]string) map[string]string {
	if len(env) == 0 {
		return nil
	}
	out := make(map[string]string, len(env))
	for k, v := range env {
		out[k] = v
	}
	return out
}

// Dir returns the run directory as passed to Open. It reads no file; safe
// for concurrent use, also after Close.
func (r *Run) Dir() string { return r.dir }

// ID returns the run's id (a UUIDv7, from its create record). It reads no
// file; safe for concurrent use, also after Close.
func (r *Run) ID() string {
	r.stMu.RLock()
	defer r.stMu.RUnlock()
	return r.st.identity.ID
}

// Session returns this session's id, as written in its records. Safe for
// concurrent use, also after Close.
func (r *Run) Session() string { return r.session }

// Status returns the run's state as of the last record this session has
// seen (Refresh catches up with other processes first). It reads no file,
// writes nothing and takes no lock but an in-memory one; the Status is a
// snapshot, safe to keep and to read (not to modify). Safe for concurrent
// use; after Close it returns ErrClosed.
func (r *Run) Status() (*Status, error) {
	if err := r.checkOpen(); err != nil {
		return nil, err
	}
	r.stMu.RLock()
	defer r.stMu.RUnlock()
	return r.st.status(r.dir, r.where), nil
}

// NextSteps returns the handoff text, as logs/next-steps.txt holds it
// after this session's last append, rendered from memory: it reads no file
// and writes nothing. Safe for concurrent use; after Close it returns
// ErrClosed.
func (r *Run) NextSteps() (string, error) {
	if err := r.checkOpen(); err != nil {
		return "", err
	}
	r.stMu.RLock()
	defer r.stMu.RUnlock()
	return r.st.nextStepsIn(r.where), nil
}

// Refresh reads what other processes appended since this session last
// wrote, so Status and NextSteps are current. It writes nothing but a cut
// torn tail. Safe for concurrent use.
func (r *Run) Refresh(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := r.commitCtx(ctx, false, func(*state) ([]*Record, error) { return nil, nil })
	return err
}

func (r *Run) checkOpen() error {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if r.c.closed {
		return ErrClosed
	}
	return nil
}

// Close ends the session: it appends a durable close record, rewrites
// manifest.json and logs/next-steps.txt, fdatasyncs the ledger (so that it
// alone holds every record, whatever the journal holds), and releases
// the session's lock.
// Stages this session began and did not end are left running; the next
// session records them as interrupted. Close waits for the batches under
// way and writes one close record after theirs; calls that come after it
// began get ErrClosed. It waits for logs/ledger.lock at most
// Options.LockTimeout (zero: as long as it takes); when the close record
// could not be written (that wait ran out, or the Run is read-only: then
// Close returns its sticky error), the session is released as a killed
// process's would be, and the next session finds it gone. Close is
// idempotent: a later call, or one racing it, waits for the first and
// returns nil. Safe for concurrent use.
func (r *Run) Close() error {
	c := &r.c
	c.mu.Lock()
	if c.closeCalled || c.closed {
		done := c.closeDone // nil after crash: nothing to wait for
		c.mu.Unlock()
		if done != nil {
			<-done
		}
		return nil
	}
	c.closeCalled = true
	c.closeDone = make(chan struct{})
	defer close(c.closeDone)
	sticky := c.sticky
	d := closeData{Skipped: c.skipped, Deduplicated: c.deduped}
	c.mu.Unlock()
	r.stopFlush(true) // the close record republishes the handoff
	var err error
	if sticky != nil {
		err = fmt.Errorf("%w: %w", ErrReadOnly, sticky)
	} else {
		_, err = r.commitTx(&tx{sync: true, last: true, fn: func(s *state) ([]*Record, error) {
			if s.metrics.Sessions <= 1 {
				d.Skipped = 0 // nothing to resume in the first session
			}
			data, _ := json.Marshal(d)
			return []*Record{{Ev: evClose, Data: data}}, nil
		}})
	}
	c.mu.Lock()
	c.closed = true
	// Transactions still queued (the close record's wait ran out behind
	// another process's lock): their batch will not run now.
	queued := c.queue
	c.queue = nil
	clean := err == nil && c.sticky == nil
	c.mu.Unlock()
	for _, t := range queued {
		t.err = ErrClosed
		close(t.done)
	}
	c.batches.Wait() // no batch has the store any more; none starts
	r.stopWatching()
	r.out.close()
	if serr := r.store.Close(clean); serr != nil && err == nil {
		r.setSticky(serr)
		err = serr
	}
	return err
}

// Crash abandons the Run the way a killed process would: no close record,
// no projection, locks and files released. For tests (package runstatetest
// uses it); every later call returns ErrClosed. On a Run already closed
// (or crashed) it does nothing: the store was closed once already.
func (r *Run) crash() {
	r.c.mu.Lock()
	if r.c.closed {
		r.c.mu.Unlock()
		return
	}
	r.c.closed = true
	r.c.mu.Unlock()
	r.stopFlush(false) // crash may run inside a batch: do not wait for one
	r.stopWatching()
	r.out.close()
	_ = r.store.Close(false)
}

// lockContext bounds a wait for the run's lock by ctx and
// Options.LockTimeout (Open's waits).
func (r *Run) lockContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.opts.LockTimeout > 0 {
		return context.WithTimeout(ctx, r.opts.LockTimeout)
	}
	return context.WithCancel(ctx)
}

// errNoRun is the error for a store that holds no record: it matches
// fs.ErrNotExist (errors.Is), as Inspect's does for a run directory that
// is not there.
func errNoRun(s Store) error {
	return &noRunError{fmt.Sprintf("runstate: %s holds no record: the run was never created (open it with Options.Request to create it)", s)}
}

// noRunError is errNoRun's error.
type noRunError struct{ msg string }

func (e *noRunError) Error() string        { return e.msg }
func (e *noRunError) Is(target error) bool { return target == fs.ErrNotExist }
