//go:build unix

package runstate_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// within runs fn and fails the test when it has not returned after a
// while, so that a call that blocks for ever fails instead of hanging the
// suite. unblock, when not nil, is called then to let fn end.
func within(t *testing.T, what string, unblock func(), fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		if unblock != nil {
			unblock()
		}
		t.Fatalf("%s has not returned after 20 s: it blocks", what)
		return nil
	}
}

// openWriter opens the FIFO p for writing without blocking, which lets a
// reader blocked in open(2) go on.
func openWriter(p string) func() {
	return func() {
		if fd, err := syscall.Open(p, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			syscall.Close(fd)
		}
	}
}

// TestFileInputMustBeRegular: a File input that is a FIFO or a device is
// refused at Begin with an error saying what it is, instead of blocking
// (a FIFO without a writer) or reading for ever (/dev/zero).
func TestFileInputMustBeRegular(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	fifo := filepath.Join(t.TempDir(), "input.fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	before := readLedgerBytes(t, dir)
	for _, c := range []struct{ path, kind string }{
		{fifo, "a named pipe (FIFO)"},
		{"/dev/zero", "a device"},
	} {
		var unblock func()
		if c.path == fifo {
			unblock = openWriter(fifo)
		}
		err := within(t, "Begin with File("+c.path+")", unblock, func() error {
			_, err := r.Begin(ctx, "s", runstate.File(c.path))
			return err
		})
		require.Error(t, err, c.path)
		assert.ErrorIs(t, err, runstate.ErrInvalid, c.path)
		assert.Contains(t, err.Error(), c.path)
		assert.Contains(t, err.Error(), c.kind+", not a regular file")
	}
	assert.Equal(t, before, readLedgerBytes(t, dir), "nothing recorded")
}

// TestOutputMustBeRegular: an output that is (or became) a FIFO is
// refused by Complete and reported by Verify, never read until a writer
// comes.
func TestOutputMustBeRegular(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	fifo := filepath.Join(dir, "artifacts", "out.fifo")
	require.NoError(t, os.MkdirAll(filepath.Dir(fifo), 0o755))
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	require.NoError(t, st.Output("artifacts/out.fifo"))
	err = within(t, "Complete with a FIFO output", openWriter(fifo), st.Complete)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "artifacts/out.fifo")
	assert.Contains(t, err.Error(), "not a regular file")
	require.NoError(t, st.Fail(err))

	// A recorded output replaced by a FIFO.
	require.NoError(t, r.Do(ctx, "t", writeStage("artifacts/t.txt", "t")))
	require.NoError(t, r.Close())
	p := filepath.Join(dir, "artifacts", "t.txt")
	require.NoError(t, os.Remove(p))
	require.NoError(t, syscall.Mkfifo(p, 0o644))
	var rep *runstate.Report
	require.NoError(t, within(t, "Verify", openWriter(p), func() (err error) {
		rep, err = runstate.Verify(dir)
		return err
	}))
	require.Len(t, rep.Problems, 1)
	assert.Contains(t, rep.Problems[0].What, "not a regular file")
}

// TestPrivateRunStaysPrivate: once the ledger and the manifest are made
// private (chmod 600), every file runstate creates or rewrites afterwards
// (the manifest, next-steps.txt and its handoff files, the journal, a torn
// tail moved aside, temp files, outputs, repair's backup and projections)
// is readable by its owner only.
func TestPrivateRunStaysPrivate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := &runstate.Options{Request: testRequest} // with fsync: the journal too
	r, err := runstate.Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, r.Close())
	for _, p := range []string{ledgerPath(dir), filepath.Join(dir, "manifest.json")} {
		require.NoError(t, os.Chmod(p, 0o600))
	}
	// A torn tail for the next Open to move aside.
	f, err := os.OpenFile(ledgerPath(dir), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"seq":99,"at":"20`)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	r, err = runstate.Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "b", writeStage("artifacts/b/out.txt", "b")))
	require.NoError(t, r.Do(ctx, "c", writeStage("c.txt", "c")))
	require.NoError(t, r.Do(ctx, "c", writeStage("c.txt", "c"), runstate.Value("v", 2))) // replaced
	require.NoError(t, r.Close())
	_, err = runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: 5, Force: true})
	require.NoError(t, err)
	torn, _ := filepath.Glob(ledgerPath(dir) + ".torn-*")
	backup, _ := filepath.Glob(ledgerPath(dir) + ".bak-*")
	require.Len(t, torn, 1, "a torn tail was moved aside")
	require.Len(t, backup, 1, "repair backed the ledger up")

	var files []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files = append(files, rel)
		assert.Zero(t, fi.Mode().Perm()&0o077, "%s is %s: readable by others in a private run", rel, fi.Mode())
		return nil
	}))
	all := strings.Join(files, " ")
	for _, want := range []string{"manifest.json", "next-steps.txt", "ledger.wal", "c.txt", "out.txt"} {
		assert.Contains(t, all, want)
	}
}

// Making a private run's files private never changes a file outside the
// run: a file in logs/ that is a hard link to one elsewhere keeps its
// mode (Open and Repair chmod'ed the other file through the link).
func TestPrivateRunChangesNoFileThroughAHardLink(t *testing.T) {
	dir := t.TempDir()
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	require.NoError(t, r.Close())
	require.NoError(t, os.Chmod(ledgerPath(dir), 0o600))
	outside := filepath.Join(t.TempDir(), "shared.conf")
	require.NoError(t, os.WriteFile(outside, []byte("shared\n"), 0o644))
	require.NoError(t, os.Chmod(outside, 0o644)) // whatever the umask
	require.NoError(t, os.Link(outside, filepath.Join(dir, "logs", "notes.txt")))

	r, err = runstate.Open(dir, testOptions())
	require.NoError(t, err)
	require.NoError(t, r.Close())
	_, err = runstate.Repair(dir, nil)
	require.NoError(t, err)
	fi, err := os.Stat(outside)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o644), fi.Mode().Perm(), "a file outside the run was chmod'ed through a hard link")
	fi, err = os.Stat(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)
	assert.Zero(t, fi.Mode().Perm()&0o077, "runstate's own files are still made private")
}

// TestReadersRefuseFIFO: Inspect, NextSteps, ReadLedger and Verify return,
// never wait for a writer, when one of runstate's files is a FIFO (or
// manifest.json a link to /dev/zero, which they never read to its end),
// and Open returns when logs/run.json is one; each names the file.
func TestReadersRefuseFIFO(t *testing.T) {
	ctx := context.Background()
	readers := []struct {
		name string
		fn   func(dir string) error
	}{
		{"Inspect", func(dir string) error { _, err := runstate.Inspect(dir); return err }},
		{"NextSteps", func(dir string) error { _, err := runstate.NextSteps(dir); return err }},
		{"ReadLedger", func(dir string) error {
			return runstate.ReadLedger(dir, func(*runstate.Record) error { return nil })
		}},
		{"Verify", func(dir string) error {
			rep, err := runstate.Verify(dir)
			if err == nil && !rep.OK() {
				err = fmt.Errorf("%v", rep.Problems)
			}
			return err
		}},
	}
	for _, c := range []struct {
		file string
		link string // make file a symbolic link to this, not a FIFO
		// fails lists the readers that fail (or report a problem);
		// the others read on without the file.
		fails string
	}{
		{file: "logs/ledger.jsonl", fails: "Inspect NextSteps ReadLedger Verify"},
		{file: "manifest.json", fails: "Verify"},
		{file: "manifest.json", link: "/dev/zero", fails: "Verify"},
		{file: "logs/ledger.wal", fails: "Inspect NextSteps ReadLedger Verify"},
		{file: "logs/next-steps.txt", fails: "Verify"},
	} {
		dir := t.TempDir()
		r, err := runstate.Open(dir, &runstate.Options{Request: testRequest}) // with fsync: the journal too
		require.NoError(t, err)
		require.NoError(t, r.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }))
		require.NoError(t, r.Close())
		p := filepath.Join(dir, filepath.FromSlash(c.file))
		require.NoError(t, os.Remove(p))
		var unblock func()
		if c.link != "" {
			require.NoError(t, os.Symlink(c.link, p))
		} else {
			require.NoError(t, syscall.Mkfifo(p, 0o644))
			unblock = openWriter(p)
		}
		for _, rd := range readers {
			what := rd.name + " with " + c.file + " a FIFO"
			if c.link != "" {
				what = rd.name + " with " + c.file + " a link to " + c.link
			}
			err := within(t, what, unblock, func() error { return rd.fn(dir) })
			if !strings.Contains(c.fails, rd.name) {
				assert.NoError(t, err, what)
				continue
			}
			if assert.Error(t, err, what) {
				assert.Contains(t, err.Error(), p, what)
				if c.link != "" {
					// Refused as a link, as Open refuses it: not followed.
					assert.Contains(t, err.Error(), p+" is a symbolic link (to \""+c.link+"\")", what)
				} else {
					assert.Contains(t, err.Error(), "not a regular file", what)
				}
			}
		}
	}

	dir := t.TempDir()
	p := filepath.Join(dir, "logs", "run.json")
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, syscall.Mkfifo(p, 0o644))
	err := within(t, "Open with logs/run.json a FIFO", openWriter(p), func() error {
		r, err := runstate.Open(dir, testOptions())
		if err == nil {
			r.Close()
		}
		return err
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), p)
	_, ok := runstate.RunElsewhere(dir)
	assert.False(t, ok)
	err = within(t, "ReadWorkDirFile with logs/run.json a FIFO", openWriter(p), func() error {
		_, err := runstate.ReadWorkDirFile(dir)
		return err
	})
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), p+" is a named pipe (FIFO), not a regular file")
}

// ReadWorkDirFile: the bytes of logs/run.json; nothing when there is
// none or it is longer than any file a store writes there.
func TestReadWorkDirFile(t *testing.T) {
	dir := t.TempDir()
	data, err := runstate.ReadWorkDirFile(dir)
	require.NoError(t, err)
	assert.Nil(t, data)
	p := filepath.Join(dir, "logs", "run.json")
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(`{"address":"postgres://h/db?run=r"}`), 0o644))
	data, err = runstate.ReadWorkDirFile(dir)
	require.NoError(t, err)
	assert.Equal(t, `{"address":"postgres://h/db?run=r"}`, string(data))
	addr, ok := runstate.RunElsewhere(dir)
	assert.True(t, ok)
	assert.Equal(t, "postgres://h/db?run=r", addr)
	require.NoError(t, os.WriteFile(p, make([]byte, 64<<10+1), 0o644))
	data, err = runstate.ReadWorkDirFile(dir)
	require.NoError(t, err)
	assert.Nil(t, data)
}

// Run.CheckOutput checks a path as Stage.Output does, with no stage begun
// and nothing written: a path outside the run directory, or through a
// link that leads out of it, is ErrInvalid; a link that stays inside, a
// file not made yet, and a file in place are fine; after Close, ErrClosed.
func TestCheckOutputBeforeBegin(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	r, err := runstate.Open(dir, &runstate.Options{Request: "check outputs"})
	require.NoError(t, err)
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "away")))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "real"), 0o755))
	require.NoError(t, os.Symlink("real", filepath.Join(dir, "near")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "real", "f"), []byte("x"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(outside, "g"), filepath.Join(dir, "real", "g")))
	before, err := os.ReadFile(filepath.Join(dir, "logs", "ledger.jsonl"))
	require.NoError(t, err)

	for _, bad := range []string{"away/x", filepath.Join(dir, "away", "x"), "../x", filepath.Join(outside, "x"), "real/g", ""} {
		assert.ErrorIs(t, r.CheckOutput(bad), runstate.ErrInvalid, bad)
	}
	for _, good := range []string{"new/file", "near/f", "real/f", filepath.Join(dir, "real", "f")} {
		assert.NoError(t, r.CheckOutput(good), good)
	}
	after, err := os.ReadFile(filepath.Join(dir, "logs", "ledger.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, before, after, "nothing recorded")
	_, err = os.Stat(filepath.Join(dir, "new"))
	assert.ErrorIs(t, err, fs.ErrNotExist, "nothing made")
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries)

	require.NoError(t, r.Close())
	assert.ErrorIs(t, r.CheckOutput("real/f"), runstate.ErrClosed)
}

// runstate's own hard links — logs/next-steps.txt and an open session's
// file in logs/handoff — are still made private by a second session's
// Open.
func TestPrivateRunTightensItsOwnHardLinks(t *testing.T) {
	dir := t.TempDir()
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Do(context.Background(), "a", func(context.Context, *runstate.Stage) error { return nil }))
	next := filepath.Join(dir, "logs", "next-steps.txt")
	fi, err := os.Stat(next)
	require.NoError(t, err)
	st, ok := fi.Sys().(*syscall.Stat_t)
	require.True(t, ok)
	require.EqualValues(t, 2, st.Nlink, "the handoff is published through a hard link in logs/handoff")
	require.NoError(t, os.Chmod(next, 0o644))
	require.NoError(t, os.Chmod(ledgerPath(dir), 0o600))

	r2, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	defer r2.Close()
	own, err := filepath.Glob(filepath.Join(dir, "logs", "handoff", r.Session()+".*"))
	require.NoError(t, err)
	require.NotEmpty(t, own)
	for _, p := range append(own, next) {
		fi, err = os.Stat(p)
		require.NoError(t, err)
		assert.Zero(t, fi.Mode().Perm()&0o077, "%s is %s in a private run", p, fi.Mode())
	}
}

// logs/ledger.wal, the journal runstate overwrites in place, that is a
// hard link to a file outside the run is refused by Open and Repair,
// naming it: the other file keeps its bytes. Open overwrote it.
func TestJournalWithAnotherHardLinkIsRefused(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := &runstate.Options{Request: testRequest} // with fsync: the journal is used
	r, err := runstate.Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	wal := filepath.Join(dir, "logs", "ledger.wal")
	data, err := os.ReadFile(wal)
	require.NoError(t, err)
	outside := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(outside, data, 0o644))
	require.NoError(t, os.Remove(wal))
	require.NoError(t, os.Link(outside, wal))

	r, err = runstate.Open(dir, opts)
	if err == nil {
		for i := range 50 {
			require.NoError(t, r.Do(ctx, fmt.Sprint("s", i), func(context.Context, *runstate.Stage) error { return nil }))
		}
		require.NoError(t, r.Close())
	}
	got, rerr := os.ReadFile(outside)
	require.NoError(t, rerr)
	assert.Equal(t, data, got, "the file outside the run was overwritten through a hard link")
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), wal+" has 2 hard links")
	_, err = runstate.Repair(dir, nil)
	require.ErrorIs(t, err, runstate.ErrInvalid)
	_, err = runstate.Inspect(dir)
	assert.NoError(t, err, "readers write nothing: they read it")

	// Its own copy: the run opens again, with nothing lost.
	require.NoError(t, os.Remove(wal))
	require.NoError(t, os.WriteFile(wal, data, 0o644))
	r, err = runstate.Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, r.Close())
}

// A recorded output replaced by a file of another size — here a sparse
// file of 256 GiB, which takes minutes to read — is altered without being
// read: Verify and a Begin that checks the evidence say so at once. They
// hashed it all first.
func TestOutputOfAnotherSizeIsNotRead(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, r.Do(ctx, "t", writeStage("artifacts/t.txt", "t")))
	require.NoError(t, r.Close())
	p := filepath.Join(dir, "artifacts", "t.txt")
	require.NoError(t, os.Truncate(p, 256<<30))
	stop := func() { os.Truncate(p, 0) } // ends a read under way

	var rep *runstate.Report
	require.NoError(t, within(t, "Verify", stop, func() (err error) {
		rep, err = runstate.Verify(dir)
		return err
	}))
	require.Len(t, rep.Problems, 1)
	assert.Contains(t, rep.Problems[0].What, "output artifacts/t.txt altered")
	assert.Contains(t, rep.Problems[0].What, "274877906944 bytes, want 1")

	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	defer r.Close()
	ran := false
	require.NoError(t, within(t, "Do", stop, func() error {
		return r.Do(ctx, "t", func(ctx context.Context, st *runstate.Stage) error {
			ran = true
			return st.WriteFile("artifacts/t.txt", []byte("t"))
		})
	}))
	assert.True(t, ran, "the stage is redone")
}

// A session's lock file in logs/sessions that is a symbolic link is not
// followed: a Run never opens what it points to (a device such as
// /dev/watchdog acts on open). It opened the link's target.
func TestSessionLockLinkIsNotFollowed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	_, err = r.Begin(ctx, "s")
	require.NoError(t, err)
	require.NoError(t, r.Close()) // s stays running, its session gone
	fifo := filepath.Join(t.TempDir(), "device")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	lock := filepath.Join(dir, "logs", "sessions", r.Session()+".lock")
	require.NoError(t, os.Symlink(fifo, lock))
	opened := watchOpen(t, fifo)

	r2, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	defer r2.Close()
	_, err = r2.Begin(ctx, "s") // its session closed: s was interrupted
	require.NoError(t, err)
	select {
	case <-opened:
		t.Fatal("runstate opened the target of a symbolic link in logs/sessions")
	case <-time.After(500 * time.Millisecond):
	}
}

// watchOpen returns a channel closed when someone opens the FIFO p to
// read: a writer's open(2) returns then. The writer is let go at the
// test's end (a reader opened without blocking, and closed).
func watchOpen(t *testing.T, p string) <-chan struct{} {
	opened := make(chan struct{})
	go func() {
		if f, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
			close(opened)
			f.Close()
		}
	}()
	t.Cleanup(func() {
		if fd, err := syscall.Open(p, syscall.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			syscall.Close(fd)
		}
	})
	return opened
}

// The readers do not open a file that a symbolic link among runstate's
// files (or a File input) points to when it is not a regular file — a
// device acts on open (/dev/watchdog arms, a tape rewinds). They opened
// it, then refused it; they refused it from its stat; now, as Open, they
// refuse the link itself (TestReadersDoNotFollowOwnLinks).
func TestReadersDoNotOpenALinkedDevice(t *testing.T) {
	for _, rel := range []string{"manifest.json", "logs/next-steps.txt", "logs/ledger.jsonl", "logs/ledger.wal"} {
		t.Run(filepath.Base(rel), func(t *testing.T) {
			r, dir := newTestRun(t)
			require.NoError(t, r.Close())
			fifo := filepath.Join(t.TempDir(), "device")
			require.NoError(t, syscall.Mkfifo(fifo, 0o644))
			p := filepath.Join(dir, filepath.FromSlash(rel))
			if err := os.Remove(p); !os.IsNotExist(err) {
				require.NoError(t, err)
			}
			require.NoError(t, os.Symlink(fifo, p))
			opened := watchOpen(t, fifo)

			_, err := runstate.Inspect(dir)
			_, nerr := runstate.NextSteps(dir)
			rep, verr := runstate.Verify(dir)
			select {
			case <-opened:
				t.Fatalf("a reader opened the FIFO %s links to (Inspect: %v, NextSteps: %v, Verify: %v)", rel, err, nerr, verr)
			case <-time.After(500 * time.Millisecond):
			}
			if verr == nil {
				require.NotEmpty(t, rep.Problems)
				verr = fmt.Errorf("%v", rep.Problems)
			}
			assert.Contains(t, verr.Error(), p+" is a symbolic link", "refused as a link, not followed")
		})
	}
	// A File input.
	fifo := filepath.Join(t.TempDir(), "device")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	opened := watchOpen(t, fifo)
	r, _ := newTestRun(t)
	_, err := r.Begin(context.Background(), "s", runstate.File(fifo))
	require.ErrorIs(t, err, runstate.ErrInvalid)
	select {
	case <-opened:
		t.Fatal("Begin opened a File input that is a FIFO")
	case <-time.After(500 * time.Millisecond):
	}
}

// An output replaced by a symbolic link out of the run, or under a
// directory replaced by one, is reported by Verify naming the link, its
// target and what to do, not with os.Root's "path escapes from parent".
func TestVerifyNamesALinkOutInsteadOfAnEscape(t *testing.T) {
	for _, c := range []struct{ name, link, path string }{
		{"file", "artifacts/plan.md", "artifacts/plan.md"},
		{"directory", "artifacts", "artifacts/plan.md"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := planRun(t)
			outside := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(outside, "plan.md"), []byte("the plan\n"), 0o644))
			to := filepath.Join(outside, "plan.md")
			if c.link == "artifacts" {
				to = outside
			}
			require.NoError(t, os.RemoveAll(filepath.Join(dir, filepath.FromSlash(c.link))))
			require.NoError(t, os.Symlink(to, filepath.Join(dir, filepath.FromSlash(c.link))))

			rep, err := runstate.Verify(dir)
			require.NoError(t, err)
			require.Len(t, rep.Problems, 1)
			want := fmt.Sprintf("output %s unreadable: %s is a symbolic link (to %q) out of the run directory, which runstate does not follow: replace the link with what it points to", c.path, c.link, to)
			assert.Contains(t, rep.Problems[0].What, want)
			assert.NotContains(t, rep.Problems[0].What, "escapes")
		})
	}
}

// A link within the run that is not the cause of an unreadable output (a
// loop of links here) is not named as one out of the run.
func TestVerifyNamesNoLinkWithinTheRunAsOut(t *testing.T) {
	dir := planRun(t)
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "artifacts")))
	require.NoError(t, os.Symlink("loop2", filepath.Join(dir, "artifacts")))
	require.NoError(t, os.Symlink("artifacts", filepath.Join(dir, "loop2")))
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1)
	assert.Contains(t, rep.Problems[0].What, "output artifacts/plan.md unreadable: ")
	assert.NotContains(t, rep.Problems[0].What, "out of the run directory")
}

// A link out of the run behind a link within it (artifacts -> real, a
// directory of the run; real/plan.md -> a file outside) is named.
func TestVerifyNamesALinkOutBehindALinkWithin(t *testing.T) {
	dir := planRun(t)
	require.NoError(t, os.Rename(filepath.Join(dir, "artifacts"), filepath.Join(dir, "real")))
	require.NoError(t, os.Symlink("real", filepath.Join(dir, "artifacts")))
	outside := filepath.Join(t.TempDir(), "plan.md")
	require.NoError(t, os.WriteFile(outside, []byte("the plan\n"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, "real", "plan.md")))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "real", "plan.md")))
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1)
	assert.Contains(t, rep.Problems[0].What, fmt.Sprintf("output artifacts/plan.md unreadable: artifacts/plan.md is a symbolic link (to %q) out of the run directory", outside))
}

// planRun is a closed run whose stage plan wrote artifacts/plan.md.
func planRun(t *testing.T) string {
	t.Helper()
	r, dir := newTestRun(t)
	require.NoError(t, r.Do(context.Background(), "plan", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/plan.md", []byte("the plan\n"))
	}))
	require.NoError(t, r.Close())
	return dir
}
