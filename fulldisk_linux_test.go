package runstate_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallDisk mounts an 8 MiB tmpfs for the test, where root may mount one.
func smallDisk(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// On a real file system that is full: WriteFile fails with ENOSPC, the
// failure does not count toward MaxAttempts, and once the output fits the
// stage completes, without a person.
func TestFullDiskOnARealFileSystemIsNotTheStagesFault(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(smallDisk(t), "run")
	r, err := runstate.Open(dir, &runstate.Options{Request: "full disk", MaxAttempts: 2})
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() }) // before the umount, also when an assertion stops the test

	size := 16 << 20 // more than the disk holds
	stage := func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/big.bin", bytes.Repeat([]byte("x"), size))
	}
	for i := 0; i < 3; i++ {
		err := r.Do(ctx, "build", stage)
		require.ErrorIs(t, err, syscall.ENOSPC, "attempt %d", i+1)
		assert.NotErrorIs(t, err, runstate.ErrNeedsPerson)
	}
	st, err := r.Status()
	require.NoError(t, err)
	b, _ := st.Stage("build")
	assert.Equal(t, runstate.StateFailed, b.State, "not awaiting a person")
	assert.Zero(t, b.Failures)
	assert.Empty(t, st.Blockers)

	size = 1 << 10 // space enough now
	require.NoError(t, r.Do(ctx, "build", stage))
	require.NoError(t, r.Close())
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}
