package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gofrs/flock"
	"github.com/runstate/runstate"
)

// dirSource is a run directory, read and written through the library's
// directory functions (runstate.Inspect, Open ...).
type dirSource struct{ dir string }

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
func (d *dirSource) LastRecord(context.Context, int64) (time.Time, error) {
	fi, err := os.Stat(d.ledgerPath())
	if err != nil {
		return time.Time{}, err
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
	data, err := os.ReadFile(p)
	return string(data), p, err
}

func (d *dirSource) ReadLedger(_ context.Context, fn func(*runstate.Record) error) error {
	if _, err := os.Stat(d.ledgerPath()); err != nil {
		return fmt.Errorf("%s is not a run directory: %w", d.dir, err)
	}
	return runstate.ReadLedger(d.dir, fn)
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
	l := flock.New(p, flock.SetFlag(os.O_RDONLY)) // no O_CREATE
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

// Export copies the ledger's complete lines, each checked against the
// chain; a torn last line (no '\n') is left out, as every reader leaves
// it out.
func (d *dirSource) Export(_ context.Context, w io.Writer) (int64, error) {
	p := d.ledgerPath()
	f, err := os.Open(p)
	if err != nil {
		return 0, fmt.Errorf("%s is not a run directory: %w", d.dir, err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 256<<10)
	bw := bufio.NewWriterSize(w, 256<<10)
	var c Chain
	var off int64
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			var rest []byte
			rest, err = br.ReadBytes('\n')
			line = append(append([]byte(nil), line...), rest...)
		}
		if errors.Is(err, io.EOF) {
			return c.Seq, bw.Flush() // a torn tail, if any, is not a record
		}
		if err != nil {
			return c.Seq, fmt.Errorf("runstate: read %s: %w", p, err)
		}
		if _, err := c.Next(line[:len(line)-1]); err != nil {
			bw.Flush() // the lines that checked out
			return c.Seq, fmt.Errorf("runstate: %s line %d (byte %d): %v: the ledger is damaged; run 'runstate verify %s'", p, c.Seq+1, off, err, quoteArg(d.dir))
		}
		if _, err := bw.Write(line); err != nil {
			return c.Seq, err
		}
		off += int64(len(line))
	}
}

// pollEvery is how often Follow looks at the ledger's size.
const pollEvery = 100 * time.Millisecond

// Follow polls the ledger file's size every pollEvery.
func (d *dirSource) Follow(ctx context.Context, after int64, fn func(*runstate.Record) error) error {
	t, err := newTail(d.ledgerPath(), after)
	if err != nil {
		return err
	}
	t.dir = d.dir
	defer t.f.Close()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		if err := t.poll(fn); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// tail follows a ledger as writers append to it. It checks that each new
// record continues the chain (seq + 1, prev = hash of the line before),
// and waits on a last line without its '\n': that is a write in progress,
// or a torn tail the next writer cuts. A bad line that ends in '\n' is
// damage, and stops it.
type tail struct {
	f      *os.File
	path   string
	dir    string // the run directory, for advice
	chain  Chain  // the last record shown
	offset int64  // just past its '\n'
}

// newTail starts after line seq of the ledger at path.
func newTail(path string, seq int64) (*tail, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	t := &tail{f: f, path: path}
	br := bufio.NewReaderSize(f, 256<<10)
	var last []byte
	for t.chain.Seq < seq {
		line, err := br.ReadBytes('\n')
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("runstate: %s: cannot find the end of line %d: %v", path, t.chain.Seq+1, err)
		}
		t.chain.Seq++
		t.offset += int64(len(line))
		t.chain.Hash = lineHash(line[:len(line)-1])
		last = line[:len(line)-1]
	}
	if last != nil {
		// ReadLedger checked the lines; the next must have a crc if the
		// last has one.
		_, t.chain.CRC, _ = runstate.DecodeLine(last)
	}
	return t, nil
}

// poll reads what was appended since the last call and shows each new
// record.
func (t *tail) poll(show func(*runstate.Record) error) error {
	fi, err := t.f.Stat()
	if err != nil {
		return fmt.Errorf("runstate: stat %s: %w", t.path, err)
	}
	size := fi.Size()
	if size < t.offset {
		return fmt.Errorf("runstate: %s shrank to %d bytes, below the %d already shown: it was cut (runstate repair?); run 'runstate log' again", t.path, size, t.offset)
	}
	if size == t.offset {
		return nil
	}
	buf := make([]byte, size-t.offset)
	if _, err := t.f.ReadAt(buf, t.offset); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("runstate: read %s: %w", t.path, err)
	}
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			return nil // a write in progress, or a torn tail: wait
		}
		r, err := t.chain.Next(buf[:i])
		if err != nil {
			// A line that ends in '\n' was written whole: a torn append
			// has none. Bad, it is damage, the last line too.
			return fmt.Errorf("runstate: %s line %d (byte %d): %v: the ledger is damaged; run 'runstate verify %s' (it says what is wrong and how to repair it)", t.path, t.chain.Seq+1, t.offset, err, quoteArg(t.dir))
		}
		if err := show(r); err != nil {
			return err
		}
		t.offset += int64(i + 1)
		buf = buf[i+1:]
	}
}
