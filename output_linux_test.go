package runstate

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Linux fast path of WriteFile writes ordinary outputs itself and
// declines, leaving nothing behind, whatever os.Root must handle: a
// missing directory, a symbolic link on the way (inside or leading out of
// the run), a directory where the file should go. Through WriteFile, each
// case then ends as os.Root decides.
func TestOutputFastPath(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "fast", NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	outside := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "real"), 0o755))
	require.NoError(t, os.Symlink("real", filepath.Join(dir, "inside")))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "escape")))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "isdir"), 0o755))

	for _, c := range []struct {
		rel  string
		fast bool // the fast path writes it
		ok   bool // WriteFile succeeds
	}{
		{"top.txt", true, true},
		{"a/b/deep.txt", true, true},
		{"new/dir/made.txt", false, true},  // os.Root makes the directory
		{"inside/linked.txt", false, true}, // a link that stays inside
		{"escape/out.txt", false, false},   // a link that leads out
		{"isdir", false, false},            // a directory is in the way
	} {
		t.Run(c.rel, func(t *testing.T) {
			data := []byte("data of " + c.rel)
			assert.Equal(t, c.fast, r.out.write(c.rel, r.session+"-probe", data), "fast path")
			if c.fast {
				got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(c.rel)))
				require.NoError(t, err)
				assert.Equal(t, data, got)
			}
			err := r.Do(context.Background(), "write "+c.rel, func(_ context.Context, st *Stage) error {
				return st.WriteFile(c.rel, data)
			})
			if !c.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(c.rel)))
			require.NoError(t, err)
			assert.Equal(t, data, got)
		})
	}
	ents, err := os.ReadDir(filepath.Join(dir, tmpDir))
	require.NoError(t, err)
	assert.Empty(t, ents, "no temp file left behind")
	_, err = os.Stat(filepath.Join(outside, "out.txt"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing written outside the run")
	assert.FileExists(t, filepath.Join(dir, "real", "linked.txt"))

	// After Close the fast path declines (the directories are closed).
	require.NoError(t, r.Close())
	assert.False(t, r.out.write("late.txt", "x", []byte("late")))
	assert.NoFileExists(t, filepath.Join(dir, "late.txt"))
}
