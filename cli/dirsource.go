package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gofrs/flock"
	"github.com/runstate/runstate"
)

// dirSource is a run directory, read and written through the library's
// directory functions (runstate.Inspect, Open ...).
type dirSource struct {
	dir string
	// note prints a message on standard error (log -follow: the ledger
	// was replaced); nil prints nothing.
	note func(string)
	// tail: where ReadLedger stopped, for Follow.
	tail *ledgerFollower
}

func (d *dirSource) Name() string   { return d.dir }
func (d *dirSource) Ledger() string { return d.ledgerPath() }
func (d *dirSource) Close() error   { return nil }

func (d *dirSource) ledgerPath() string { return ledgerIn(d.dir) }

// ledgerIn is where dir keeps a run's records when it is a run directory:
// that file's presence tells a run directory from a working directory.
func ledgerIn(dir string) string { return filepath.Join(dir, "logs", "ledger.jsonl") }

// isFile says that path, given as a run directory, is a file, as the
// library says it to a writer (not as an error about path/logs not being
// a directory); a ledger's own path names its run directory. Nil when
// path is not a file (a directory, or nothing).
func isFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil || fi.IsDir() {
		return nil
	}
	msg := fmt.Sprintf("%s is a file, not a run directory: pass a directory", path)
	if logs := filepath.Dir(path); filepath.Base(path) == "ledger.jsonl" && filepath.Base(logs) == "logs" {
		msg += " (the run directory of this ledger is " + quoteArg(filepath.Dir(logs)) + ")"
	}
	return errors.New(msg)
}

// LastRecord is the ledger file's modification time: its last append's.
// A ledger that is not a regular file (a symbolic link, which the reads
// refuse, a directory) has none: the time of what it links to is not
// the run's.
func (d *dirSource) LastRecord(context.Context, int64) (time.Time, error) {
	fi, err := os.Lstat(d.ledgerPath())
	if err != nil {
		return time.Time{}, err
	}
	if !fi.Mode().IsRegular() {
		return time.Time{}, fmt.Errorf("%s is not a regular file", d.ledgerPath())
	}
	return fi.ModTime(), nil
}

func (d *dirSource) Inspect(context.Context) (*runstate.Status, error) {
	return runstate.Inspect(d.dir)
}

func (d *dirSource) NextSteps(context.Context) (string, error) {
	return runstate.NextSteps(d.dir)
}

func (d *dirSource) Handoff(context.Context) (string, string, error) {
	p := filepath.Join(d.dir, "logs", "next-steps.txt")
	data, err := readHandoff(p)
	return string(data), p, err
}

// maxHandoff is the most of logs/next-steps.txt that next reads. The page
// runstate writes is a few KiB (its lines are cut at 200 bytes, its lists
// at a few names), but for the run's revision and environment, which it
// shows whole, escaped: up to 4 MiB (the identity's limit) that escaping
// may make four times longer.
const maxHandoff = 32 << 20

// readHandoff reads the handoff file p, which must be a regular file (a
// FIFO would block, a device such as /dev/zero never end, and a device
// may act on open: one is not opened) of maxHandoff bytes at most, where
// it is: neither it nor the logs directory it is in may be a symbolic
// link, which the library's readers do not follow either (another run's
// handoff, or any file, would be shown as this run's).
func readHandoff(p string) ([]byte, error) {
	for _, q := range []string{filepath.Dir(p), p} {
		if fi, err := os.Lstat(q); err == nil && fi.Mode().Type()&fs.ModeSymlink != 0 {
			to, _ := os.Readlink(q)
			return nil, fmt.Errorf("%s is a symbolic link (to %q), which runstate does not follow: replace the link with what it points to", filepath.Base(q), to)
		}
	}
	if fi, err := os.Stat(p); err == nil && !fi.Mode().IsRegular() {
		return nil, notRegular(fi)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|oNonblock|oNoFollow, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(fi)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxHandoff+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxHandoff {
		return nil, fmt.Errorf("it is more than %d bytes, more than any handoff runstate writes", maxHandoff)
	}
	return data, nil
}

// notRegular says what fi, not a regular file, is.
func notRegular(fi fs.FileInfo) error {
	if kind := fileKind(fi.Mode()); kind != "" {
		return errors.New("it is " + kind + ", not a regular file")
	}
	return errors.New("it is not a regular file")
}

// fileKind names the kind of a file that is not a regular one: "" when
// it has no other name.
func fileKind(m fs.FileMode) string {
	switch t := m.Type(); {
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case t&(fs.ModeDevice|fs.ModeCharDevice) != 0:
		return "a device"
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeSocket != 0:
		return "a socket"
	}
	return ""
}

// ReadLedger reads the ledger as runstate.ReadLedger does (the records a
// machine crash left only in logs/ledger.wal included), through the
// ledgerFollower that Follow goes on with: from the file read here, after
// its last record, without reading it again.
func (d *dirSource) ReadLedger(ctx context.Context, fn func(*runstate.Record) error) error {
	d.tail = d.newFollower()
	return d.tail.start(ctx, 0, fn)
}

func (d *dirSource) Verify(context.Context) (*runstate.Report, error) {
	return runstate.Verify(d.dir)
}

func (d *dirSource) VerifyChecks() string {
	return "every artifact matches its hash, manifest.json and logs/next-steps.txt are current"
}

func (d *dirSource) Open(_ context.Context, opts *runstate.Options) (*runstate.Run, error) {
	return runstate.Open(d.dir, opts)
}

// Alive tells whether each session's process still holds its lock file in
// logs/sessions. It only tries a shared lock on files that exist: it
// creates and writes nothing.
func (d *dirSource) Alive(_ context.Context, sessions []string) map[string]bool {
	alive := make(map[string]bool, len(sessions))
	for _, id := range sessions {
		alive[id] = sessionAlive(d.dir, id)
	}
	return alive
}

func sessionAlive(dir, id string) bool {
	alive, err := sessionLock(dir, id)
	return alive || err != nil // cannot tell: assume alive, the safe side
}

// sessionLock tells whether the lock file of session id in dir's
// logs/sessions is held; err says why it cannot tell (the file cannot be
// opened: another user's, say). A session without a lock file is gone.
func sessionLock(dir, id string) (alive bool, err error) {
	if strings.ContainsAny(id, `/\`) || id == "." || id == ".." {
		return false, nil
	}
	p := filepath.Join(dir, "logs", "sessions", id+".lock")
	if _, err := os.Stat(p); err != nil {
		return false, nil
	}
	ok, err := tryRLock(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil && !ok, err
}

// tryRLock tries a shared lock on the lock file at p, which it does not
// create, and releases it at once: ok when it got it. A variable for
// tests.
var tryRLock = func(p string) (ok bool, err error) {
	// No O_CREATE; O_NONBLOCK: a FIFO put there must not block the open;
	// O_NOFOLLOW: a symbolic link's target (a device that acts on open)
	// is not opened, and tells nothing.
	l := flock.New(p, flock.SetFlag(os.O_RDONLY|oNonblock|oNoFollow))
	ok, err = l.TryRLock()
	if ok {
		l.Unlock()
	}
	return ok, err
}

// Unsure says, for each of sessions whose lock file Alive could not try
// (it took them for alive, the safe side), why.
func (d *dirSource) Unsure(sessions []string) map[string]error {
	why := map[string]error{}
	for _, id := range sessions {
		if _, err := sessionLock(d.dir, id); err != nil {
			why[id] = err
		}
	}
	return why
}

// Export copies the ledger's complete lines as the library reads them
// (the file store's Read, as Inspect and ReadLedger read): each checked
// against the chain, a torn last line (no '\n') left out, and the records
// that a machine crash left only in logs/ledger.wal (acknowledged, but
// not yet in logs/ledger.jsonl) in their place: the journal holds the
// ledger's very bytes.
func (d *dirSource) Export(ctx context.Context, w io.Writer) (int64, error) {
	if _, err := os.Stat(d.ledgerPath()); err != nil {
		return 0, fmt.Errorf("%s is not a run directory: %w", d.dir, err)
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	var n int64
	_, err := runstate.NewFileStore(d.dir, nil).Read(ctx, runstate.Position{}, func(line []byte) error {
		if _, err := bw.Write(line); err != nil {
			return err
		}
		n++
		return bw.WriteByte('\n')
	})
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	return n, err // after damage: the lines before it
}

// pollEvery is how often Follow reads the ledger again.
const pollEvery = 100 * time.Millisecond

// Follow reads the ledger every pollEvery from the last record shown on,
// as the library reads it (the file store's Read: each line checked
// against the chain; a last line without its '\n' waited on, a write in
// progress or a torn tail the next writer cuts; the records a machine
// crash left only in logs/ledger.wal in their place, until the next
// session copies them back). The ledger is opened anew each time, by its
// path: a file renamed over it (a backup restored, an edit with sed -i) is
// noticed, and followed when it holds the records already shown (found by
// seq, each line's hash the same); when it does not, or the ledger was
// cut below them or removed, Follow says so and stops.
func (d *dirSource) Follow(ctx context.Context, after int64, fn func(*runstate.Record) error) error {
	f := d.tail
	if f == nil || f.seq != after {
		f = d.newFollower()
		if err := f.start(ctx, after, fn); err != nil {
			return err
		}
		if f.seq < after {
			return fmt.Errorf("runstate: %s ends at seq %d now, before seq %d already shown: it was cut or replaced meanwhile; run 'runstate log %s' again", f.path, f.seq, after, quoteArg(f.dir))
		}
	}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := f.poll(ctx, fn); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

func (d *dirSource) newFollower() *ledgerFollower {
	return &ledgerFollower{dir: d.dir, path: d.ledgerPath(), store: runstate.NewFileStore(d.dir, nil), note: d.note}
}

// ledgerFollower reads a run directory's ledger for ReadLedger and
// Follow: seq, end, last and crc say where the last record read is (its
// position), file is the ledger file it was read from (as it was before
// the read).
type ledgerFollower struct {
	dir, path string
	store     runstate.Store // not opened: Read only
	note      func(string)   // a message for standard error; nil: none
	seq, end  int64          // the last record's seq; the bytes up to its end
	last      []byte         // its line, without '\n' (hashed when needed)
	crc       bool           // it has a crc field
	file      os.FileInfo
}

// position is where the last record read ends, for Read.
func (f *ledgerFollower) position() runstate.Position {
	if f.seq == 0 {
		return runstate.Position{}
	}
	return runstate.Position{Seq: f.seq, Hash: lineHash(f.last), End: f.end, LastLen: int64(len(f.last)) + 1, CRC: f.crc}
}

// say prints s on standard error, if there is one.
func (f *ledgerFollower) say(s string) {
	if f.note != nil {
		f.note(s)
	}
}

// statNow is os.Stat with the file's identity (for os.SameFile) read
// now: on Windows os.Stat leaves it to the first os.SameFile, which reads
// it by the path, and would then find the file renamed over it since.
func statNow(p string) (os.FileInfo, error) {
	fi, err := os.Stat(p)
	if err == nil {
		_ = os.SameFile(fi, fi)
	}
	return fi, err
}

// errFound stops a Read at the record searched for.
var errFound = errors.New("found")

// start reads the ledger through seq after, showing (fn) the records
// after it that were appended since.
func (f *ledgerFollower) start(ctx context.Context, after int64, fn func(*runstate.Record) error) error {
	fi, err := statNow(f.path)
	if err != nil {
		return fmt.Errorf("%s is not a run directory: %w", f.dir, err)
	}
	f.file = fi
	return f.read(ctx, func(r *runstate.Record) error {
		if r.Seq <= after {
			return nil
		}
		return fn(r)
	})
}

// read reads the ledger on from the last record read, passing each
// record to fn and moving past it.
func (f *ledgerFollower) read(ctx context.Context, fn func(*runstate.Record) error) error {
	_, err := f.store.Read(ctx, f.position(), func(line []byte) error {
		r, crc, err := runstate.DecodeLine(line)
		if err != nil {
			return err // cannot be: Read checked the line
		}
		f.seq, f.end, f.crc = r.Seq, f.end+int64(len(line))+1, crc
		f.last = append(f.last[:0], line...)
		return fn(r)
	})
	return err
}

// poll shows what was appended since the last call, after checking that
// the ledger is still the file read last, or holds the records shown.
func (f *ledgerFollower) poll(ctx context.Context, fn func(*runstate.Record) error) error {
	fi, err := statNow(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("runstate: %s is gone (removed, or moved away) after seq %d was shown; run 'runstate log %s' again when the run has its ledger back", f.path, f.seq, quoteArg(f.dir))
	}
	if err != nil {
		return fmt.Errorf("runstate: stat %s: %w", f.path, err)
	}
	if !os.SameFile(fi, f.file) {
		return f.replaced(ctx, fi, fn)
	}
	if size := fi.Size(); size < f.file.Size() && size < f.end {
		// Below the records shown (a torn tail cut is not: it is after
		// them). A ledger shorter than what was shown before it shrank
		// is one whose last records the journal held (a machine crash):
		// only a cut makes it shorter still.
		return fmt.Errorf("runstate: %s shrank to %d bytes, below the %d already shown: it was cut (runstate repair -truncate-at?); run 'runstate log %s' again", f.path, size, f.end, quoteArg(f.dir))
	}
	if fi.Size() == f.file.Size() && fi.ModTime().Equal(f.file.ModTime()) {
		// Nothing appended since the last read: a torn tail is not
		// scanned again. (Only a torn tail cut and a record of its very
		// length appended within one tick of a coarse clock hides here,
		// until the next append.)
		return nil
	}
	f.file = fi
	err = f.read(ctx, fn)
	if err != nil && !errors.Is(err, ctx.Err()) {
		// A file renamed over the ledger during the read, whose line
		// after the last shown does not continue the chain, is not
		// damage of the ledger shown.
		if now, serr := statNow(f.path); serr == nil && !os.SameFile(now, f.file) {
			return f.replaced(ctx, now, fn)
		}
	}
	return err
}

// replaced follows the file fi, renamed over the ledger since the last
// poll, when it holds the records shown (the same seq, the same hash):
// from the record after the last shown. Otherwise it says what happened.
func (f *ledgerFollower) replaced(ctx context.Context, fi os.FileInfo, fn func(*runstate.Record) error) error {
	shown := f.position()
	what := fmt.Sprintf("runstate: %s was replaced by another file (one renamed over it: a backup restored, an edit with sed -i or an editor?)", f.path)
	f.seq, f.end, f.last, f.crc, f.file = 0, 0, nil, false, fi
	if shown.Seq == 0 {
		f.say(what + ": following it")
		return f.read(ctx, fn)
	}
	err := f.read(ctx, func(r *runstate.Record) error {
		if r.Seq == shown.Seq {
			return errFound
		}
		return nil
	})
	again := fmt.Sprintf("run 'runstate log %s' to read it, 'runstate verify %s' to check it", quoteArg(f.dir), quoteArg(f.dir))
	switch {
	case errors.Is(err, errFound) && lineHash(f.last) == shown.Hash:
		f.say(fmt.Sprintf("%s; it holds the %d records shown: following it", what, shown.Seq))
		return f.read(ctx, fn)
	case errors.Is(err, errFound):
		return fmt.Errorf("%s, whose seq %d is not the record shown as seq %d (the records differ there or before): its records are not shown; %s", what, shown.Seq, shown.Seq, again)
	case err == nil:
		return fmt.Errorf("%s that ends at seq %d, before seq %d already shown: its records are not shown; %s", what, f.seq, shown.Seq, again)
	case ctx.Err() != nil:
		return err
	default:
		return fmt.Errorf("%s, which does not read through seq %d already shown: %w", what, shown.Seq, err)
	}
}
