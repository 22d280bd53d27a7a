//go:build unix

package cli

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pidIn reads the pid a command wrote to path.
func pidIn(t *testing.T, path string) int {
	t.Helper()
	waitFile(t, path)
	var pid int
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(path)
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		pid = n
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	return pid
}

// gone reports whether no process pid exists any more (a zombie counts as
// gone: it runs nothing).
func gone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false // no /proc: cannot tell a zombie
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return strings.HasPrefix(after, "Z")
}

// When exec is SIGKILLed the command dies too, and the next exec records
// the attempt as interrupted and runs the stage again.
func TestExecKilledKillsCommand(t *testing.T) {
	if _, err := os.Stat("/proc/self"); err != nil {
		t.Skip("needs Linux: a parent-death signal")
	}
	dir, work := shellRun(t, "slow")
	pidFile := filepath.Join(work, "pid")
	b := startCLI(t, "exec", dir, "slow", "--", "sh", "-c", `echo $$ > "$0"; exec sleep 60`, pidFile)
	pid := pidIn(t, pidFile)
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGKILL))
	b.wait(t)
	assert.Eventually(t, func() bool { return gone(pid) }, 10*time.Second, 10*time.Millisecond,
		"the command (pid %d) outlived exec's SIGKILL", pid)

	r := execCLI(t, dir, "slow", nil, "true")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.err, "slow: running (attempt 2): attempt 1 was interrupted: session")
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Metrics.Interrupted)
}

// SIGTERM to exec reaches the command's whole process group; a command
// that then fails leaves the attempt for the next session (interrupted),
// not failed, and exec exits with the command's status.
func TestExecForwardsSignals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir, work := shellRun(t, "slow")
			ready, child := filepath.Join(work, "ready"), filepath.Join(work, "child")
			// The shell waits on a child of its own: both must get the signal.
			// The child writes ready once its trap is set, after the shell's
			// (a fixed pause for it was too short on a busy machine).
			script := `trap 'echo got >> "$0"; exit 7' INT; trap 'echo got >> "$0"; wait; exit 7' TERM; sh -c 'trap "echo child >> \"$0\"; exit 0" TERM INT; echo $$ > "$1"; sleep 60 & wait' "$1" "$2" & wait; wait`
			b := startCLI(t, "exec", dir, "slow", "--", "sh", "-c", script, filepath.Join(work, "got"), child, ready)
			pidIn(t, ready)
			require.NoError(t, b.cmd.Process.Signal(sig))
			b.wait(t)
			assert.Equal(t, 7, b.code, b.errb.String())
			assert.Contains(t, b.errb.String(), "slow: interrupted by ")
			assert.Equal(t, 1, lines(t, filepath.Join(work, "got")), "the command got the signal")
			if sig == syscall.SIGTERM { // sh starts a background job with SIGINT ignored
				assert.Equal(t, 1, lines(t, child), "the command's child got the signal")
			}
			s := stageStatus(t, dir, "slow")
			assert.Equal(t, runstate.StateRunning, s.State, "the attempt is left for the next session")
			assert.Zero(t, s.Failures)
			r := execCLI(t, dir, "slow", nil, "true")
			require.Equal(t, 0, r.code, r.err)
			assert.Contains(t, r.err, "attempt 1 was interrupted")
		})
	}
}

// What the command leaves running in its process group is ended when it
// exits (SIGTERM, then SIGKILL), so that exec does not wait for it (it
// holds the output pipes).
func TestExecKillsLeftovers(t *testing.T) {
	dir, work := shellRun(t, "a")
	pidFile := filepath.Join(work, "pid")
	start := time.Now()
	r := execCLI(t, dir, "a", nil, "sh", "-c", `sleep 60 & echo $! > "$0"; echo done`, pidFile)
	require.Equal(t, 0, r.code, r.err)
	assert.Less(t, time.Since(start), 20*time.Second)
	pid := pidIn(t, pidFile)
	assert.Eventually(t, func() bool { return gone(pid) }, 10*time.Second, 10*time.Millisecond)
}

// A closed standard output (runstate exec ... | head -1) neither kills exec
// nor cuts what the stage keeps.
func TestExecClosedStdout(t *testing.T) {
	dir, _ := shellRun(t, "loud")
	cmd := exec.Command(bin, "exec", dir, "loud", "--", "seq", "100000")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	require.NoError(t, cmd.Start())
	first := make([]byte, 6)
	_, err = io.ReadFull(stdout, first)
	require.NoError(t, err)
	require.NoError(t, stdout.Close())
	require.NoError(t, cmd.Wait(), errb.String())
	assert.Equal(t, "1\n2\n3\n", string(first))
	b, err := os.ReadFile(filepath.Join(dir, "exec", "loud.stdout"))
	require.NoError(t, err)
	assert.Equal(t, 100000, strings.Count(string(b), "\n"))
	assert.Equal(t, runstate.StateComplete, stageStatus(t, dir, "loud").State)
}

// A command that changes its own -in file while it runs makes the stage
// stale, not complete: exit 124.
func TestExecStale(t *testing.T) {
	dir, work := shellRun(t, "a")
	src := filepath.Join(work, "src")
	require.NoError(t, os.WriteFile(src, []byte("1\n"), 0o644))
	r := execCLI(t, dir, "a", []string{"-in", src}, "sh", "-c", `echo 2 > "$0"`, src)
	assert.Equal(t, exitStale, r.code, r.err)
	assert.Contains(t, r.err, "input "+src+" changed while the stage ran")
	assert.Equal(t, runstate.StatePending, stageStatus(t, dir, "a").State)
}

// exec writes the command's output nowhere outside the run directory, even
// when DIR/exec is a symbolic link that leads elsewhere, and records
// nothing: the paths are checked (Run.CheckOutput) before the begin, so
// a directory set up wrong fails no attempt, however often exec is run.
// The same for an -out path through a link, and for await's -out.
func TestExecRefusesLinkOutOfRun(t *testing.T) {
	dir, work := shellRun(t, "a")
	outside := filepath.Join(work, "outside")
	require.NoError(t, os.Mkdir(outside, 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "exec")))
	before := len(events(t, dir, 0))
	for range 2 {
		r := execCLI(t, dir, "a", nil, "echo", "hi")
		assert.Equal(t, exitRunstate, r.code, r.err)
		assert.Contains(t, r.err, "outputs must stay inside the run directory")
		assert.Contains(t, r.err, "make exec/ a directory there (remove the link), then run the stage again; nothing recorded")
	}
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries, "exec wrote outside the run directory")
	assert.Equal(t, runstate.StatePending, stageStatus(t, dir, "a").State)
	assert.NotContains(t, events(t, dir, int64(before)), "begin", "no attempt begun")

	require.NoError(t, os.Remove(filepath.Join(dir, "exec")))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "out")))
	r := execCLI(t, dir, "a", []string{"-out", filepath.Join(dir, "out", "x")}, "echo", "hi")
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "give an output path inside the run directory, then run the stage again; nothing recorded")
	r = runCLI(t, "await", dir, "a", "-reason", "look", "-out", filepath.Join(dir, "out", "x"))
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "nothing recorded")
	assert.NotContains(t, events(t, dir, int64(before)), "begin", "no attempt begun")
	entries, err = os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries)

	r = execCLI(t, dir, "a", nil, "echo", "hi")
	assert.Equal(t, exitOK, r.code, r.err)
	assert.Equal(t, 1, stageStatus(t, dir, "a").Attempt, "the first attempt is the one that ran")
}

// runClosed runs the command with its standard output (and, with both,
// its standard error too) a pipe whose reader has gone, as in
// 'runstate exec ... 2>&1 | head -0'. It returns the exit status and
// whether a signal killed the command.
func runClosed(t *testing.T, both bool, args ...string) (code int, killed os.Signal) {
	t.Helper()
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	require.NoError(t, pr.Close())
	defer pw.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout = pw
	if both {
		cmd.Stderr = pw
	}
	err = cmd.Run()
	var ee *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &ee)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal()
	}
	return cmd.ProcessState.ExitCode(), nil
}

// events lists the ev of each record after seq from.
func events(t *testing.T, dir string, from int64) []string {
	t.Helper()
	var evs []string
	require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error {
		if r.Seq > from {
			evs = append(evs, r.Ev+" "+r.Stage+r.Key)
		}
		return nil
	}))
	return evs
}

// A closed standard output and error (runstate exec ... 2>&1 | head -1
// after head has exited) kill neither exec, await nor effect with SIGPIPE:
// each records how the stage or effect ended and closes its session, and
// exits with its own status.
func TestPipelineCommandsSurviveAClosedPipe(t *testing.T) {
	dir, _ := shellRun(t, "fails", "missing", "ok", "review")
	seq := func() int64 {
		st, err := runstate.Inspect(dir)
		require.NoError(t, err)
		return st.Seq
	}
	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"exec", dir, "fails", "--", "sh", "-c", "echo out; echo err >&2; exit 3"}, 3,
			[]string{"open ", "begin fails", "fail fails", "close "}},
		{[]string{"exec", dir, "missing", "--", "no-such-command-runstate"}, exitNotFound,
			[]string{"open ", "begin missing", "fail missing", "close "}},
		{[]string{"exec", dir, "ok", "--", "seq", "10000"}, exitOK,
			[]string{"open ", "begin ok", "complete ok", "close "}},
		{[]string{"await", dir, "review", "-reason", "read it"}, exitPerson,
			[]string{"open ", "begin review", "await review", "close "}},
		{[]string{"effect", dir, "notify", "--", "echo", "sent"}, exitOK,
			[]string{"open ", "intent notify", "confirm notify", "close "}},
	} {
		from := seq()
		code, killed := runClosed(t, true, tc.args...)
		assert.Nil(t, killed, "%v was killed", tc.args)
		assert.Equal(t, tc.code, code, "%v", tc.args)
		assert.Equal(t, tc.want, events(t, dir, from), "%v", tc.args)
	}
	// Standard error still open: the messages are there.
	from := seq()
	code, killed := runClosed(t, false, "effect", dir, "notify2", "--", "echo", "sent")
	assert.Nil(t, killed)
	assert.Equal(t, exitOK, code)
	assert.Equal(t, []string{"open ", "intent notify2", "confirm notify2", "close "}, events(t, dir, from))
}
