//go:build unix

package runstatetest_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

// TestExamineComparesLinksAndFIFOsWithoutFollowing: a run directory that
// holds a symbolic link to a directory (artifacts/latest -> v2), an
// absolute link into itself and a FIFO is compared without following the
// links or opening the FIFO: the same tree in two runs is no difference,
// another link target is one, named. Examine read every entry with
// os.ReadFile: it failed on the link to a directory ("is a directory",
// and CheckResumed ended the test), and blocked for ever on the FIFO.
func TestExamineComparesLinksAndFIFOsWithoutFollowing(t *testing.T) {
	build := func(target string) string {
		dir := t.TempDir()
		r, err := runstate.Open(dir, &runstate.Options{Request: "links", NoSync: true})
		require.NoError(t, err)
		require.NoError(t, r.Do(context.Background(), "a", func(_ context.Context, st *runstate.Stage) error {
			return st.WriteFile("artifacts/v2/report.txt", []byte("report"))
		}))
		require.NoError(t, r.Close())
		require.NoError(t, os.Symlink(target, filepath.Join(dir, "artifacts", "latest")))
		require.NoError(t, os.Symlink(filepath.Join(dir, "artifacts", "v2", "report.txt"), filepath.Join(dir, "artifacts", "abs")))
		require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "artifacts", "pipe"), 0o644))
		return dir
	}
	want, got, other := build("v2"), build("v2"), build("v1")
	examine := func(dir string) *runstatetest.Findings {
		t.Helper()
		done := make(chan *runstatetest.Findings, 1)
		go func() {
			f, err := runstatetest.Examine(dir, want)
			assert.NoError(t, err)
			done <- f
		}()
		select {
		case f := <-done:
			require.NotNil(t, f)
			return f
		case <-time.After(20 * time.Second):
			// Let a reader blocked on the FIFO go on.
			for _, d := range []string{want, got, other} {
				if fd, err := syscall.Open(filepath.Join(d, "artifacts", "pipe"), syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					syscall.Close(fd)
				}
			}
			t.Fatal("Examine has not returned after 20 s: it opened the FIFO")
			return nil
		}
	}
	f := examine(got)
	assert.True(t, f.OK(), "%s", f)
	f = examine(other)
	assert.Equal(t, []string{filepath.Join(other, "artifacts", "latest") + ": a symbolic link to v1, where the uninterrupted run's is a symbolic link to v2"}, f.Different)
}
