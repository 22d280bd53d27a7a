//go:build unix

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runCLIWithin is runCLI for a command that may hang on hostile files:
// it fails the test, instead of hanging it, when the command has not
// exited within d (it is killed then).
func runCLIWithin(t *testing.T, d time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	tail := errb.String()
	if len(tail) > 300 {
		tail = "..." + tail[len(tail)-300:]
	}
	require.NoError(t, ctx.Err(), "runstate %q did not exit within %v (killed); stderr: %q", args, d, tail)
	return resultOf(t, err, &out, &errb)
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

// logs/next-steps.txt that is not a file runstate wrote — a FIFO, a link
// to /dev/zero or to another run's handoff, a file far larger than any handoff — neither blocks
// 'runstate next' nor makes it read without bound: it shows the handoff
// rebuilt from the ledger and says why.
func TestNextNeverBlocksOnAHandoffThatIsNotAFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(p string) error
		why  string
	}{
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o644) }, "not a regular file"},
		// Links are refused before they are followed: the library's
		// readers do not follow one either.
		{"dev-zero", func(p string) error { return os.Symlink("/dev/zero", p) }, "symbolic link"},
		{"another-runs", func(p string) error {
			// A handoff of the same seq, another run's: it was shown
			// as this run's.
			return os.Symlink(filepath.Join(healthyRun(t), "logs", "next-steps.txt"), p)
		}, "symbolic link"},
		{"huge", func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return f.Truncate(1 << 30) // sparse: 1 GiB of NULs
		}, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := healthyRun(t)
			p := filepath.Join(dir, "logs", "next-steps.txt")
			require.NoError(t, os.Remove(p))
			require.NoError(t, tc.make(p))
			st, err := runstate.Inspect(dir)
			require.NoError(t, err)

			var opened <-chan struct{} // nil: never ready
			if tc.name == "fifo" {     // not even opened: a device may act on open
				opened = watchOpen(t, p)
			}
			r := runCLIWithin(t, 20*time.Second, "next", dir)
			select {
			case <-opened:
				t.Errorf("runstate next opened the FIFO %s", p)
			case <-time.After(300 * time.Millisecond):
			}
			assert.Equal(t, exitOK, r.code, r.err)
			assert.Contains(t, r.err, "showing the handoff rebuilt from the ledger")
			assert.Contains(t, r.err, tc.why)
			assert.Contains(t, r.out, fmt.Sprintf("as of ledger seq %d ", st.Seq))
			assert.Less(t, len(r.out), 1<<20, "next printed what it should not have read")
		})
	}
}

// exec's files for a stage's standard output and error are replaced, not
// written through: one that is a hard link to a file outside the run is
// left as it was outside, and one that is a FIFO (whose buffer fills, and
// no one reads it) does not hang exec.
func TestExecStdFilesAreReplacedNotWrittenThrough(t *testing.T) {
	dir, work := shellRun(t, "a")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "exec"), 0o755))
	outside := filepath.Join(work, "outside")
	require.NoError(t, os.WriteFile(outside, []byte("precious\n"), 0o644))
	require.NoError(t, os.Link(outside, filepath.Join(dir, "exec", "a.stdout")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "exec", "a.stderr"), 0o644))

	r := runCLIWithin(t, 30*time.Second, "exec", dir, "a", "--", "sh", "-c", `echo pwned; head -c 200000 /dev/zero | tr "\\0" x >&2`)
	assert.Equal(t, exitOK, r.code, r.err)
	b, err := os.ReadFile(outside)
	require.NoError(t, err)
	assert.Equal(t, "precious\n", string(b), "exec wrote outside the run directory through a hard link")
	b, err = os.ReadFile(filepath.Join(dir, "exec", "a.stdout"))
	require.NoError(t, err)
	assert.Equal(t, "pwned\n", string(b))
	fi, err := os.Lstat(filepath.Join(dir, "exec", "a.stderr"))
	require.NoError(t, err)
	assert.True(t, fi.Mode().IsRegular(), "exec/a.stderr is %v", fi.Mode().Type())
	assert.Equal(t, int64(200000), fi.Size())
	assert.Equal(t, runstate.StateComplete, stageStatus(t, dir, "a").State)
}

// A session's lock file in logs/sessions that is a FIFO does not block
// status, next or ls: the read commands try it without waiting for a
// writer, and find what a writer's Open finds (the lock can be taken: the
// session is gone).
func TestReadCommandsNeverBlockOnASessionLockFIFO(t *testing.T) {
	dir, r := deadSessionRun(t)
	lock := filepath.Join(dir, "logs", "sessions", r.Session()+".lock")
	require.NoError(t, os.Remove(lock))
	require.NoError(t, syscall.Mkfifo(lock, 0o600))

	res := runCLIWithin(t, 20*time.Second, "status", dir)
	assert.Equal(t, exitBlocked, res.code, res.err)
	assert.Contains(t, res.out, "interrupted")
	res = runCLIWithin(t, 20*time.Second, "next", dir)
	assert.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.err, "runstate: stage execute is not running: attempt 1's session "+short(r.Session())+" is gone")
	res = runCLIWithin(t, 20*time.Second, "ls", filepath.Dir(dir))
	assert.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "stopped")
}

// log -follow does not read again a ledger that has not changed since
// its last read: a torn last line of 32 MiB (no '\n') that no writer
// ends was scanned every 100 ms, more than a core's worth of CPU.
func TestLogFollowDoesNotRereadAnUnchangedLedger(t *testing.T) {
	dir := healthyRun(t)
	f := follow(t, dir)
	for range ledgerLines(t, dir) {
		f.next(t)
	}
	lf, err := os.OpenFile(ledgerPath(dir), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = lf.Write(bytes.Repeat([]byte("x"), 32<<20)) // torn: no '\n'
	require.NoError(t, err)
	require.NoError(t, lf.Close())
	time.Sleep(4 * time.Second) // 40 polls
	require.NoError(t, f.cmd.Process.Signal(os.Interrupt))
	require.NoError(t, f.cmd.Wait())
	cpu := f.cmd.ProcessState.UserTime() + f.cmd.ProcessState.SystemTime()
	assert.Less(t, cpu, time.Second, "log -follow spent %v of CPU on an unchanged ledger in 4 s", cpu)
}

// status, next and ls do not follow a session's lock file that is a
// symbolic link (its target may be a device that acts on open): they
// cannot tell whether that session is alive, and say so. They opened the
// link's target.
func TestReadCommandsDoNotFollowASessionLockLink(t *testing.T) {
	dir, r := deadSessionRun(t)
	lock := filepath.Join(dir, "logs", "sessions", r.Session()+".lock")
	require.NoError(t, os.Remove(lock))
	fifo := filepath.Join(t.TempDir(), "device")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	require.NoError(t, os.Symlink(fifo, lock))
	opened := watchOpen(t, fifo)

	res := runCLIWithin(t, 20*time.Second, "status", dir)
	assert.Contains(t, res.out, "cannot tell whether session "+short(r.Session())+" is alive")
	runCLIWithin(t, 20*time.Second, "next", dir)
	runCLIWithin(t, 20*time.Second, "ls", filepath.Dir(dir))
	select {
	case <-opened:
		t.Fatal("runstate opened the target of a symbolic link in logs/sessions")
	case <-time.After(500 * time.Millisecond):
	}
}

// status -json prints a deeply nested receipt without indenting it when
// indenting would make the output many times its size: a receipt of
// 400 KB, 200 levels deep (the most a writer records), printed as some
// 80 MB of spaces, and a forged one 9,000 levels deep took 1.2 GB.
func TestStatusJSONDoesNotBlowUpADeepReceipt(t *testing.T) {
	dir, r := newRun(t)
	one := strings.Repeat("[", 199) + strings.Repeat("]", 199)
	receipt := "[" + strings.TrimSuffix(strings.Repeat(one+",", 1000), ",") + "]"
	_, err := r.Effect(context.Background(), "deep", runstate.Effect{
		Do: func(context.Context, string) (json.RawMessage, error) { return json.RawMessage(receipt), nil },
	})
	require.NoError(t, err)
	require.NoError(t, r.Close())

	res := runCLIWithin(t, 60*time.Second, "status", "-json", dir)
	assert.Equal(t, exitOK, res.code, res.err)
	assert.Less(t, len(res.out), 10*len(receipt), "status -json printed %d bytes for a %d-byte receipt", len(res.out), len(receipt))
	var s statusJSON
	require.NoError(t, json.Unmarshal([]byte(res.out), &s), "still one JSON value")
	res = runCLIWithin(t, 60*time.Second, "status", "-json", healthyRun(t))
	assert.Contains(t, res.out, "\n  \"", "a status without such a value is indented as before")
}

// ls lists a run whose ledger is not a regular file (a FIFO put there)
// as an error, saying why, and exits 1: it left the run out without a
// word, as if there were none.
func TestLsListsARunWhoseLedgerIsAFIFO(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "fifo")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs"), 0o755))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "logs", "ledger.jsonl"), 0o644))
	res := runCLIWithin(t, 20*time.Second, "ls", "-json", root)
	assert.Equal(t, exitFail, res.code, res.err)
	var runs []lsRun
	require.NoError(t, json.Unmarshal([]byte(res.out), &runs), res.out)
	require.Len(t, runs, 1, "the run is listed")
	assert.Equal(t, "error", runs[0].State)
	assert.Contains(t, runs[0].Error, "named pipe")
}

// ls lists a run whose ledger is a directory or a symbolic link as an
// error too (a directory was left out without a word), and gives a linked
// ledger no last record: the time of the file it links to is not the
// run's (a link to /etc/passwd showed its age).
func TestLsListsARunWhoseLedgerIsADirectoryOrALink(t *testing.T) {
	root := t.TempDir()
	dirLedger := filepath.Join(root, "dir", "logs", "ledger.jsonl")
	require.NoError(t, os.MkdirAll(dirLedger, 0o755))
	target := filepath.Join(t.TempDir(), "old")
	require.NoError(t, os.WriteFile(target, []byte("x\n"), 0o644))
	old := time.Now().Add(-200 * 24 * time.Hour)
	require.NoError(t, os.Chtimes(target, old, old))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "link", "logs"), 0o755))
	require.NoError(t, os.Symlink(target, filepath.Join(root, "link", "logs", "ledger.jsonl")))

	res := runCLIWithin(t, 20*time.Second, "ls", "-json", root)
	assert.Equal(t, exitFail, res.code, res.err)
	var runs []lsRun
	require.NoError(t, json.Unmarshal([]byte(res.out), &runs), res.out)
	require.Len(t, runs, 2, "both runs are listed: %s", res.out)
	for _, r := range runs {
		assert.Equal(t, "error", r.State, r.Dir)
		assert.True(t, r.LastRecord.IsZero(), "%s: no last record, got %v", r.Dir, r.LastRecord)
	}
	res = runCLIWithin(t, 20*time.Second, "ls", root)
	assert.NotContains(t, res.out, "200d ago")
}
