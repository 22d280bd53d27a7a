package cli

import (
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
	} {
		start := time.Now()
		res := runCLI(t, args...)
		assert.Equal(t, exitFail, res.code, "runstate %v: %s", args, res.err)
		assert.Less(t, time.Since(start), 10*time.Second, "runstate %v", args)
		assert.Contains(t, res.err, "gave up waiting for "+filepath.Join(dir, "logs", "ledger.lock"), "runstate %v", args)
		if runtime.GOOS == "linux" {
			assert.Contains(t, res.err, fmt.Sprintf("pid %d", os.Getpid()), "runstate %v names the holder", args)
		}
	}
	assert.Equal(t, before, tree(t, dir), "nothing was written")
	assert.Contains(t, runCLI(t, "approve", "-h").out, "-timeout")
}
