//go:build unix

package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holdUntil is a command that touches started, then runs until go
// exists.
func holdUntil(started, goFile string) []string {
	return []string{"sh", "-c", `touch "$0"; while [ ! -e "$1" ]; do sleep 0.02; done`, started, goFile}
}

// waitStderr waits until b's standard error holds want.
func waitStderr(t *testing.T, b *bg, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(b.errb.String(), want) {
		select {
		case <-b.done:
			t.Fatalf("%v ended (exit %d) before saying %q; stderr: %s", b.cmd.Args, b.code, want, b.errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v did not say %q within 30s; stderr: %s", b.cmd.Args, want, b.errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exec -wait waits while an -after stage runs in another session, says
// so, and runs its command once that stage is done; without -wait it
// exits 125 at once.
func TestExecWaitsForAnAfterStage(t *testing.T) {
	dir, work := shellRun(t, "fetch", "build")
	started, goFile, count := filepath.Join(work, "started"), filepath.Join(work, "go"), filepath.Join(work, "count")
	fetch := startCLI(t, append([]string{"exec", dir, "fetch", "--"}, holdUntil(started, goFile)...)...)
	waitFile(t, started)

	r := execCLI(t, dir, "build", []string{"-after", "fetch"}, counted(count, "", "")...)
	assert.Equal(t, exitRunstate, r.code, "without -wait: at once; %s", r.err)
	assert.Contains(t, r.err, "build needs fetch, which is running")

	build := startCLI(t, append([]string{"exec", dir, "build", "-after", "fetch", "-wait", "60s", "--"}, counted(count, "built", "")...)...)
	waitStderr(t, build, "runstate exec: build: waiting (at most ")
	assert.Contains(t, build.errb.String(), "build needs fetch, which is running")
	time.Sleep(300 * time.Millisecond) // a few tries
	select {
	case <-build.done:
		t.Fatalf("build ended while fetch ran: exit %d, %s", build.code, build.errb.String())
	default:
	}
	require.NoError(t, os.WriteFile(goFile, nil, 0o644))
	fetch.wait(t)
	require.Equal(t, 0, fetch.code, fetch.errb.String())
	build.wait(t)
	require.Equal(t, 0, build.code, build.errb.String())
	assert.Equal(t, "built\n", build.out.String())
	assert.Contains(t, build.errb.String(), "build: running (attempt 1)")
	assert.Equal(t, 1, strings.Count(build.errb.String(), "waiting"), "said once: the reason did not change")
	assert.Equal(t, runstate.StateComplete, stageStatus(t, dir, "build").State)
	assert.Equal(t, 1, lines(t, count))
}

// exec -wait on a stage another session runs waits until it is done, then
// skips it; -wait with a bound that passes exits as without it, saying how
// long it waited; SIGTERM ends the wait at once (exit 128+15), the
// session closed.
func TestExecWaitsForABusyStageAndGivesUp(t *testing.T) {
	dir, work := shellRun(t, "slow", "never")
	started, goFile, count := filepath.Join(work, "started"), filepath.Join(work, "go"), filepath.Join(work, "count")
	slow := startCLI(t, append([]string{"exec", dir, "slow", "--"}, holdUntil(started, goFile)...)...)
	waitFile(t, started)

	t0 := time.Now()
	r := execCLI(t, dir, "slow", []string{"-wait", "400ms"}, counted(count, "", "")...)
	assert.Equal(t, exitBusy, r.code, r.err)
	assert.GreaterOrEqual(t, time.Since(t0), 400*time.Millisecond, "it waited")
	assert.Contains(t, r.err, "runstate exec: slow: waiting (at most ")
	assert.Regexp(t, `is running in .*\(waited \d`, r.err)

	second := startCLI(t, append([]string{"exec", dir, "slow", "-wait", "60s", "--"}, counted(count, "", "")...)...)
	waitStderr(t, second, "waiting")
	require.NoError(t, os.WriteFile(goFile, nil, 0o644))
	slow.wait(t)
	require.Equal(t, 0, slow.code, slow.errb.String())
	second.wait(t)
	require.Equal(t, 0, second.code, second.errb.String())
	assert.Contains(t, second.errb.String(), "slow: skipped: complete since seq")
	_, err := os.Stat(count)
	assert.ErrorIs(t, err, os.ErrNotExist, "no command ran but the first")

	// SIGTERM in the pause between tries. A try runs as without -wait, so
	// one that lands in a try (a few ms of each second, more on a busy
	// machine) ends the process by the signal's default: then again, in a
	// run of its own, up to five times.
	for attempt := 1; ; attempt++ {
		run := filepath.Join(work, fmt.Sprintf("term-%d", attempt))
		r := runCLI(t, "plan", run, "-request", "shell pipeline", "never")
		require.Equal(t, 0, r.code, r.err)
		never := startCLI(t, append([]string{"exec", run, "late", "-after", "never", "-wait", "60s", "--"}, counted(count, "", "")...)...)
		waitStderr(t, never, "late needs never, which is pending")
		time.Sleep(2500 * time.Millisecond) // the pauses have grown to a second
		t0 = time.Now()
		require.NoError(t, never.cmd.Process.Signal(syscall.SIGTERM))
		never.wait(t)
		assert.Less(t, time.Since(t0), 10*time.Second)
		_, err = os.Stat(count)
		assert.ErrorIs(t, err, os.ErrNotExist, "the command did not run")
		if never.code == -1 && attempt < 5 { // killed by it in a try
			continue
		}
		assert.Equal(t, 128+int(syscall.SIGTERM), never.code, never.errb.String())
		assert.Contains(t, never.errb.String(), "late needs never, which is pending (the wait was ended by terminated after ")
		st, err := runstate.Inspect(run)
		require.NoError(t, err)
		assert.Empty(t, st.Sessions, "the waiting session was closed")
		break
	}
}

// effect -wait waits while another session attempts the key, then prints
// the receipt that session recorded, and sends nothing again.
func TestEffectWaitsForAnotherSessionsAttempt(t *testing.T) {
	dir, work := shellRun(t, "a")
	started, goFile, outbox := filepath.Join(work, "started"), filepath.Join(work, "go"), filepath.Join(work, "outbox")
	send := `touch "$0"; while [ ! -e "$1" ]; do sleep 0.02; done; echo sent >> "$2"; echo '{"id": 7}'`
	first := startCLI(t, "effect", dir, "notify", "--", "sh", "-c", send, started, goFile, outbox)
	waitFile(t, started)

	r := runCLI(t, "effect", dir, "notify", "--", "sh", "-c", `echo again >> "$0"; echo '{"id": 8}'`, outbox)
	assert.Equal(t, exitBusy, r.code, "without -wait: at once; %s", r.err)

	// -timeout bounds each wait for the ledger lock, not the wait for
	// the other session: it is paused between tries.
	second := startCLI(t, "effect", dir, "notify", "-wait", "60s", "-timeout", "300ms", "--", "sh", "-c", `echo again >> "$0"; echo '{"id": 8}'`, outbox)
	waitStderr(t, second, "runstate effect: notify: waiting (at most ")
	time.Sleep(700 * time.Millisecond)
	require.NoError(t, os.WriteFile(goFile, nil, 0o644))
	first.wait(t)
	require.Equal(t, 0, first.code, first.errb.String())
	second.wait(t)
	require.Equal(t, 0, second.code, second.errb.String())
	assert.Equal(t, `{"id":7}`+"\n", second.out.String(), "the receipt the first recorded")
	data, err := os.ReadFile(outbox)
	require.NoError(t, err)
	assert.Equal(t, "sent\n", string(data), "sent once")
}

// A negative -wait is a usage error.
func TestWaitMustNotBeNegative(t *testing.T) {
	dir, _ := shellRun(t, "a")
	r := execCLI(t, dir, "a", []string{"-wait", "-1s"}, "true")
	assert.Equal(t, exitUsage, r.code, r.err)
	assert.Contains(t, r.err, "-wait must not be negative")
	r = runCLI(t, "effect", dir, "k", "-wait", "-1s", "--", "true")
	assert.Equal(t, exitUsage, r.code, r.err)
	assert.Contains(t, r.err, "-wait must not be negative")
}

// A signal that comes while a try of -wait is under way (Begin waiting
// for the ledger lock that another process holds) does what it does
// without -wait: it ends the process, and the command does not run.
func TestExecSignalDuringATryOfWaitIsNotSwallowed(t *testing.T) {
	dir, work := shellRun(t, "slow")
	started, count := filepath.Join(work, "started"), filepath.Join(work, "count")
	a := startCLI(t, "exec", dir, "slow", "--", "sh", "-c", `touch "$0"; sleep 60`, started)
	waitFile(t, started)
	b := startCLI(t, append([]string{"exec", dir, "slow", "-wait", "60s", "--"}, counted(count, "ran", "")...)...)
	waitStderr(t, b, "waiting (at most")

	f, err := os.OpenFile(filepath.Join(dir, "logs", "ledger.lock"), os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX)) // b's next try waits for it
	require.NoError(t, a.cmd.Process.Kill())                        // and finds the stage's session dead
	<-a.done
	time.Sleep(maxPause + 500*time.Millisecond) // b is in a try, waiting for the lock
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGINT))
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_UN))
	b.wait(t)
	assert.NotEqual(t, 0, b.code, b.errb.String())
	_, err = os.Stat(count)
	assert.ErrorIs(t, err, os.ErrNotExist, "the command did not run after the SIGINT")
}

// exec -wait does not wait for an -after stage that no session will
// finish without a person (failed fatally, or awaiting approval).
func TestExecDoesNotWaitForAStageThatNeedsAPerson(t *testing.T) {
	dir, work := shellRun(t, "fetch", "build")
	r := execCLI(t, dir, "fetch", []string{"-fatal-exit", "3"}, "sh", "-c", "exit 3")
	require.Equal(t, 3, r.code, r.err)
	t0 := time.Now()
	r = execCLI(t, dir, "build", []string{"-after", "fetch", "-wait", "60s"}, counted(filepath.Join(work, "count"), "", "")...)
	assert.Less(t, time.Since(t0), 10*time.Second)
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "runstate exec: build: not waiting: fetch is fatal, which needs a person")
	assert.NotContains(t, r.err, "waiting (at most")
}

// An -after stage that is the stage itself can never be done before it
// begins: exec refuses it at once (a usage error, nothing recorded),
// instead of waiting all of -wait D for it ("b needs b, which is
// pending").
func TestExecAfterItselfIsRefusedNotWaitedFor(t *testing.T) {
	dir, work := shellRun(t, "b")
	t0 := time.Now()
	r := execCLI(t, dir, "b", []string{"-after", "b", "-wait", "60s"}, counted(filepath.Join(work, "count"), "", "")...)
	assert.Less(t, time.Since(t0), 10*time.Second, "not waited for")
	assert.Equal(t, exitUsage, r.code, r.err)
	assert.NotContains(t, r.err, "waiting (at most")
	assert.Contains(t, r.err, "runstate exec: -after b names the stage itself: drop it, or name the stage that b needs\nusage: runstate exec")
}
