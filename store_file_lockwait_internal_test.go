//go:build unix

package runstate

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gofrs/flock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lockHolderEnv makes the test binary a child that takes the file lock on
// the path it names, says so, and sleeps.
const lockHolderEnv = "RUNSTATE_TEST_LOCK_HOLDER"

// startLockHolder starts a child process that holds logs/ledger.lock of
// dir, and SIGSTOPs it, as a paused container or a debugger would. It is
// continued and killed when the test ends.
func startLockHolder(t *testing.T, dir string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), lockHolderEnv+"="+filepath.Join(dir, filepath.FromSlash(lockFile)))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	stopped := false
	t.Cleanup(func() {
		if stopped {
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "locked\n", line)
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stopped = true
	return cmd.Process.Pid
}

func holdLockAndSleep(path string) {
	if err := flock.New(path).Lock(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println("locked")
	time.Sleep(time.Hour)
}

// TestLockWaitsAreBoundedAndNameTheHolder: with logs/ledger.lock held by a
// stopped process, every call that waits for it gives up when its context
// (or Options.LockTimeout) says so, records nothing, and names the pid
// that holds the lock; the long wait is logged with it. Once the holder is
// gone, the run goes on.
func TestLockWaitsAreBoundedAndNameTheHolder(t *testing.T) {
	if p := os.Getenv(lockHolderEnv); p != "" {
		holdLockAndSleep(p)
		return
	}
	checkLeaks(t)
	dir := t.TempDir()
	ctx := context.Background()
	log := &logBuffer{}
	opts := &Options{Request: "lock waits", LockTimeout: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(log, nil))}
	r, err := Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, r.Plan(ctx, "a", "b"))
	require.NoError(t, r.Do(ctx, "b", func(context.Context, *Stage) error { return nil }))
	before := len(records(t, dir))
	lockWarnAfter.Store(int64(100 * time.Millisecond))
	t.Cleanup(func() { lockWarnAfter.Store(int64(2 * time.Second)) })
	pid := startLockHolder(t, dir)

	bounded := func(what string, call func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := call(ctx)
		d := time.Since(start)
		require.Error(t, err, what)
		assert.ErrorIs(t, err, ErrLockTimeout, what)
		assert.ErrorIs(t, err, context.DeadlineExceeded, what)
		assert.Contains(t, err.Error(), fmt.Sprintf("pid %d", pid), "%s names the holder", what)
		assert.Contains(t, err.Error(), "logs/ledger.lock", what)
		assert.Less(t, d, 5*time.Second, "%s waited %s", what, d)
	}
	ran := false
	bounded("Begin", func(ctx context.Context) error { _, err := r.Begin(ctx, "a"); return err })
	bounded("Do", func(ctx context.Context) error {
		return r.Do(ctx, "a", func(context.Context, *Stage) error { ran = true; return nil })
	})
	bounded("Effect", func(ctx context.Context) error {
		_, err := r.Effect(ctx, "k", Effect{Do: func(context.Context, string) (json.RawMessage, error) {
			ran = true
			return nil, nil
		}})
		return err
	})
	bounded("Plan", func(ctx context.Context) error { return r.Plan(ctx, "a", "b", "c") })
	bounded("Skip", func(ctx context.Context) error { return r.Skip(ctx, "a", "why") })
	bounded("Approve", func(ctx context.Context) error { return r.Approve(ctx, "a", "me", "") })
	bounded("Invalidate", func(ctx context.Context) error { return r.Invalidate(ctx, "b", "why") })
	bounded("Resolve", func(ctx context.Context) error {
		return r.Resolve(ctx, "k", Resolution{By: "me"})
	})
	bounded("Refresh", r.Refresh)
	assert.False(t, ran, "no stage function or Do ran")

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = r.Begin(cctx, "a")
	assert.ErrorIs(t, err, context.Canceled, "a cancelled wait")

	bounded("Open", func(context.Context) error {
		r2, err := Open(dir, opts)
		if err == nil {
			r2.Close()
		}
		return err
	})
	start := time.Now()
	err = r.Close()
	assert.ErrorIs(t, err, ErrLockTimeout, "Close waits at most LockTimeout")
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.ErrorIs(t, r.Plan(ctx, "x"), ErrClosed)
	assert.Contains(t, log.String(), "still waiting for the ledger lock")
	assert.Contains(t, log.String(), fmt.Sprintf("pid %d", pid), "the log names the holder")

	// The holder is gone: the next session goes on, and finds nothing
	// that the calls which gave up would have recorded.
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	r, err = Open(dir, &Options{Request: "lock waits"})
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "a", func(context.Context, *Stage) error { return nil }))
	require.NoError(t, r.Close())
	var evs []string
	for _, rec := range records(t, dir)[before:] {
		evs = append(evs, strings.TrimSpace(rec.Ev+" "+rec.Stage+rec.Key))
	}
	assert.Equal(t, []string{"interrupted", "open", "begin a", "complete a", "close"}, evs,
		"the session whose close record could not be written is found gone")
}
