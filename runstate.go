package runstate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/flock"
	"github.com/google/uuid"
)

// Paths inside a run directory.
const (
	ledgerFile  = "logs/ledger.jsonl"
	lockFile    = "logs/ledger.lock"
	sessionsDir = "logs/sessions"
)

// Options configure Open. A nil *Options and the zero Options mean the
// defaults. Open copies what it needs and never writes into Options.
type Options struct {
	// Request is the run's identity: what it serves. Open refuses a run
	// created for another Request with ErrMismatch. Required to create a
	// run; empty on resume means "whatever the run serves" (tools use that).
	Request string

	// Revision is the source revision the session works on. A different
	// Revision than the run's is recorded in the open record and allowed.
	Revision string

	// Environment describes where the session runs. Like Revision it is
	// recorded and allowed to differ; nil equals empty.
	Environment map[string]string

	// MaxAttempts bounds retryable failures of one stage: after that many,
	// the stage awaits a person. Zero means 3.
	MaxAttempts int

	// Flow names the allowed transitions between stages (see AgentFlow).
	// Nil allows any order.
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

	// LockTimeout bounds how long Open, Close, and a Stage's Complete,
	// Fail and Await wait for logs/ledger.lock while another process
	// holds it (the calls that take a context wait as long as it allows,
	// and Open no longer than this either). A wait that runs out fails
	// with ErrLockTimeout, naming the holder where it can be found. Zero
	// waits forever, as bbolt's Options.Timeout does; a wait longer than
	// a few seconds is logged with the holder either way.
	LockTimeout time.Duration

	// NoSync skips every fsync. Unsafe: an acknowledged record may be lost
	// in a power failure. Tests only.
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
	abs     string // dir made absolute once at Open: every file is found through it
	opts    Options
	fs      fileSystem
	log     *slog.Logger
	session string
	host    string     // this machine's name, as the open record gives it
	root    *os.Root   // the run directory, for outputs: no path escapes it
	out     outputDirs // on Linux, the directories WriteFile works in

	lock    *ledgerLock  // logs/ledger.lock, taken for every append batch
	ids     fileIDs      // which files the ledger and the journal are (see filecheck.go)
	sesLock *flock.Flock // logs/sessions/<session>.lock, held while open
	ledger  file         // logs/ledger.jsonl, opened for append and read
	wal     journal      // logs/ledger.wal: see wal.go

	// stMu guards st. The group-commit leader holds it for a whole batch.
	stMu sync.RWMutex
	st   *state
	// warnedMissing: sessions whose missing lock file alive has logged
	// (under stMu).
	warnedMissing map[string]bool

	// Under the ledger lock: which handoff file publishNextSteps writes
	// next, and whether hard links failed here.
	handoffNext int
	handoffOff  bool
	// handoffBehind: next-steps.txt lags the ledger by begin records.
	// sideHeld: transactions a side writer wrote whose records the
	// handoff must show before they return (see sideWrite).
	handoffBehind bool
	sideHeld      []*tx
	lagFlushes    atomic.Int64 // handoffs republished by the lag timer
	handoffMu     sync.Mutex   // guards handoff (closeFiles may run mid-batch)
	handoff       [2]file      // the handoff files, kept open where possible
	handoffLen    [2]int64     // the length of each handoff file, as last written
	cmdDir        string       // the run directory as the handoff names it (dirArg)

	// mu guards the fields below it.
	mu      sync.Mutex
	closed  bool
	sticky  error // first write error that makes the run read-only
	queue   []*tx
	leading bool
	// closeCalled: Close has begun; new transactions get ErrClosed (but
	// the close record's), and a second Close waits for closeDone.
	// batches counts the batches under way with the ledger lock; Close
	// waits for them before it closes the files.
	closeCalled bool
	closeDone   chan struct{}
	batches     sync.WaitGroup
	// syncing: the leader waits for an fsync, holding the ledger lock
	// but not stMu; sideWriting: a goroutine writes begins meanwhile
	// (sideWrite); the leader waits for sideWriters after the fsync.
	syncing     bool
	sideWriting bool
	sideWriters sync.WaitGroup
	// woke: the last batch woke a goroutine other than its leader.
	// gatherBatch's state: arrive, when set, is closed as a transaction
	// to sync is queued; gatherOff counts the batches it still skips, and
	// gatherMiss the waits in a row that ran out; syncTime is how long
	// making a batch durable takes here, stageTime how long this
	// process's stage attempts run, begin to end (moving averages); gathered
	// counts the waits that ended with every record expected, gatherLate
	// those that ran out (for tests).
	woke       bool
	arrive     chan struct{}
	gatherOff  int
	gatherMiss int
	syncTime   time.Duration
	stageTime  time.Duration
	gathered   atomic.Int64
	gatherLate atomic.Int64
	// yieldTime: how long cooperate's yield takes (a moving average of
	// the smaller of each two yields in a row); lastYield: the last
	// yield's time; coopSkipped counts the batches it skipped.
	yieldTime   time.Duration
	lastYield   time.Duration
	coopSkipped int
	// flushTimer republishes a handoff that lags by begins (handoffLag);
	// flushing counts its runs; closing: no new timer.
	flushTimer *time.Timer
	flushing   sync.WaitGroup
	closing    bool
	skipped    int // Begin found a stage done
	deduped    int // Effect returned a stored receipt
	manifest   time.Time
	// manifestCost is how long the last manifest rewrite took.
	manifestCost time.Duration

	notes notifier // Options.OnRecord (onrecord.go)
	src   string   // Options.SourceDir, absolute (sourcedir.go)
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
// Environment encode to more than 4 MiB. Records
// that a machine crash left only in logs/ledger.wal are copied into the
// ledger first (and fdatasync'd there), with a warning in the log. A torn
// last line, left by a writer that died mid-append, is moved aside to
// logs/ledger.jsonl.torn-<time> and cut off.
func Open(dir string, opts *Options) (*Run, error) {
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
	r := &Run{dir: dir, opts: o, fs: o.fs, log: o.Logger, notes: notifier{fn: o.OnRecord}, src: sourceDir(o.SourceDir), cmdDir: dirArg(dir)}
	if r.fs == nil {
		r.fs = osFS{}
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if err := r.open(); err != nil {
		r.release(true) // no open record was written: nothing to prove gone
		return nil, err
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

// path returns the file rel of the run, through the absolute run directory
// (a later os.Chdir changes nothing).
func (r *Run) path(rel string) string { return filepath.Join(r.abs, filepath.FromSlash(rel)) }

func (r *Run) open() error {
	if r.dir == "" {
		return fmt.Errorf("%w: Open needs a directory", ErrInvalid)
	}
	abs, err := filepath.Abs(r.dir)
	if err != nil {
		return fmt.Errorf("runstate: cannot use %s: %w", r.dir, err)
	}
	r.abs = abs
	if fi, err := os.Stat(r.abs); err == nil && !fi.IsDir() {
		return fmt.Errorf("runstate: %s is a file, not a run directory: pass a directory", r.dir)
	} else if err != nil && !isNotExist(err) {
		return fmt.Errorf("runstate: cannot use %s: %w", r.dir, err)
	}
	if err := r.guard(); err != nil { // pathguard.go: runstate's own files
		return err
	}
	for _, d := range []string{sessionsDir, tmpDir, handoffDir} {
		if err := r.fs.MkdirAll(r.path(d), 0o755); err != nil {
			return fmt.Errorf("runstate: cannot create %s: %w (is the directory writable?)", r.path(d), err)
		}
	}
	root, err := os.OpenRoot(r.abs)
	if err != nil {
		return fmt.Errorf("runstate: open %s: %w", r.dir, err)
	}
	r.root = root
	r.out.open(root)

	r.lock, err = openLedgerLock(r.path(lockFile))
	if err != nil {
		return fmt.Errorf("runstate: open %s: %w", r.path(lockFile), err)
	}
	ctx := context.Background()
	if r.opts.LockTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.opts.LockTimeout)
		defer cancel()
	}
	if err := r.waitLock(ctx, true); err != nil {
		return err
	}
	defer r.lock.Unlock()

	lp := r.path(ledgerFile)
	fi, err := r.fs.Stat(lp)
	if err == nil && fi.IsDir() {
		return fmt.Errorf("runstate: %s is a directory, not a ledger: move it away", lp)
	}
	existed := err == nil
	f, err := r.fs.OpenFile(lp, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("runstate: open %s: %w", lp, err)
	}
	r.ledger = f
	if r.ids.ledger, err = idOf(f); err != nil {
		return fmt.Errorf("runstate: stat %s: %w", lp, err)
	}

	// Records a machine crash kept out of the ledger, or left damaged in
	// its unsynced part, are read from the journal (see wal.go) before
	// the ledger is judged, and written back before anything else.
	st, fromSnapshot, restored, err := loadState(r.fs, r.abs, f)
	if err != nil {
		return err
	}
	r.st = st
	if !r.opts.NoSync {
		if err := r.openJournal(); err != nil {
			return err
		}
		if r.ids.wal, err = idOf(r.wal.f); err != nil {
			return fmt.Errorf("runstate: stat %s: %w", r.path(walFile), err)
		}
	}
	if saved, err := restoreJournal(r.fs, r.abs, r.sessionOrNone(), f, restored); err != nil {
		return err
	} else if len(restored.tail) > 0 {
		from, to := restored.seqs()
		r.log.Warn("runstate: copied acknowledged records that a machine crash kept out of the ledger back from the journal",
			"ledger", lp, "journal", r.path(walFile), "seq", fmt.Sprintf("%d-%d", from, to), "offset", restored.at, "torn_saved", saved)
	}
	if st.pos.seq == 0 {
		// Before cutTorn: a first line that does not parse may be all
		// that is left of a run (refuseReplace).
		if err := r.refuseReplace(existed); err != nil {
			return err
		}
	}
	if err := r.cutTorn(); err != nil {
		return err
	}
	var recs []*Record
	creating := st.pos.seq == 0
	if creating {
		if r.opts.Request == "" {
			return fmt.Errorf("%w: Options.Request is required to create a run in %s", ErrInvalid, r.dir)
		}
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		data, _ := json.Marshal(runIdentity{ID: id.String(), Request: r.opts.Request, Revision: r.opts.Revision,
			Environment: r.opts.Environment, Format: FormatVersion})
		recs = append(recs, &Record{Ev: evCreate, Data: data})
	} else if r.opts.Request != "" && r.opts.Request != st.identity.Request {
		return fmt.Errorf("%w: %s serves request %q, not %q: use another directory for other work",
			ErrMismatch, r.dir, st.identity.Request, r.opts.Request)
	}

	sid, err := uuid.NewV7()
	if err != nil {
		return err
	}
	r.session = sid.String()
	r.host, _ = os.Hostname()
	if !creating {
		// A new run takes its session lock once its create record is
		// written (below): a creator killed before that leaves no file
		// that refuseReplace would take for a run's.
		if err := r.holdSession(); err != nil {
			return err
		}
	}
	gone := map[string]bool{}
	for _, name := range st.stageNames() {
		s := st.stages[name]
		if s.State == StateRunning && !r.alive(s.Session) {
			recs = append(recs, &Record{Ev: evInterrupted, Stage: name, Attempt: s.Attempt,
				Reason: "session " + s.Session + " is gone"})
			gone[s.Session] = true
		}
	}
	// A session that died between stages left no begin to interrupt; say
	// it is gone, so it leaves the list of open sessions.
	for _, id := range slices.Sorted(maps.Keys(st.sessions)) {
		if !gone[id] && !r.alive(id) {
			data, _ := json.Marshal(sessionGone{Session: id})
			recs = append(recs, &Record{Ev: evInterrupted, Reason: "session " + id + " is gone", Data: data})
		}
	}
	// An intent whose session died without a confirmation is in doubt:
	// say so now, so that Status, the metrics and next-steps.txt show it
	// before the next Effect call asks Check. It is not unconfirmed (a
	// person's business) until Check is missing or fails.
	for _, key := range slices.Sorted(maps.Keys(st.effects)) {
		e := st.effects[key]
		if e.State == EffectIntent && !r.alive(e.Session) {
			recs = append(recs, &Record{Ev: evUnconfirmed, Key: key, Reason: inDoubtReason,
				Error: "session " + e.Session + " died between the intent and a confirmation"})
		}
	}
	data, _ := json.Marshal(openData{PID: os.Getpid(), Host: r.host, Revision: r.opts.Revision, Environment: r.opts.Environment})
	recs = append(recs, &Record{Ev: evOpen, Data: data})
	t := &tx{sync: st.pos.seq == 0, fn: func(*state) ([]*Record, error) { return recs, nil }}
	r.stMu.Lock()
	defer r.stMu.Unlock()
	r.apply([]*tx{t})
	if t.err != nil {
		return t.err
	}
	if creating {
		if err := r.holdSession(); err != nil {
			return err
		}
	}
	// Only now that the sessions found dead are recorded as gone: their
	// lock files are the proof (alive) until then.
	r.cleanStale()
	if t.sync && !r.opts.NoSync {
		// A new run: make the names of the ledger, of logs/ and of the
		// run directory durable too, or a power loss could drop the whole
		// run although its create record was fsync'd.
		for _, d := range []string{r.path("logs"), r.abs, filepath.Dir(r.abs)} {
			if err := r.fs.SyncDir(d); err != nil {
				return &WriteError{Path: d, Op: "sync", Err: err}
			}
		}
	}
	_ = fromSnapshot
	if r.manifestAt().IsZero() { // apply writes it: this is for when it could not
		r.writeManifest()
	}
	return nil
}

// holdSession creates and locks logs/sessions/<session>.lock. The caller
// holds the ledger lock, so no other session can see the file unlocked.
func (r *Run) holdSession() error {
	r.sesLock = flock.New(r.path(sessionsDir + "/" + r.session + ".lock"))
	ok, err := r.sesLock.TryLock()
	if err != nil {
		return fmt.Errorf("runstate: lock %s: %w", r.sesLock.Path(), err)
	}
	if !ok {
		return fmt.Errorf("runstate: lock %s: held by another process (a session id used twice?); open the run again", r.sesLock.Path())
	}
	openHere.Store(r.session, true)
	return nil
}

// cleanStale removes the lock files of sessions that are gone and the temp
// files they left. The caller holds the ledger lock.
func (r *Run) cleanStale() {
	live := map[string]bool{r.session: true}
	ents, _ := r.fs.ReadDir(r.path(sessionsDir))
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok || id == r.session {
			continue
		}
		if r.alive(id) {
			live[id] = true
			continue
		}
		if err := r.fs.Remove(r.path(sessionsDir + "/" + e.Name())); err == nil {
			r.log.Debug("runstate: removed stale session lock", "session", id)
		}
	}
	ents, _ = r.fs.ReadDir(r.path(tmpDir))
	for _, e := range ents {
		id, _, _ := strings.Cut(e.Name(), "~")
		if len(e.Name()) > 36 {
			id = e.Name()[:36]
		}
		if !live[id] {
			if err := r.fs.Remove(r.path(tmpDir + "/" + e.Name())); err == nil {
				r.log.Info("runstate: removed a temp file left by a killed write", "file", r.path(tmpDir+"/"+e.Name()))
			}
		}
	}
	// The handoff files of killed sessions (see publishNextSteps).
	ents, _ = r.fs.ReadDir(r.path(handoffDir))
	for _, e := range ents {
		if id := e.Name(); len(id) < 36 || !live[id[:36]] {
			_ = r.fs.Remove(r.path(handoffDir + "/" + e.Name()))
		}
	}
}

// loadState reads the run's state: from manifest.json when it is a usable
// snapshot of this ledger (its last record is there, with the same hash),
// then the records after it; otherwise by replaying the whole ledger.
// A torn tail is not applied; the returned state's pos ends before it.
// Records that only the journal holds (j) are applied where the ledger
// lost them (replayJournal); the caller writes them back.
func loadState(fsys fileSystem, dir string, f file) (st *state, fromSnapshot bool, j restored, err error) {
	lp := filepath.Join(dir, filepath.FromSlash(ledgerFile))
	fi, err := f.Stat()
	if err != nil {
		return nil, false, j, fmt.Errorf("runstate: stat %s: %w", lp, err)
	}
	size := fi.Size()
	if data, err := readFile(fsys, filepath.Join(dir, manifestFile)); err == nil {
		if s, pos, err := decodeManifest(data); err == nil && pos.End <= size && journalAgrees(fsys, dir, f, pos) {
			if crc, ok := snapshotHolds(f, pos); ok {
				st, fromSnapshot = s, true
				st.pos.crc = crc
			}
		}
	}
	if st == nil {
		st = newState()
	}
	_, j, err = replayJournal(fsys, dir, f, size, &st.pos, st.replay)
	if err != nil {
		return nil, false, j, err
	}
	return st, fromSnapshot, j, nil
}

// snapshotHolds reports whether the ledger has, at pos, the record the
// manifest says it reflects, and whether that line has a crc field.
func snapshotHolds(f file, pos snapshotPos) (crc, ok bool) {
	n := pos.End - pos.Offset
	if n > maxLine || n < 1 {
		return false, false
	}
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, pos.Offset); err != nil {
		return false, false
	}
	if buf[n-1] != '\n' || (pos.Offset > 0 && !precededByNewline(f, pos.Offset)) {
		return false, false
	}
	return hasCRC(buf[:n-1]), lineHash(buf[:n-1]) == pos.Hash
}

func precededByNewline(f file, off int64) bool {
	var b [1]byte
	_, err := f.ReadAt(b[:], off-1)
	return err == nil && b[0] == '\n'
}

// cutTorn moves a torn last line aside and truncates the ledger to the last
// good record. The caller holds the ledger lock.
func (r *Run) cutTorn() error {
	size, err := fileSize(r.ledger)
	if err != nil {
		return err
	}
	end := r.st.pos.offset
	if size == end {
		return nil
	}
	if size < end {
		return &CorruptError{Path: r.path(ledgerFile), Line: int(r.st.pos.seq), Offset: size,
			Err: fmt.Errorf("ledger is %d bytes, shorter than the %d already read (truncated by hand?)", size, end)}
	}
	aside, err := saveTorn(r.fs, r.abs, r.sessionOrNone(), r.ledger, end, size, !r.opts.NoSync)
	if err != nil {
		return err
	}
	if err := r.ledger.Truncate(end); err != nil {
		return &WriteError{Path: r.path(ledgerFile), Op: "truncate", Err: err}
	}
	r.log.Warn("runstate: cut a torn last line from the ledger (a writer died mid-append; it was never acknowledged)",
		"ledger", r.path(ledgerFile), "offset", end, "bytes", size-end, "saved", aside)
	return nil
}

func (r *Run) sessionOrNone() string {
	if r.session == "" {
		return "open"
	}
	return r.session
}

// tx is one unit of the group commit: fn decides, on the current state and
// under the ledger lock, which records to append (or fails without any).
type tx struct {
	fn   func(*state) ([]*Record, error)
	sync bool // the records acknowledge something: fsync before returning
	recs []*Record
	err  error
	done chan struct{}
	// released: done was closed early, once the records were written
	// (a transaction without sync, in a batch that waits for an fsync).
	released bool
	// lazy: the handoff need not show these records at once (a begin);
	// see handoffLag.
	lazy bool
	// flush: publish the handoff if it lags (the lag timer's transaction).
	flush bool
	// began: when the attempt this transaction ends began (commitEnd).
	began time.Time
	// ctx bounds the caller's wait (nil: Options.LockTimeout); claim
	// is txQueued until the leader takes the transaction (txClaimed) or
	// its caller gives up waiting (txWithdrawn): see await.
	ctx   context.Context
	claim atomic.Int32
	// last: Close's transaction, the close record: the batch that
	// writes it also rewrites the manifest and fdatasyncs the ledger.
	last bool
}

// handoffLag is how long, at most, logs/next-steps.txt may lag the ledger
// by begin records. A batch of begins alone does not republish the
// handoff: the stage's complete (or fail, skip, await) comes soon and
// republishes it, which halves the handoff rewrites of a short stage. A
// stage that runs longer than this shows as running: a timer republishes
// the handoff then. Every other record is in the handoff when the call
// that appended it returns.
const handoffLag = 50 * time.Millisecond

// decide runs the transaction's fn. A panic in it (a bug) becomes the
// transaction's error instead of unwinding through the leader, which
// would leave every waiting goroutine of the batch blocked for ever.
func (t *tx) decide(s *state) (recs []*Record, err error) {
	defer func() {
		if p := recover(); p != nil {
			recs, err = nil, fmt.Errorf("runstate: internal error deciding a record: %v\n%s", p, debug.Stack())
		}
	}()
	return t.fn(s)
}

// commit runs fn under the ledger lock on the current state and appends the
// records it returns. Concurrent commits in one process are grouped: one
// leader takes the lock once, writes every queued transaction's records
// with one write and one fsync, and wakes the others.
func (r *Run) commit(sync bool, fn func(*state) ([]*Record, error)) ([]*Record, error) {
	return r.commitTx(&tx{fn: fn, sync: sync})
}

// commitCtx is commit for a call whose wait for the ledger lock ctx
// bounds.
func (r *Run) commitCtx(ctx context.Context, sync bool, fn func(*state) ([]*Record, error)) ([]*Record, error) {
	return r.commitTx(&tx{fn: fn, sync: sync, ctx: ctx})
}

// commitEnd commits, with an fsync, the record that ends st's attempt
// (complete, fail, await), noting how long the attempt ran for the group
// commit (gatherBatch).
func (r *Run) commitEnd(st *Stage, fn func(*state) ([]*Record, error)) ([]*Record, error) {
	return r.commitTx(&tx{fn: fn, sync: true, began: st.began})
}

func (r *Run) commitTx(t *tx) ([]*Record, error) {
	t.done = make(chan struct{})
	r.mu.Lock()
	if r.closed || (r.closeCalled && !t.last) {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	if r.sticky != nil {
		err := r.sticky
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", ErrReadOnly, err)
	}
	r.queue = append(r.queue, t)
	if !t.began.IsZero() {
		d := time.Since(t.began)
		if r.stageTime == 0 {
			r.stageTime = d
		} else {
			r.stageTime += (d - r.stageTime) / 8
		}
	}
	if r.arrive != nil && t.sync {
		close(r.arrive) // wake a gathering leader
		r.arrive = nil
	}
	if r.leading && r.syncing && !t.sync && !r.sideWriting {
		r.sideWrite()
		r.mu.Unlock()
		return r.await(t)
	}
	if r.leading {
		r.mu.Unlock()
		return r.await(t)
	}
	r.leading = true
	if !r.lead(t) {
		// Another process holds the ledger lock: a goroutine waits for
		// it and leads from there; this caller waits as long as its
		// context allows.
		r.mu.Unlock()
		return r.await(t)
	}
	r.leading = false
	r.mu.Unlock()
	r.notes.deliver()
	<-t.done
	return t.recs, t.err
}

// lead is the leader's loop: it takes batches from the queue until it is
// empty. When another process holds the ledger lock, it hands the batch
// and the leadership to a goroutine that waits for the lock (leadLater),
// so that no caller waits longer than its context allows, and returns
// false; r.leading stays set then. The caller holds r.mu, also on return.
func (r *Run) lead(own *tx) bool {
	for len(r.queue) > 0 {
		// When the last batch woke other goroutines, yield once before
		// taking this one: they are runnable, about to commit again
		// (most often the begin of their next stage), and so join this
		// batch. Otherwise each of those begins arrives while the batch
		// waits for its fsync and is written on its own (sideWrite): a
		// write and a lock round apiece. With 8 goroutines on 2 CPUs
		// that is 15% more checkpoints per second; a goroutine
		// committing alone never yields (PERF.md). Then gatherBatch
		// may hold the batch for their completes. Neither is done while
		// the program's other goroutines keep every processor busy
		// (cooperate).
		if r.woke {
			r.cooperate(own)
		}
		batch := r.queue
		r.queue = nil
		r.mu.Unlock()
		locked, err := r.lock.TryLock()
		if err == nil && !locked {
			go r.leadLater(batch)
			r.mu.Lock()
			return false
		}
		r.runLocked(batch, err)
		r.mu.Lock()
		r.woke = len(batch) > 1 || batch[0] != own
	}
	return true
}

// leadLater waits for the ledger lock, which another process holds, runs
// batch and goes on leading. The long wait is logged with the holder.
func (r *Run) leadLater(batch []*tx) {
	r.runBatch(batch)
	r.mu.Lock()
	r.woke = len(batch) > 1
	if r.lead(nil) {
		r.leading = false
	}
	r.mu.Unlock()
	r.notes.deliver()
}

// await waits for t's batch. A caller whose context ends (or, without
// one, whose Options.LockTimeout runs out) before the leader took t
// withdraws it and gets an error naming who holds the ledger lock; once
// taken, t is written (or fails) within the batch, and await waits for
// that. The caller holds no lock.
func (r *Run) await(t *tx) ([]*Record, error) {
	var stop <-chan struct{}
	if t.ctx != nil {
		stop = t.ctx.Done()
	} else if r.opts.LockTimeout > 0 {
		timer := time.NewTimer(r.opts.LockTimeout)
		defer timer.Stop()
		select {
		case <-t.done:
			return t.recs, t.err
		case <-timer.C:
		}
		if t.claim.CompareAndSwap(txQueued, txWithdrawn) {
			return nil, r.lockWaitError(ErrLockTimeout, r.opts.LockTimeout, true)
		}
	}
	if stop != nil {
		start := time.Now()
		select {
		case <-t.done:
			return t.recs, t.err
		case <-stop:
		}
		if t.claim.CompareAndSwap(txQueued, txWithdrawn) {
			return nil, r.lockWaitError(ctxErr(t.ctx), time.Since(start), true)
		}
	}
	<-t.done
	return t.recs, t.err
}

// The states of tx.claim.
const (
	txQueued int32 = iota
	txClaimed
	txWithdrawn
)

// cooperate yields once and lets gatherBatch gather the next batch (see
// commitTx), unless the processors are busy with other work. A yield
// normally takes some microseconds (the woken goroutines run up to their
// next commit); where the program's own goroutines hold every P it waits
// for a time slice to come round, milliseconds, and so does every wake-up
// of the leader after it: then yielding and gathering cost more than the
// fsyncs they save. So while a yield takes longer than coopBusy (on
// average: yieldTime), it only yields once in coopProbe batches, to see
// whether that has changed. The average takes the smaller of each two
// yields in a row: a lone slow yield is the machine's other processes
// (the kernel ran one while the leader was in its yield: it would have
// run it anyway), not the program's goroutines, whose time slices make
// yields slow again and again. Taken alone, one such yield early in a
// run made it busy for hundreds of batches, since a busy run measures
// only one yield in coopProbe. The caller is the leader and holds r.mu.
func (r *Run) cooperate(own *tx) {
	busy := func() bool { return r.yieldTime > coopBusy }
	if busy() {
		r.coopSkipped++
		if r.coopSkipped%coopProbe != 0 {
			return
		}
	}
	start := time.Now()
	r.mu.Unlock()
	gosched()
	r.mu.Lock()
	d := time.Since(start)
	r.yieldTime += (min(d, r.lastYield) - r.yieldTime) / 4
	r.lastYield = d
	if !busy() {
		r.gatherBatch(own)
	}
}

// gosched is cooperate's yield; a test makes it slow.
var gosched = runtime.Gosched

// coopBusy: a yield that takes longer than this, on average, waited for
// a time slice (the Go scheduler's is 10 ms); a yield with processors to
// spare takes some microseconds (26 µs a batch with 8 goroutines on 2
// CPUs here). coopProbe: while yields are that slow, cooperate yields in
// one batch of this many.
const (
	coopBusy  = time.Millisecond
	coopProbe = 64
)

// gatherBatch runs before a batch when the last one woke other goroutines
// and they have had their turn (the leader's yield). Most of them come
// back at once with the begin of their next stage, and a little later
// with its complete. Taken together with the completes already queued,
// those begins would be released before the fsync and their completes
// would miss it: the goroutines would fall into two groups taking turns,
// each batch holding half of them and each Do spanning two fsyncs. So
// when the queue holds both, gatherBatch writes the begins alone (no
// fsync: their goroutines go on at once) and waits, at most one and a
// half times as long as an fsync takes here (gatherWait), until as many
// more completes (or other records to sync) are queued, so that one fsync
// covers both groups. Where stages
// take longer than an fsync (on average: stageTime), it does not wait:
// nothing to gain. A wait that runs out anyway turns gathering off for a
// number of batches that doubles while waits keep running out
// (gatherMaxMiss). The caller is the leader, whose own transaction is
// own, and holds r.mu, which gatherBatch releases while it writes and
// waits.
func (r *Run) gatherBatch(own *tx) {
	if r.gatherOff > 0 {
		r.gatherOff--
		return
	}
	if r.syncTime <= 0 || r.stageTime <= 0 || r.stageTime >= r.syncTime {
		// No fsync measured yet, or none made (NoSync); or stages take
		// longer than an fsync here, and their goroutines would not be
		// back in time.
		return
	}
	var begins, rest []*tx
	for _, q := range r.queue {
		if q.lazy {
			begins = append(begins, q)
		} else {
			rest = append(rest, q)
		}
	}
	if len(begins) == 0 || !slices.ContainsFunc(rest, func(q *tx) bool { return q.sync }) {
		return
	}
	r.queue = rest
	r.mu.Unlock()
	if locked, err := r.lock.TryLock(); err != nil || !locked {
		// Another process holds the ledger lock: lead waits for it.
		r.mu.Lock()
		r.queue = append(begins, r.queue...)
		return
	}
	r.runLocked(begins, nil)
	r.mu.Lock()
	want := len(begins)
	if slices.Contains(begins, own) {
		want-- // the leader's own stage runs only once it stops leading
	}
	for _, q := range rest {
		if q.sync {
			want++
		}
	}
	deadline := time.Now().Add(r.syncTime * gatherWait / 2)
	for {
		n := 0
		for _, q := range r.queue {
			if q.sync {
				n++
			}
		}
		if r.closed {
			return
		}
		if n >= want {
			r.gathered.Add(1)
			r.gatherMiss = 0
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			r.gatherMiss = min(r.gatherMiss+1, gatherMaxMiss)
			r.gatherOff = 1 << (r.gatherMiss + 2)
			r.gatherLate.Add(1)
			return
		}
		arrive := make(chan struct{})
		r.arrive = arrive
		r.mu.Unlock()
		t := time.NewTimer(left)
		select {
		case <-arrive:
		case <-t.C:
		}
		t.Stop()
		r.mu.Lock()
		r.arrive = nil
	}
}

// gatherWait: gatherBatch waits at most gatherWait/2 times the fsync's
// moving average. The woken goroutines' output files are created one at a
// time by the kernel, and 6-8 of them take about as long as an fsync
// here: with a wait of one fsync, 5% of the waits ran out (each turning
// gathering off for 8 batches or more); one and a half made 3-8% more
// checkpoints per second with 8 goroutines in five sets of runs on this
// machine's disk, and no difference with a journal (PERF.md).
const gatherWait = 3

// After a wait that ran out, gatherBatch skips the next 8 batches; after
// k in a row, 4<<k, up to 512 (gatherMaxMiss): a goroutine that came back
// late once (it was not scheduled, it ended its work) costs little,
// stages that take longer than an fsync cost one wait in 512 batches.
const gatherMaxMiss = 7

// sideWrite writes the queued transactions that need no fsync (begins)
// while the leader waits for an fsync: the leader holds the ledger lock
// until then, and has released stMu, so a begin need not wait for a disk
// flush that it does not need. A transaction of begin records alone
// returns at once (the handoff may lag it: handoffLag); one with another
// record (an interrupted attempt) is held until the leader has published
// the handoff after its fsync. The leader's batch writes the manifest. The leader waits for side writers (sideWriters) before it
// takes stMu again and, later, drops the ledger lock. The caller holds
// r.mu, and holds it again when sideWrite returns.
func (r *Run) sideWrite() {
	r.sideWriting = true
	r.sideWriters.Add(1)
	defer func() {
		r.sideWriting = false
		r.sideWriters.Done()
	}()
	for r.syncing {
		var now []*tx
		rest := r.queue[:0:0]
		for _, t := range r.queue {
			if t.sync {
				rest = append(rest, t)
			} else {
				now = append(now, t)
			}
		}
		if len(now) == 0 {
			return
		}
		r.queue = rest
		r.mu.Unlock()
		r.stMu.Lock()
		var held []*tx
		if w := r.writeBatch(now); w.wrote {
			r.handoffBehind = true
			r.flushHandoffLater()
			// A record other than a begin (an interrupted one, say) must be
			// in the handoff when its call returns: the leader publishes
			// after its fsync and then lets those transactions go.
			for _, t := range w.ok {
				if len(t.recs) > 0 && !onlyBegins(t.recs) {
					held = append(held, t)
				}
			}
			r.sideHeld = append(r.sideHeld, held...)
		}
		r.stMu.Unlock()
		for _, t := range now {
			if !slices.Contains(held, t) {
				close(t.done)
			}
		}
		r.mu.Lock()
	}
}

// runBatch takes the ledger lock, catches up with other processes' appends,
// and applies the batch.
func (r *Run) runBatch(batch []*tx) { r.runLocked(batch, r.waitLock(context.Background(), false)) }

// runLocked is runBatch once the lock is taken (lockErr nil) or could
// not be; it drops the lock.
func (r *Run) runLocked(batch []*tx, lockErr error) {
	fail := func(err error) {
		for _, t := range batch {
			t.err = err
			close(t.done)
		}
	}
	if lockErr != nil {
		fail(fmt.Errorf("runstate: lock %s: %w", r.path(lockFile), lockErr))
		return
	}
	defer r.lock.Unlock()
	r.mu.Lock()
	closed := r.closed
	if !closed {
		r.batches.Add(1) // Close waits for it before closing the files
	}
	r.mu.Unlock()
	if closed {
		fail(ErrClosed) // its callers gave up waiting; the files are closed
		return
	}
	defer r.batches.Done()
	r.stMu.Lock()
	defer r.stMu.Unlock()
	if err := r.checkFiles(batch); err != nil {
		r.setSticky(err)
		fail(err)
		return
	}
	if err := r.catchUp(); err != nil {
		r.setSticky(err)
		fail(err)
		return
	}
	r.apply(batch)
	for _, t := range batch {
		if t.last && t.err == nil {
			t.err = r.finishClose()
		}
		if !t.released {
			close(t.done)
		}
	}
	// Side-written transactions held for the handoff: apply published it
	// (or could not; it logged why).
	for _, t := range r.sideHeld {
		close(t.done)
	}
	r.sideHeld = nil
}

// catchUp applies what other processes appended since this one last looked,
// and cuts a torn tail. The caller holds the ledger lock and stMu.
func (r *Run) catchUp() error {
	size, err := fileSize(r.ledger)
	if err != nil {
		return fmt.Errorf("runstate: size of %s: %w", r.path(ledgerFile), err)
	}
	if size > r.st.pos.offset {
		sr := io.NewSectionReader(r.ledger, r.st.pos.offset, size-r.st.pos.offset)
		if _, err := replay(sr, r.path(ledgerFile), &r.st.pos, r.st.replay); err != nil {
			return err
		}
	}
	if size == r.st.pos.offset {
		return nil // no torn tail: spare cutTorn's seek
	}
	return r.cutTorn()
}

// onlyBegins reports whether recs are all begin records: the only ones
// the handoff may lag (handoffLag).
func onlyBegins(recs []*Record) bool {
	for _, rec := range recs {
		if rec.Ev != evBegin {
			return false
		}
	}
	return true
}

// written is what writeBatch appended.
type written struct {
	ok      []*tx  // the transactions whose records (if any) are written
	sync    bool   // one of them asks for an fsync
	publish bool   // one of them appended a record the handoff must show at once
	flush   bool   // one of them is the handoff lag timer's
	wrote   bool   // there were records to write
	bytes   []byte // what was written
	end     chain  // the ledger's last record once they are
}

// writeBatch runs each transaction's fn on the state, encodes the records
// into one buffer and writes it with one write. On a failed write the
// ledger is cut back to where it was, the state reloaded and every
// transaction of the batch fails. The caller holds the ledger lock (or is
// a side writer: see sideWrite) and stMu.
func (r *Run) writeBatch(batch []*tx) written {
	var w written
	var buf bytes.Buffer
	start := r.st.pos
	mark := r.notes.mark()
	startLen := r.st.lastLen
	now := time.Now().UTC()
	for _, t := range batch {
		if !t.claim.CompareAndSwap(txQueued, txClaimed) {
			continue // withdrawn: its caller gave up waiting (await)
		}
		w.flush = w.flush || t.flush
		recs, err := t.decide(r.st)
		if err != nil {
			t.err = err
			continue
		}
		if err := r.encodeTx(&buf, recs, now); err != nil {
			t.err = err // this transaction only: the others of the batch go on
			continue
		}
		t.recs = recs
		w.sync = w.sync || t.sync
		w.publish = w.publish || (len(recs) > 0 && !(t.lazy && onlyBegins(recs)))
		w.ok = append(w.ok, t)
	}
	if buf.Len() == 0 {
		return w
	}
	w.wrote = true
	w.bytes, w.end = buf.Bytes(), r.st.pos
	if n, err := r.ledger.Write(buf.Bytes()); err != nil {
		werr := &WriteError{Path: r.path(ledgerFile), Op: "write", Err: err}
		if n > 0 {
			if terr := r.ledger.Truncate(start.offset); terr != nil {
				werr.Sticky = true
				r.setSticky(werr)
			}
		}
		for _, t := range w.ok {
			t.err, t.recs = werr, nil
		}
		r.notes.cut(mark)
		r.reload(start, startLen)
		return written{}
	}
	r.wal.wrote(w.bytes, start.offset)
	return w
}

// apply writes the batch (writeBatch) and, if any transaction asks, fsyncs
// it once, then replaces the projections. The caller holds the ledger lock
// and stMu. On a failed fsync the run turns read-only.
func (r *Run) apply(batch []*tx) {
	w := r.writeBatch(batch)
	if !w.wrote {
		if w.flush && r.handoffBehind {
			r.writeNextSteps()
			r.lagFlushes.Add(1)
		}
		return
	}
	ok := w.ok
	failAll := func(err error) {
		for _, t := range ok {
			if !t.released {
				t.err, t.recs = err, nil
			}
		}
	}
	if w.sync && !r.opts.NoSync {
		// A transaction that asked for no fsync (a begin) is done once
		// its records are written: let it go on while the batch waits
		// for the disk. Readers of the state (Status, Begin's look at a
		// stage's outputs) may come in meanwhile too, and so may a side
		// writer (see commitTx) with more begins: this process holds
		// the ledger lock until the fsync is done.
		for _, t := range ok {
			if !t.sync && t.done != nil {
				t.released = true
				close(t.done)
			}
		}
		span := r.wal.span(w.end.offset)
		r.mu.Lock()
		r.syncing = true
		r.mu.Unlock()
		r.stMu.Unlock()
		start := time.Now()
		err := r.makeDurable(w.bytes, span, w.end)
		d := time.Since(start)
		r.mu.Lock()
		r.syncing = false
		if r.syncTime == 0 {
			r.syncTime = d
		} else {
			r.syncTime += (d - r.syncTime) / 8
		}
		r.mu.Unlock()
		r.sideWriters.Wait()
		r.stMu.Lock()
		r.wal.trim()
		if err != nil {
			r.setSticky(err)
			failAll(err)
			r.notes.lost()
			return
		}
	}
	if err := r.hitBatch(hookAfterComplete, ok); err != nil {
		failAll(err)
		return
	}
	if w.publish || len(r.sideHeld) > 0 || (w.flush && r.handoffBehind) {
		r.writeNextSteps()
	} else {
		r.handoffBehind = true
		r.flushHandoffLater()
	}
	if err := r.hitBatch(hookBetweenProjections, ok); err != nil {
		failAll(err)
		return
	}
	if r.opts.ManifestInterval < 0 || time.Since(r.manifestAt()) >= r.manifestInterval() {
		r.writeManifest()
	}
	r.notes.durable()
}

// reload rebuilds the state from the disk after a write that did not land.
func (r *Run) reload(start chain, startLen int64) {
	st, _, _, err := loadState(r.fs, r.abs, r.ledger)
	if err != nil || st.pos != start {
		if err == nil {
			err = fmt.Errorf("ledger ends at seq %d, want %d", st.pos.seq, start.seq)
		}
		r.setSticky(fmt.Errorf("runstate: reload %s after a failed write: %w", r.path(ledgerFile), err))
		return
	}
	st.lastLen = startLen
	r.st = st
}

func (r *Run) setSticky(err error) {
	r.mu.Lock()
	if r.sticky == nil {
		r.sticky = err
	}
	r.mu.Unlock()
}

func (r *Run) manifestAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.manifest
}

// writeNextSteps replaces logs/next-steps.txt. It is a projection: no
// fsync, and a failure is only logged (the next Open rebuilds it). The
// caller holds the ledger lock, so the newest one wins.
func (r *Run) writeNextSteps() {
	r.handoffBehind = false
	p := r.path(nextStepsFile)
	if err := r.publishNextSteps([]byte(r.st.nextSteps(r.cmdDir))); err != nil {
		r.log.Warn("runstate: cannot write the handoff; the next Open rebuilds it", "file", p, "err", err)
	}
}

// flushHandoffLater arms the timer that republishes the handoff when it
// still lags by begin records handoffLag from now.
func (r *Run) flushHandoffLater() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.closing || r.flushTimer != nil {
		return
	}
	r.flushing.Add(1)
	r.flushTimer = time.AfterFunc(handoffLag, func() {
		defer r.flushing.Done()
		r.mu.Lock()
		r.flushTimer = nil
		stop := r.closed || r.closing
		r.mu.Unlock()
		if !stop {
			_, _ = r.commitTx(&tx{fn: func(*state) ([]*Record, error) { return nil, nil }, flush: true})
		}
	})
}

// stopFlush disarms the handoff timer for good and, with wait, waits for
// a flush already under way.
func (r *Run) stopFlush(wait bool) {
	r.mu.Lock()
	r.closing = true
	t := r.flushTimer
	r.flushTimer = nil
	r.mu.Unlock()
	if t != nil && t.Stop() {
		r.flushing.Done()
	}
	if wait {
		r.flushing.Wait()
	}
}

// writeManifest replaces manifest.json, without fsync: a manifest that does
// not match the ledger is ignored and rebuilt.
func (r *Run) writeManifest() {
	p := r.path(manifestFile)
	start := time.Now()
	data, err := r.st.encodeManifest(start)
	if err == nil {
		err = writeAtomic(r.fs, r.path(tmpDir), r.session, p, data, false)
	}
	if err != nil {
		r.log.Warn("runstate: cannot write the manifest; the next Open rebuilds it", "file", p, "err", err)
		return
	}
	r.mu.Lock()
	r.manifest = time.Now()
	r.manifestCost = r.manifest.Sub(start)
	r.mu.Unlock()
}

// manifestInterval is how long a running session waits between two
// manifest rewrites: Options.ManifestInterval, or longer when a rewrite is
// slow (it is O(stages) and holds the ledger lock), so that rewriting the
// snapshot never takes more than about 2% of the time. A resume replays at
// most what was appended since, at a million records a second.
func (r *Run) manifestInterval() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return max(r.opts.ManifestInterval, 50*r.manifestCost)
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
	return r.st.status(r.dir), nil
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
	return r.st.nextSteps(r.cmdDir), nil
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
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	return nil
}

// Close ends the session: it appends a durable close record, rewrites
// manifest.json and logs/next-steps.txt, fdatasyncs the ledger (so that it
// alone holds every record, whatever logs/ledger.wal holds), and releases
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
	r.mu.Lock()
	if r.closeCalled || r.closed {
		done := r.closeDone // nil after crash: nothing to wait for
		r.mu.Unlock()
		if done != nil {
			<-done
		}
		return nil
	}
	r.closeCalled = true
	r.closeDone = make(chan struct{})
	defer close(r.closeDone)
	sticky := r.sticky
	d := closeData{Skipped: r.skipped, Deduplicated: r.deduped}
	r.mu.Unlock()
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
	r.mu.Lock()
	r.closed = true
	// Transactions still queued (the close record's wait ran out behind
	// another process's lock): their batch will not run now.
	queued := r.queue
	r.queue = nil
	clean := err == nil && r.sticky == nil
	r.mu.Unlock()
	for _, t := range queued {
		t.err = ErrClosed
		close(t.done)
	}
	r.batches.Wait() // no batch has the files any more; none starts
	r.removeHandoff()
	r.release(clean)
	return err
}

// finishClose ends the batch that wrote the close record, under the
// ledger lock: the manifest as of it, the ledger fdatasync'd (it alone
// holds every record from here on; the journal is needed after a machine
// crash only), the handoff files dropped. The caller holds the ledger
// lock and stMu.
func (r *Run) finishClose() error {
	r.writeManifest()
	if err := r.syncLedger(); err != nil {
		r.setSticky(err)
		return err
	}
	r.removeHandoff()
	return nil
}

// release drops the session's lock and files. It is also what a killed
// process's exit does, minus the close record. With clean (a close record
// was written) it removes the session's lock file; without, it leaves the
// file unlocked, as a killed process would: a lock that can be taken
// proves the session gone (alive), a missing one does not.
func (r *Run) release(clean bool) {
	if r.sesLock != nil {
		openHere.Delete(r.session)
		// Remove while holding the lock, so no other session sees the
		// file unlocked and takes it for a dead session's (Windows cannot
		// remove an open file; there the next Open cleans it up).
		if clean {
			_ = os.Remove(r.sesLock.Path())
		}
		r.sesLock.Unlock()
	}
	if r.ledger != nil {
		r.ledger.Close()
	}
	if r.wal.f != nil {
		r.wal.f.Close()
	}
	if r.root != nil {
		r.root.Close()
	}
	r.out.close()
	r.closeFiles()
}

// Crash abandons the Run the way a killed process would: no close record,
// no projection, locks and files released. For tests (package runstatetest
// uses it); every later call returns ErrClosed.
func (r *Run) crash() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.stopFlush(false) // crash may run inside a batch: do not wait for one
	if r.sesLock != nil {
		openHere.Delete(r.session)
		r.sesLock.Unlock() // a killed process leaves its lock file behind
	}
	if r.ledger != nil {
		r.ledger.Close()
	}
	if r.wal.f != nil {
		r.wal.f.Close()
	}
	if r.root != nil {
		r.root.Close()
	}
	r.out.close()
	r.closeFiles()
}
