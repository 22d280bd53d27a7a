package runstate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/gofrs/flock"
)

// The file store: a run directory (the package doc lists its files). It is
// the only code that knows the ledger's files, logs/ledger.wal, the lock
// files and the torn-tail files. Every file of it is named store_file*:
//
//	store_file.go           dirStore: Open (recovery), Lock, Read, Live, Close
//	store_file_batch.go     dirBatch: catch-up and torn tail, append, fsync, projections
//	store_file_session.go   session lock files: liveness and its proof, stale files
//	store_file_handoff.go   logs/next-steps.txt published through hard links
//	store_file_read.go      Inspect, ReadLedger and Verify of a directory, without a session
//	store_file_repair.go    Repair: cutting a damaged ledger back to its last good record
//	store_file_wal.go       logs/ledger.wal: the journal ring and its way-picking
//	store_file_wal_recover.go  what the journal holds that the ledger lost, written back
//	store_file_lockwait.go  waiting for logs/ledger.lock, naming its holder
//	store_file_check*.go    the ledger and the journal are still the files opened
//	store_file_newrun.go    never creating a run over a lost one, nor going on from a
//	                        ledger that lost acknowledged records from its end
//	store_file_fs.go        the file system seam (fault injection in tests)
//	store_file_lock_*.go, store_file_lockinfo_*.go, store_file_sync_*.go:
//	                        what differs by platform
//
// pathguard*.go (runstate's own files are what they should be) serves the
// file store and the outputs of every store.

// Paths inside a run directory.
const (
	ledgerFile  = "logs/ledger.jsonl"
	lockFile    = "logs/ledger.lock"
	sessionsDir = "logs/sessions"
)

// dirStore is the file store of one run directory, serving one Run. Its
// fields are used by the Run's leader under the ledger lock, except where
// a comment says otherwise.
type dirStore struct {
	dir  string // as given, for messages
	abs  string // dir made absolute once: every file is found through it
	opts Options
	fs   fileSystem
	log  *slog.Logger

	session string
	host    string
	dirFD   *os.File // the run directory, for lookups relative to it (store_file_check.go)

	lock    *ledgerLock  // logs/ledger.lock, taken for every append batch
	ids     fileIDs      // which files the ledger and the journal are (store_file_check.go)
	sesLock *flock.Flock // logs/sessions/<session>.lock, held while open
	ledger  file         // logs/ledger.jsonl, opened for append and read
	wal     journal      // logs/ledger.wal: see store_file_wal.go

	// opened is the state Open read (loadState), handed to the Run once
	// so that it does not read the ledger again (openedState).
	opened *state
	// holdLater: a new run takes its session lock once its create record
	// is written (first batch): a creator killed before that leaves no
	// file that refuseReplace would take for a run's. cleaned: the first
	// batch removed the files of sessions found gone (cleanStale).
	holdLater bool
	cleaned   bool

	// The Run's view of its sessions, for liveness and lock messages
	// (attach): info looks a session up in the state (the caller holds
	// the Run's state lock); open lists the open sessions when the state
	// is free. warnedMissing: sessions whose missing lock file alive has
	// logged.
	info          func(id string) *SessionStatus
	openSessions  func() []*SessionStatus
	warnedMissing map[string]bool

	handoff handoffFiles // logs/next-steps.txt's publication (store_file_handoff.go)

	batch dirBatch // the one batch under way (one at a time)

	use storeUse // refuses a second Run (OpenStore twice on one store)
}

// storeUse keeps a Store that serves one Run from serving a second: a
// second OpenStore on it is refused (claim), and the Close that the
// failed OpenStore then makes is ignored (stray), instead of the second
// Run's session taking over the first's files and lock, or its Close
// ending the first Run's session.
type storeUse struct {
	mu     sync.Mutex
	inUse  bool
	strays int // refused opens whose Close is still to come
}

// busy reports whether the store serves a Run already.
func (u *storeUse) busy() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.inUse
}

// claim marks the store as serving a Run; false when it already does.
func (u *storeUse) claim() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.inUse {
		u.strays++
		return false
	}
	u.inUse = true
	return true
}

// stray reports whether a Close is a refused open's, and counts it.
func (u *storeUse) stray() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.strays > 0 {
		u.strays--
		return true
	}
	return false
}

// NewFileStore returns the file store for the run directory dir: the Store
// that Open uses, for OpenStore and the store-generic readers
// (runstatetest/storetest runs on it). Options' NoSync, Logger and
// LockTimeout apply to it; nil means the defaults. It touches no file
// until a method is called (nothing is durable until a Run appends
// through it); it serves one Run, which makes its calls as Store says:
// share a Store between goroutines only through that Run (a second
// OpenStore on it is refused with ErrInvalid, and the Run it serves goes
// on). NewFileStore
// itself is safe for concurrent use.
func NewFileStore(dir string, opts *Options) Store {
	var o Options
	if opts != nil {
		o = *opts
	}
	return newDirStore(dir, o)
}

func newDirStore(dir string, o Options) *dirStore {
	s := &dirStore{dir: dir, opts: o, fs: o.fs, log: o.Logger}
	if s.fs == nil {
		s.fs = osFS{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.abs, _ = filepath.Abs(dir)
	if s.abs == "" {
		s.abs = dir
	}
	s.batch.s = s
	return s
}

// path returns the file rel of the run, through the absolute run directory
// (a later os.Chdir changes nothing).
func (s *dirStore) path(rel string) string { return filepath.Join(s.abs, filepath.FromSlash(rel)) }

func (s *dirStore) String() string { return filepath.Join(s.dir, filepath.FromSlash(ledgerFile)) }

func (s *dirStore) Blobs() Blobs { return nil }

// attach gives the store the Run's view of its sessions (see dirStore.info).
func (s *dirStore) attach(info func(string) *SessionStatus, open func() []*SessionStatus) {
	if s.use.busy() {
		return // the Open that follows is refused
	}
	s.info, s.openSessions = info, open
}

// openedState hands the state Open read to the Run, once.
func (s *dirStore) openedState() *state {
	st := s.opened
	s.opened = nil
	return st
}

// outputPerm is the mode a new output gets: the ledger's bits (pathguard).
func (s *dirStore) outputPerm() fs.FileMode { return outputPerm(s.fs) }

// sessionOrNone names temp files before a session exists.
func (s *dirStore) sessionOrNone() string {
	if s.session == "" {
		return "open"
	}
	return s.session
}

// Open creates the run directory's files that are missing and, under the
// ledger lock, recovers what a crash left: records that only the journal
// holds are copied back into the ledger (and fdatasync'd there), a torn
// last line is moved aside to logs/ledger.jsonl.torn-<time> and cut off.
// A resumed run takes the session's lock file now, a new run once its
// create record is written. The snapshot returned is manifest.json when it
// still matches the ledger.
func (s *dirStore) Open(ctx context.Context, session string) ([]byte, Position, error) {
	if !s.use.claim() {
		return nil, Position{}, fmt.Errorf("%w: the file store of %s serves one Run only: call NewFileStore again for another", ErrInvalid, s.dir)
	}
	s.session = session
	s.host, _ = os.Hostname()
	if s.dir == "" {
		return nil, Position{}, fmt.Errorf("%w: Open needs a directory", ErrInvalid)
	}
	if strings.IndexByte(s.dir, 0) >= 0 {
		return nil, Position{}, fmt.Errorf("%w: the directory %q holds a NUL byte, which no file system path may", ErrInvalid, s.dir)
	}
	abs, err := filepath.Abs(s.dir)
	if err != nil {
		return nil, Position{}, fmt.Errorf("runstate: cannot use %s: %w", s.dir, err)
	}
	s.abs = abs
	if fi, err := os.Stat(s.abs); err == nil && !fi.IsDir() {
		return nil, Position{}, fmt.Errorf("runstate: %s is a file, not a run directory: pass a directory", s.dir)
	} else if err != nil && !isNotExist(err) {
		return nil, Position{}, fmt.Errorf("runstate: cannot use %s: %w", s.dir, err)
	}
	if err := s.guard(); err != nil { // pathguard.go: runstate's own files
		return nil, Position{}, err
	}
	for _, d := range []string{sessionsDir, tmpDir, handoffDir} {
		if err := s.fs.MkdirAll(s.path(d), 0o755); err != nil {
			return nil, Position{}, mkdirError(s.path(d), err)
		}
	}
	if s.dirFD, err = os.Open(s.abs); err != nil {
		return nil, Position{}, openError(s.dir, err)
	}
	s.lock, err = openLedgerLock(s.path(lockFile))
	if err != nil {
		return nil, Position{}, openError(s.path(lockFile), err)
	}
	if err := s.waitLock(ctx, true); err != nil {
		return nil, Position{}, err
	}
	defer s.lock.Unlock()

	lp := s.path(ledgerFile)
	fi, err := s.fs.Stat(lp)
	if err == nil && fi.IsDir() {
		return nil, Position{}, fmt.Errorf("runstate: %s is a directory, not a ledger: move it away", lp)
	}
	existed := err == nil
	f, err := s.fs.OpenFile(lp, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, Position{}, openError(lp, err)
	}
	s.ledger = f
	if s.ids.ledger, err = idOf(f); err != nil {
		return nil, Position{}, fmt.Errorf("runstate: stat %s: %w", lp, err)
	}

	// Records a machine crash kept out of the ledger, or left damaged in
	// its unsynced part, are read from the journal (see store_file_wal.go) before
	// the ledger is judged, and written back before anything else.
	st, snap, restored, err := loadState(s.fs, s.abs, f)
	if err != nil {
		return nil, Position{}, err
	}
	if !s.opts.NoSync {
		if err := s.openJournal(); err != nil {
			return nil, Position{}, err
		}
		if s.ids.wal, err = idOf(s.wal.f); err != nil {
			return nil, Position{}, fmt.Errorf("runstate: stat %s: %w", s.path(walFile), err)
		}
	}
	if saved, err := restoreJournal(s.fs, s.abs, s.sessionOrNone(), f, restored); err != nil {
		return nil, Position{}, err
	} else if len(restored.tail) > 0 {
		from, to := restored.seqs()
		s.log.Warn("runstate: copied acknowledged records that a machine crash kept out of the ledger back from the journal",
			"ledger", lp, "journal", s.path(walFile), "seq", fmt.Sprintf("%d-%d", from, to), "offset", restored.at, "torn_saved", saved)
	}
	if st.pos.seq == 0 {
		// Before cutTorn: a first line that does not parse may be all
		// that is left of a run (refuseReplace).
		if err := s.refuseReplace(existed); err != nil {
			return nil, Position{}, err
		}
		s.holdLater = true
	}
	if err := s.cutTorn(st.pos); err != nil {
		return nil, Position{}, err
	}
	if !s.holdLater {
		if err := s.holdSession(); err != nil {
			return nil, Position{}, err
		}
	}
	s.opened = st
	if snap == nil {
		return nil, st.position(), nil
	}
	return snap.data, snap.at, nil
}

// openedSnapshot is the manifest Open resumed from, and its position.
type openedSnapshot struct {
	data []byte
	at   Position
}

// loadState reads the run's state: from manifest.json when it is a usable
// snapshot of this ledger (its last record is there, with the same hash),
// then the records after it; otherwise by replaying the whole ledger.
// A torn tail is not applied; the returned state's pos ends before it.
// Records that only the journal holds (j) are applied where the ledger
// lost them (replayJournal); the caller writes them back. A ledger that
// ends before records the manifest shows were acknowledged is refused
// with a *CorruptError (lostRecords).
func loadState(fsys fileSystem, dir string, f file) (st *state, snap *openedSnapshot, j restored, err error) {
	lp := filepath.Join(dir, filepath.FromSlash(ledgerFile))
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, j, fmt.Errorf("runstate: stat %s: %w", lp, err)
	}
	size := fi.Size()
	var man *state // a manifest that is not a snapshot of this ledger
	if data, err := readOwn(fsys, dir, manifestFile, maxManifest); err == nil {
		if s, pos, err := decodeManifest(data); err == nil {
			if pos.End <= size && journalAgrees(fsys, dir, f, pos) {
				if crc, ok := snapshotHolds(f, pos); ok {
					st = s
					st.pos.crc = crc
					snap = &openedSnapshot{data: data, at: st.position()}
				}
			}
			if st == nil {
				man = s
			}
		}
	}
	if st == nil {
		st = newState()
	}
	_, j, err = replayJournal(fsys, dir, f, size, &st.pos, st.replay)
	if err != nil {
		return nil, nil, j, err
	}
	if man != nil {
		// Records the manifest shows acknowledged, which neither the
		// ledger nor the journal holds (store_file_newrun.go).
		if lost := lostBy(dir, man, st.identity.ID, st.pos); lost != nil && lostNow(f, lp, size, st.pos, man) {
			return nil, nil, restored{}, &CorruptError{Path: lp, Line: int(st.pos.seq + 1), Offset: st.pos.offset, Err: lost}
		}
	}
	return st, snap, j, nil
}

// lostNow reports whether the ledger f, size bytes long when the state
// was read up to c, still ends before the records the manifest man shows
// were acknowledged: a reader holds no lock, and a writer may have
// appended them, and published man, after size was read.
func lostNow(f file, lp string, size int64, c chain, man *state) bool {
	now, err := fileSize(f)
	if err != nil || now <= size {
		return true
	}
	_, _ = replay(io.NewSectionReader(f, c.offset, now-c.offset), lp, &c, nil) // c stays at the last good record
	return lostBy("", man, man.identity.ID, c) != nil
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

// cutTorn moves a torn last line, after c (the last good record), aside
// and truncates the ledger there. The caller holds the ledger lock.
func (s *dirStore) cutTorn(c chain) error {
	size, err := fileSize(s.ledger)
	if err != nil {
		return err
	}
	end := c.offset
	if size == end {
		return nil
	}
	if size < end {
		return &CorruptError{Path: s.path(ledgerFile), Line: int(c.seq), Offset: size,
			Err: fmt.Errorf("ledger is %d bytes, shorter than the %d already read (truncated by hand?)", size, end)}
	}
	aside, err := saveTorn(s.fs, s.abs, s.sessionOrNone(), s.ledger, end, size, !s.opts.NoSync)
	if err != nil {
		return err
	}
	if err := s.ledger.Truncate(end); err != nil {
		return &WriteError{Path: s.path(ledgerFile), Op: "truncate", Err: err}
	}
	s.log.Warn("runstate: cut a torn last line from the ledger (a writer died mid-append; it was never acknowledged)",
		"ledger", s.path(ledgerFile), "offset", end, "bytes", size-end, "saved", aside)
	return nil
}

// Lock takes logs/ledger.lock, waiting as long as ctx allows.
func (s *dirStore) Lock(ctx context.Context, from Position) (Batch, error) {
	if err := s.waitLock(ctx, false); err != nil {
		return nil, err
	}
	return s.begin(from), nil
}

// TryLock takes logs/ledger.lock if no other process holds it.
func (s *dirStore) TryLock(from Position) (Batch, bool, error) {
	ok, err := s.lock.TryLock()
	if err != nil {
		return nil, false, fmt.Errorf("runstate: lock %s: %w", s.path(lockFile), err)
	}
	if !ok {
		return nil, false, nil
	}
	return s.begin(from), true, nil
}

// Read passes the ledger's lines after from, with the records a machine
// crash left only in logs/ledger.wal in their place (see store_file_wal.go). A store
// that is open reads through its own handle on the ledger.
func (s *dirStore) Read(ctx context.Context, from Position, fn func(line []byte) error) (int64, error) {
	c := chainAt(from)
	return s.readChecked(&c, func(_ *Record, line []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fn(line)
	})
}

// Live reports, for each session, whether its lock file leaves it
// possibly alive (alive, without a state to look in).
func (s *dirStore) Live(ctx context.Context, sessions []string) (map[string]bool, error) {
	live := make(map[string]bool, len(sessions))
	for _, id := range sessions {
		live[id] = s.aliveBy(id, nil)
	}
	return live, nil
}

// Close releases the session's lock and files. With clean (a close record
// was written) it first fdatasyncs the ledger, so that it alone holds every
// record whatever logs/ledger.wal holds, then removes the session's lock
// file and handoff files; without, it leaves the lock file unlocked, as a
// killed process would: a lock that can be taken proves the session gone
// (alive), a missing one does not.
func (s *dirStore) Close(clean bool) error {
	if s.use.stray() {
		return nil // a refused Open's: the store serves another Run
	}
	var err error
	if clean && s.ledger != nil && !s.opts.NoSync {
		if serr := s.ledger.Sync(); serr != nil {
			err = &WriteError{Path: s.path(ledgerFile), Op: "sync", Err: serr}
			clean = false
		}
	}
	if clean {
		s.handoff.remove(s)
	}
	if s.sesLock != nil {
		openHere.Delete(s.session)
		// Remove while holding the lock, so no other session sees the
		// file unlocked and takes it for a dead session's (Windows cannot
		// remove an open file; there the next Open cleans it up).
		if clean {
			_ = os.Remove(s.sesLock.Path())
		}
		s.sesLock.Unlock()
	}
	if s.ledger != nil {
		s.ledger.Close()
	}
	if s.wal.f != nil {
		s.wal.f.Close()
	}
	if s.dirFD != nil {
		s.dirFD.Close()
	}
	if s.lock != nil {
		s.lock.Close()
	}
	s.handoff.close()
	return err
}

// dirBatch is the file store's Batch: the ledger lock held by the Run's
// leader. Its methods are in store_file_batch.go.
type dirBatch struct {
	s     *dirStore
	from  chain  // where the Run was when it took the lock
	at    chain  // where Tail has read to (a field, so that it need not escape)
	lines []byte // what the leader's last Append wrote
	end   chain  // where that ends
	span  []byte // the ledger bytes the journal must take (wal.span)
	first bool   // the first batch of the session (Open's)
}

// reload reads the state again, from the snapshot and the ledger, after an
// append that did not land (the Run's reload).
func (s *dirStore) reload() (*state, error) {
	st, _, _, err := loadState(s.fs, s.abs, s.ledger)
	return st, err
}

// openError is the error of opening p, one of the run's files: the path
// once (err, an *fs.PathError of p, names it too) and, when this user may
// not open it, what to do.
// mkdirError is the error for a directory p that could not be created.
// What is in its way (a file where it should be) was refused, naming
// it, by guardOwnFiles.
func mkdirError(p string, err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) && pe.Path == p {
		err = pe.Err
	}
	switch {
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("runstate: cannot create %s: %w: run this as the user that owns the run directory, or give this user write access to it", p, err)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, fs.ErrExist):
		return fmt.Errorf("runstate: cannot create %s: %w: a file is in its way; move it away, then run again", p, err)
	}
	return fmt.Errorf("runstate: cannot create %s: %w (is the directory writable?)", p, err)
}

func openError(p string, err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) && pe.Path == p {
		err = pe.Err
	}
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("runstate: cannot open %s: %w: run this as the user that owns the run directory, or give this user write access to it", p, err)
	}
	return fmt.Errorf("runstate: cannot open %s: %w", p, err)
}
