package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/gofrs/flock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The writing commands wait for the ledger lock at most -timeout, change
// nothing when they give up, and say which process holds it.
func TestWritingCommandsGiveUpOnAHeldLockAndNameTheHolder(t *testing.T) {
	dir := awaitingRun(t)
	lock := flock.New(filepath.Join(dir, "logs", "ledger.lock"))
	require.NoError(t, lock.Lock())
	defer lock.Unlock()
	before := tree(t, dir)
	for _, args := range [][]string{
		{"approve", dir, "execute", "-by", "reviewer", "-timeout", "300ms"},
		{"invalidate", dir, "plan", "-reason", "re-scoped", "-timeout", "300ms"},
		{"repair", "-timeout", "300ms", dir},
		{"exec", dir, "verify", "-timeout", "300ms", "--", "true"},
		{"plan", dir, "a", "b", "-timeout", "300ms"},
		{"skip", dir, "verify", "-reason", "not needed", "-timeout", "300ms"},
		{"await", dir, "verify", "-reason", "read it", "-timeout", "300ms"},
		{"effect", dir, "notify", "-timeout", "300ms", "--", "true"},
	} {
		start := time.Now()
		res := runCLI(t, args...)
		want := exitFail
		if lookup(args[0]).dirOnly && args[0] != "repair" { // the pipeline commands
			want = exitRunstate
		}
		assert.Equal(t, want, res.code, "runstate %v: %s", args, res.err)
		assert.Less(t, time.Since(start), 10*time.Second, "runstate %v", args)
		assert.Contains(t, res.err, "gave up waiting for "+filepath.Join(dir, "logs", "ledger.lock"), "runstate %v", args)
		if runtime.GOOS == "linux" {
			assert.Contains(t, res.err, fmt.Sprintf("pid %d", os.Getpid()), "runstate %v names the holder", args)
		}
	}
	assert.Equal(t, before, tree(t, dir), "nothing was written")
	for _, name := range []string{"approve", "exec", "plan", "skip", "await", "effect"} {
		assert.Contains(t, runCLI(t, "help", name).out, "[-timeout D]", name)
	}
}

// lockWait ends timeout after it was made or resumed, never while paused.
func TestLockWaitPausesWhileACommandRuns(t *testing.T) {
	// Half a second: a busy machine may stall between newLockWait and
	// pause, but not that long.
	w := newLockWait(500 * time.Millisecond)
	defer w.stop()
	w.pause()
	select {
	case <-w.Done():
		t.Fatal("ended while paused")
	case <-time.After(800 * time.Millisecond):
	}
	require.NoError(t, w.Err())
	w.resume()
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("did not end after resume")
	}
	assert.ErrorIs(t, w.Err(), context.DeadlineExceeded)
}
