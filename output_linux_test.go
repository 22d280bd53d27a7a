package runstate

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate/internal/unnamed"
)

// A new output is written as an unnamed file (O_TMPFILE) and linked in
// under its name, by either way of linking; an output that exists is
// replaced through logs/tmp; where neither way links, the temp file is
// used for new outputs too. Each leaves the whole data under the name,
// with the mode os.Root would give it, and nothing in logs/tmp.
func TestOutputUnnamedFile(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "unnamed", NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mode-probe"), nil, 0o644))
	probe, err := os.Stat(filepath.Join(dir, "mode-probe"))
	require.NoError(t, err)
	check := func(rel string, data []byte) {
		t.Helper()
		fi, err := os.Stat(filepath.Join(dir, rel))
		require.NoError(t, err)
		assert.Equal(t, probe.Mode(), fi.Mode(), "%s: the mode os.Root gives a new file", rel)
		got, err := os.ReadFile(filepath.Join(dir, rel))
		require.NoError(t, err)
		assert.Equal(t, data, got, rel)
		ents, err := os.ReadDir(filepath.Join(dir, tmpDir))
		require.NoError(t, err)
		assert.Empty(t, ents, "%s: nothing left in logs/tmp", rel)
	}

	require.Zero(t, r.out.fast.link.Load(), "no way learnt before the first output")
	require.True(t, r.out.fast.write("first.txt", "t1", []byte("first"), 0o644))
	check("first.txt", []byte("first"))
	way := r.out.fast.link.Load()
	assert.Contains(t, []int{unnamed.EmptyPath, unnamed.Proc}, way, "a new output is linked in, here")

	// An output that exists is replaced (a link cannot), the way kept:
	// exchanged with a temp file, or where that is not supported renamed
	// over. Either way a hard link to the old file keeps the old bytes,
	// as a rename would leave them.
	require.NoError(t, os.Link(filepath.Join(dir, "first.txt"), filepath.Join(dir, "first-alias")))
	require.True(t, r.out.fast.write("first.txt", "t2", []byte("second, longer"), 0o644))
	check("first.txt", []byte("second, longer"))
	assert.Equal(t, way, r.out.fast.link.Load(), "replacing an output does not change the way")
	assert.False(t, r.out.fast.noExchange.Load(), "this file system exchanges two names")
	old, err := os.ReadFile(filepath.Join(dir, "first-alias"))
	require.NoError(t, err)
	assert.Equal(t, "first", string(old), "the old file, unlinked from the output's name only")
	r.out.fast.noExchange.Store(true)
	require.True(t, r.out.fast.write("first.txt", "t3", []byte("third"), 0o644))
	check("first.txt", []byte("third"))
	r.out.fast.noExchange.Store(false)

	for _, c := range []struct {
		how  int
		name string
	}{{unnamed.EmptyPath, "empty-path.txt"}, {unnamed.Proc, "proc.txt"}, {unnamed.None, "temp.txt"}} {
		if c.how == unnamed.EmptyPath && way == unnamed.Proc {
			continue // refused here: the first write found so
		}
		r.out.fast.link.Store(c.how)
		data := []byte("written with link way " + c.name)
		require.True(t, r.out.fast.write(c.name, "t-"+c.name, data, 0o644), c.name)
		check(c.name, data)
		assert.Equal(t, c.how, r.out.fast.link.Load(), "%s: the way that worked is kept", c.name)
	}
}

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
			assert.Equal(t, c.fast, r.out.fast.write(c.rel, r.session+"-probe", data, 0o644), "fast path")
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
	assert.DirExists(t, filepath.Join(dir, "isdir"), "the directory in the way is left where it was")

	// After Close the fast path declines (the directories are closed).
	require.NoError(t, r.Close())
	assert.False(t, r.out.fast.write("late.txt", "x", []byte("late"), 0o644))
	assert.NoFileExists(t, filepath.Join(dir, "late.txt"))
}
