package pgstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
)

// handoffEvery is how often, at most, a session writes the handoff text
// to the projections row.
const handoffEvery = time.Second

// published holds the projections a session was given and has not
// written yet (Batch.Publish), the newest of each. They go into the
// database with the next batch's commit (queuePublish), or, when no batch
// commits them in time (an idle session), by a transaction of their own
// (writeKept): the handoff within viewsEvery after it is due
// (handoffEvery after its last write), a manifest as soon. A large
// manifest (largeManifest) always goes by a transaction of its own, the
// idle write's (or a clean Close's), at most every largePace times its
// last write's time (take). Safe for concurrent use.
type published struct {
	mu       sync.Mutex
	manifest *projection
	handoff  *projection
	wrote    time.Time // the handoff's last write
	// views, once set (ViewWorkDir), writes them in the working
	// directory too; last are the newest given before, for it to begin with.
	views                  *views
	lastManifest, lastHand *projection

	given time.Time // the last handoff given: the views' pace (due)
	gave  int       // handoffs given (tests)
	// write, once set (DB.Store), writes what is kept in a transaction of
	// its own (store.writeKept); idle, when armed, calls it; closed: no
	// more (close); idling: the idle write armed or under way.
	write  func()
	idle   *time.Timer
	closed bool
	idling sync.WaitGroup
	// own: a write of its own is under way; a batch's commit leaves the
	// projections row to it meanwhile (take). large: the size from which a
	// manifest goes by a write of its own (largeManifest; tests lower
	// it); largeAfter: when the next such manifest may be written, and
	// largeCost: how long the last one took.
	own        bool
	large      int
	largeAfter time.Time
	largeCost  time.Duration
	size       int // the last manifest's (due)
}

// largeManifest is the size from which a manifest is written by a
// transaction of its own, in the background and paced, instead of in the
// commit of the next batch: a manifest is O(stages) (about 700 bytes a
// stage with an output), and the batch that carried one waits for it.
// On the development server a batch of 8 goroutines' completes that
// carried the 1.85 MB manifest of 2,600 stages took 43 ms instead of
// 1-2 ms, every second, and 8 goroutines on one run made 854-1,300
// checkpoints a second over 12,000 stages instead of 3,100 without it
// (2026-12-06). Below it the manifest costs a batch little (about 20 µs a
// KiB stored) and saves a transaction.
const largeManifest = 16 << 10

// largePace is how many times its own write's time a large manifest
// waits before the next is written: each costs the server (compression,
// TOAST, WAL) about in proportion to its size, so writes of it take at
// most about 2% of the time, as the Run paces its renders
// (Options.ManifestInterval).
const largePace = 50

type projection struct {
	at   runstate.Position
	data []byte
}

func (p *published) keep(at runstate.Position, manifest, handoff []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.manifest = newest(p.manifest, at, manifest)
	p.handoff = newest(p.handoff, at, handoff)
	if manifest != nil {
		p.size = len(manifest)
	}
	if handoff != nil {
		p.given = time.Now()
		p.gave++
	}
	p.armLocked()
	if p.views != nil {
		p.views.keep(at, manifest, handoff)
		return
	}
	p.lastManifest = newest(p.lastManifest, at, manifest)
	p.lastHand = newest(p.lastHand, at, handoff)
}

// armLocked arms the write of what is kept when no batch's commit takes
// it first: viewsEvery after the handoff is due (handoffEvery after its
// last write), so that a busy session's commits take it first. The caller
// holds mu.
func (p *published) armLocked() {
	if p.write == nil || p.closed || p.idle != nil || (p.manifest == nil && p.handoff == nil) {
		return
	}
	wait := viewsEvery + max(0, handoffEvery-time.Since(p.wrote))
	if p.handoff == nil && p.manifest != nil && p.isLarge(p.manifest) {
		wait = max(viewsEvery, time.Until(p.largeAfter)) // the manifest alone, when its pace allows
	}
	p.idling.Add(1)
	p.idle = time.AfterFunc(wait, func() {
		defer p.idling.Done()
		p.mu.Lock()
		p.idle = nil
		closed := p.closed
		p.mu.Unlock()
		if !closed {
			p.write()
		}
		p.mu.Lock()
		p.armLocked() // a handoff not due yet: when it is
		p.mu.Unlock()
	})
}

// due reports whether a manifest and a handoff given now would be
// written soon (PublishDue): a manifest unless the last was large and
// the pace of large ones (largeAfter) does not allow the next yet; a
// handoff at most every handoffEvery into the database, every viewsEvery
// into the working directory's views.
func (p *published) due(now time.Time) (manifest, handoff bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	manifest = p.size <= p.limit() || !now.Before(p.largeAfter)
	return manifest, now.Sub(p.wrote) >= handoffEvery || p.views != nil && now.Sub(p.given) >= viewsEvery
}

// close ends the writes of its own (a clean Close writes what is left:
// store.Close) and the working directory's views (their last write when
// clean), waiting for a write under way.
func (p *published) close(clean bool) {
	p.mu.Lock()
	p.closed = true
	if p.idle != nil && p.idle.Stop() {
		p.idling.Done()
	}
	p.idle = nil
	v := p.views
	p.mu.Unlock()
	p.idling.Wait()
	v.close(clean)
}

// PublishDue is runstate.Pacer: the Run renders the handoff only when a
// write of it is due (published.due), so that a session that completes a
// stage a millisecond renders it about twenty times a second, not a
// thousand; a manifest is written whenever the Run gives one (at most
// every Options.ManifestInterval, on a record), but a large one only at
// its pace (largePace), and the Run renders none before that. A handoff
// the Run skips it renders when its handoff timer (every 50 ms while the
// handoff lags) finds one due: the working directory's handoff lags its session's
// records by at most about two viewsEvery, the database's by about
// handoffEvery. Safe for concurrent use.
func (s *store) PublishDue() (manifest, handoff bool) {
	return s.pub.due(time.Now())
}

var (
	_ runstate.Pacer          = (*store)(nil)
	_ runstate.WorkDirChecker = (*store)(nil)
)

// writeKept writes the projections kept and due (all: every one kept) in
// a transaction of their own, with synchronous_commit off, best effort
// (newest seq wins: it takes no run lock): the idle write
// (published.armLocked), and a clean Close's. Like a bet of projections
// only, it is an implicit transaction (the pipeline's Sync commits it),
// with betLazySQL.
//
// It is also how a large manifest is written (published.take leaves it
// to this write). One runs at a time: another that finds one under way
// returns, leaving what it would take to that one, to a batch or to the
// next idle write.
func (s *store) writeKept(all bool) {
	p := &s.pub
	if !p.startOwn() {
		return
	}
	start := time.Now()
	s.mu.Lock()
	runID := s.runID
	s.mu.Unlock()
	var pb pgx.Batch
	large := s.queuePublish(&pb, runID, all, false)
	if pb.Len() > 0 {
		pb.Queue(betLazySQL)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = s.db.pool.SendBatch(ctx, &pb).Close()
		cancel()
	}
	p.endOwn(large, start)
}

// ViewWorkDir starts the working directory's views (runstate.WorkDirViewer):
// OpenStore calls it once the session's open record is committed, whether
// the Run was opened by DB.Open or by runstate.OpenStore(db.Store(name),
// dir, opts), so that both leave the same working directory. It writes
// logs/run.json at once (no fsync: a view) and the projections of the
// open batch within viewsEvery. Safe for concurrent use with Publish.
func (s *store) ViewWorkDir(dir, runID string) error {
	v, err := newViews(dir)
	if err != nil {
		return err
	}
	p := &s.pub
	p.mu.Lock()
	if p.views != nil {
		p.mu.Unlock()
		v.close(false)
		return fmt.Errorf("pgstore: run %s: the working directory's views are already started", s.name)
	}
	p.views = v
	if m := p.lastManifest; m != nil {
		v.keep(m.at, m.data, nil)
	}
	if h := p.lastHand; h != nil {
		v.keep(h.at, nil, h.data)
	}
	p.lastManifest, p.lastHand = nil, nil
	p.mu.Unlock()
	// Best effort, as the other views: the run is open either way.
	_ = v.writeRun(runJSON{Store: "postgres", Address: s.db.Address(s.name), Schema: s.db.schema, Run: s.name, ID: runID})
	return nil
}

// CheckWorkDir refuses (runstate.WorkDirChecker), before the session
// records anything, a working directory whose logs/run.json names
// another run: by name or schema (what DB.Open checks before it opens the
// run, checked here again for runstate.OpenStore(db.Store(name), dir,
// opts)), or by id, as when the run was made again under its name; runID
// is "" for a run this session is about to create, which no directory
// can name yet. Two runs in one directory would mix their outputs and
// views.
func (s *store) CheckWorkDir(dir, runID string) error {
	return checkWorkDir(dir, s.db.schema, s.name, &runID)
}

// CheckWorkDir refuses, without connecting, a working directory that
// DB.Open refuses for the run named run in schema (DefaultSchema when
// empty) before it opens the run: a run directory (logs/ledger.jsonl), a
// logs or logs/tmp that is a symbolic link or no directory, a
// logs/run.json that is no regular file, or one that names another run
// (by name or schema), each with an error that says what to do. It reads
// the directory and writes nothing. A program about to create a schema
// with Connect only to have Open refuse the directory calls it first.
// Safe for concurrent use.
func CheckWorkDir(workDir, schema, run string) error {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := checkRunName(run); err != nil {
		return err
	}
	return checkWorkDir(workDir, schema, run, nil)
}

// checkWorkDir refuses a working directory whose logs/run.json names a
// run other than run in schema, or, when runID is not nil, this run with
// another id than *runID ("": a run not yet created). DB.Open checks the
// name alone (runID nil) before it opens the run, so that a refused one
// records nothing, not even its runs row. A run directory (it holds a
// logs/ledger.jsonl) is refused too: the views would overwrite its own
// logs/next-steps.txt and manifest.json; and so are a logs or logs/tmp
// that is a symbolic link or no directory (ErrInvalid).
func checkWorkDir(dir, schema, run string, runID *string) error {
	for _, rel := range []string{"logs", "logs/tmp"} {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
		case fi.Mode()&fs.ModeSymlink != 0:
			to, _ := os.Readlink(p)
			return fmt.Errorf("%w: pgstore: %s is a symbolic link (to %q): the run's files in its working directory stay in it; replace the link with a directory, then run again", runstate.ErrInvalid, p, to)
		case !fi.IsDir():
			return fmt.Errorf("%w: pgstore: %s is %s, not a directory: move it away, then run again", runstate.ErrInvalid, p, kind(fi.Mode()))
		}
	}
	if ledger := filepath.Join(dir, "logs", "ledger.jsonl"); exists(ledger) {
		return fmt.Errorf("%w: pgstore: %s is a run directory, not a working directory: %s holds the records of a run kept in files, whose logs/next-steps.txt and manifest.json the views of run %q in schema %s would overwrite; give that run a working directory of its own",
			runstate.ErrMismatch, dir, ledger, run, schema)
	}
	rj, path, err := workDirRun(dir)
	switch {
	case err != nil:
		return err
	case rj.Run != "" && (rj.Run != run || rj.Schema != schema):
		return otherRun(dir, path, rj, fmt.Sprintf("this run is %q in schema %s", run, schema))
	case runID == nil || rj.ID == "" || rj.ID == *runID:
		return nil
	case *runID == "":
		return otherRun(dir, path, rj, "this run is not in the database yet (it would be created anew under its name, with another id)")
	}
	return otherRun(dir, path, rj, "this run's id is "+*runID)
}

// otherRun is the error for a working directory dir whose logs/run.json
// (path) names the run rj, not this one.
func otherRun(dir, path string, rj runJSON, this string) error {
	return fmt.Errorf("%w: pgstore: %s is the working directory of another run: %s names run %q (id %s) at %s; %s: give each run a working directory of its own (or, if that run is done with, remove %s)",
		runstate.ErrMismatch, dir, path, rj.Run, rj.ID, rj.Address, this, path)
}

// kind names what a file of mode m is, for messages.
func kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&(fs.ModeDevice|fs.ModeCharDevice) != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return "not a regular file"
}

// exists tells whether path names a file of any kind (a symbolic link
// is not followed).
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// workDirRun reads dir's logs/run.json (path, runstate.ReadWorkDirFile):
// the zero runJSON when there is none, or it cannot be read (writeRun
// says why) or read as one (the views rewrite it); an error when it is no
// regular file (a FIFO: opened without blocking, never read), as Open
// refuses one in a run directory.
func workDirRun(dir string) (rj runJSON, path string, err error) {
	path = filepath.Join(dir, filepath.FromSlash(runstate.WorkDirFile))
	data, err := runstate.ReadWorkDirFile(dir)
	if errors.Is(err, runstate.ErrInvalid) {
		return rj, path, fmt.Errorf("pgstore: %w: it is where pgstore names the run of the working directory %s; remove it, or give the run another working directory", err, dir)
	}
	if err != nil || json.Unmarshal(data, &rj) != nil {
		return runJSON{}, path, nil
	}
	return rj, path, nil
}

// newest is data at at, unless it is nil or cur is newer.
func newest(cur *projection, at runstate.Position, data []byte) *projection {
	if data == nil || cur != nil && cur.at.Seq > at.Seq {
		return cur
	}
	return &projection{at: at, data: data}
}

// take returns what is due, for a batch's commit (inline) or for a write
// of its own: the manifest whenever there is one, the handoff once
// handoffEvery has passed since its last write; with all (a clean
// Close's write), everything kept.
//
// A large manifest (isLarge) never goes with a batch: take leaves it
// kept for a write of its own (the idle write: armLocked), and while such
// a write is under way (own) it returns nothing to any batch, leaving the
// handoff to it too: a batch whose statement waited for the projections
// row behind a large manifest's would wait as long as if it carried it.
// A write of its own takes a large manifest only when its pace allows
// (largeAfter), or all.
func (p *published) take(now time.Time, all, inline bool) (manifest, handoff *projection) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if inline && p.own {
		return nil, nil
	}
	if m := p.manifest; m != nil {
		switch {
		case !p.isLarge(m) || all:
			manifest, p.manifest = m, nil
		case !inline && !now.Before(p.largeAfter):
			manifest, p.manifest = m, nil
		}
		// A batch leaves a large one kept: the idle write takes it
		// (viewsEvery or more later, on a pool connection the batch no
		// longer holds), or a clean Close's. A write started beside the
		// batch needed a second pool connection: a one-shot process (the
		// runstate command) had to start one, 16-25 ms here, and its
		// Close waited for it.
	}
	if p.handoff != nil && (all || now.Sub(p.wrote) >= handoffEvery) {
		handoff, p.handoff, p.wrote = p.handoff, nil, now
	}
	return manifest, handoff
}

// largeOne is isLarge for a caller that does not hold mu.
func (p *published) largeOne(m *projection) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.isLarge(m)
}

// isLarge reports whether m is a manifest that goes by a write of its
// own (largeManifest). The caller holds mu.
func (p *published) isLarge(m *projection) bool { return len(m.data) > p.limit() }

// limit is the size from which a manifest is large (largeManifest, or
// large in tests). The caller holds mu.
func (p *published) limit() int {
	if p.large > 0 {
		return p.large
	}
	return largeManifest
}

// startOwn notes that a write of its own begins, unless one is under way
// already, and reports whether it did.
func (p *published) startOwn() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.own {
		return false
	}
	p.own = true
	return true
}

// endOwn notes that a write of its own ended; large: it wrote a large
// manifest, from start, so the next waits largePace times as long.
func (p *published) endOwn(large bool, start time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.own = false
	if large {
		now := time.Now()
		p.largeCost = now.Sub(start)
		p.largeAfter = now.Add(largePace * p.largeCost)
	}
}

// Address is the run's address for the runstate command (DB.Address):
// the handoff's commands name the run by it (runstate.Addresser).
func (s *store) Address() string { return s.db.Address(s.name) }

// LookAt is the handoff's "look at:" paragraph for a run in the database:
// its records, and each machine's local view (views).
//
// On a server that runs with fsync=off it warns first: no record there is
// durable, whatever pgstore does (such a server is fine for tests, and
// pgstore does not refuse it).
func (s *store) LookAt() []string {
	look := []string{
		fmt.Sprintf("table %s.records, run %s (the source of truth, one ledger line a row; runstate export writes a logs/ledger.jsonl)", s.db.schema, s.name),
		"logs/next-steps.txt, manifest.json in a machine's working directory: that session's view, as of the seq they name",
	}
	if s.db.fsyncOff {
		look = append([]string{"WARNING: the server runs with fsync=off: no record is safe from a power loss or an operating system crash there (set fsync=on for runs that matter)"}, look...)
	}
	return look
}

// The files views writes in a working directory, relative to it.
const (
	viewHandoff  = "logs/next-steps.txt"
	viewManifest = "manifest.json"
	viewRun      = runstate.WorkDirFile
	viewTmp      = "logs/tmp" // the temp files, view-*, renamed over those
)

// viewsEvery is how long, at most, a working directory's view lags what
// its session published (and what it waits between two writes, so that a
// burst of batches costs one write).
const viewsEvery = 50 * time.Millisecond

// views writes this machine's view of the run into its working directory,
// as a run directory has it: logs/next-steps.txt and manifest.json, the
// newest that the session published (Batch.Publish), and logs/run.json,
// which says where the run is (runJSON). They are projections of the
// records the session has seen, each naming the seq it reflects; nothing
// reads them back (Open resumes from the database's projection), so a lost
// or stale one costs nothing but a look. A timer's goroutine writes them,
// each through a temp file in logs/tmp and a rename, never a batch: within
// viewsEvery of a Publish, and at a clean Close (the close record's). In a
// directory that several sessions share, the newest seq wins (best
// effort). The paths go through an os.Root of the directory. Safe for
// concurrent use.
type views struct {
	root *os.Root

	mu       sync.Mutex
	manifest *projection // not yet written
	handoff  *projection
	wrote    time.Time   // the last write
	timer    *time.Timer // armed: a write is due
	closed   bool
	writing  sync.WaitGroup // a timer's write under way
	write    sync.Mutex     // one write at a time
}

// newViews opens the working directory dir (which exists) for a session's
// views, and removes the temp files that a killed write left there.
func newViews(dir string) (*views, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("pgstore: open the working directory %s: %w", dir, err)
	}
	v := &views{root: root}
	if err := root.MkdirAll(viewTmp, 0o755); err != nil {
		root.Close()
		return nil, fmt.Errorf("pgstore: create %s: %w", filepath.Join(dir, viewTmp), err)
	}
	if ents, err := fs.ReadDir(root.FS(), viewTmp); err == nil {
		for _, e := range ents {
			// A write takes microseconds: a minute-old temp file is a
			// killed write's, not another session's in this directory.
			if info, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), "view-") && time.Since(info.ModTime()) > time.Minute {
				_ = root.Remove(viewTmp + "/" + e.Name())
			}
		}
	}
	return v, nil
}

// keep takes the newest projections (nil: unchanged) and arms the write.
func (v *views) keep(at runstate.Position, manifest, handoff []byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return
	}
	v.manifest = newest(v.manifest, at, manifest)
	v.handoff = newest(v.handoff, at, handoff)
	if v.timer == nil && (v.manifest != nil || v.handoff != nil) {
		v.writing.Add(1)
		v.timer = time.AfterFunc(max(0, viewsEvery-time.Since(v.wrote)), func() {
			defer v.writing.Done()
			v.flush()
		})
	}
}

// flush writes what is due.
func (v *views) flush() {
	v.write.Lock()
	defer v.write.Unlock()
	v.mu.Lock()
	m, h := v.manifest, v.handoff
	v.manifest, v.handoff, v.timer = nil, nil, nil
	v.mu.Unlock()
	if (h != nil || m != nil) && v.ahead(max(seqOf(h), seqOf(m))) {
		h, m = nil, nil // another session in this directory wrote a newer view
	}
	// Best effort, as Batch.Publish: a view that cannot be written (a
	// full disk) is left as it was; the next one tries again.
	if h != nil {
		_ = v.put(viewHandoff, h.data)
	}
	if m != nil {
		_ = v.put(viewManifest, m.data)
	}
	v.mu.Lock()
	v.wrote = time.Now()
	v.mu.Unlock()
}

func seqOf(p *projection) int64 {
	if p == nil {
		return 0
	}
	return p.at.Seq
}

// ahead reports whether the directory's handoff names a seq after seq:
// another session that shares the directory wrote it, and its view is
// newer (newest seq wins, best effort: two writers may still cross).
func (v *views) ahead(seq int64) bool {
	f, err := v.root.Open(viewHandoff)
	if err != nil {
		return false
	}
	defer f.Close()
	var buf [160]byte
	n, _ := io.ReadFull(f, buf[:])
	line, _, _ := strings.Cut(string(buf[:n]), "\n")
	_, after, ok := strings.Cut(line, "as of ledger seq ")
	if !ok {
		return false
	}
	num, _, _ := strings.Cut(after, " ")
	on, err := strconv.ParseInt(num, 10, 64)
	return err == nil && on > seq
}

// put replaces the file rel with data: a temp file, then a rename.
func (v *views) put(rel string, data []byte) error {
	tmp := viewTmp + "/view-" + randomName()
	f, err := v.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("pgstore: write %s: %w", filepath.Join(v.root.Name(), rel), err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = v.root.Rename(tmp, rel)
	}
	if err != nil {
		_ = v.root.Remove(tmp)
		return fmt.Errorf("pgstore: write %s: %w", filepath.Join(v.root.Name(), rel), err)
	}
	return nil
}

// close writes what is left when clean (the session's last view) and
// ends the views; without clean, as a killed process, it writes nothing
// more. It waits for a write under way. Idempotent.
func (v *views) close(clean bool) {
	if v == nil {
		return
	}
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return
	}
	v.closed = true
	if v.timer != nil && v.timer.Stop() {
		v.writing.Done()
	}
	v.timer = nil
	v.mu.Unlock()
	v.writing.Wait()
	if clean {
		v.flush()
	}
	v.root.Close()
}

// runJSON is logs/run.json: where the run of a working directory is, for
// a person and for the runstate command (runstate status DIR reads the run
// at Address). No credentials: Address has no password.
type runJSON struct {
	Store   string `json:"store"` // "postgres"
	Address string `json:"address"`
	Schema  string `json:"schema"`
	Run     string `json:"run"`
	ID      string `json:"id"` // the run's id (its create record's)
}

// writeRun writes logs/run.json.
func (v *views) writeRun(rj runJSON) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the address's & as it is, for cat
	enc.SetIndent("", "  ")
	if err := enc.Encode(rj); err != nil {
		return err
	}
	v.write.Lock()
	defer v.write.Unlock()
	return v.put(viewRun, buf.Bytes())
}

func randomName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
