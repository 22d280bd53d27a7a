package unnamed

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	require.NoError(t, err)
	defer d.Close()
	dirFd := int(d.Fd())
	names := func() []string {
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}

	way, err := Write(dirFd, "a.txt", []byte("alpha"), 0o644, EmptyPath)
	require.NoError(t, err)
	assert.Contains(t, []int{EmptyPath, Proc}, way, "linked in one of the two ways here")
	got, err := os.ReadFile(filepath.Join(dir, "a.txt"))
	require.NoError(t, err)
	assert.Equal(t, "alpha", string(got))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "probe"), nil, 0o644))
	a, err := os.Stat(filepath.Join(dir, "a.txt"))
	require.NoError(t, err)
	probe, err := os.Stat(filepath.Join(dir, "probe"))
	require.NoError(t, err)
	assert.Equal(t, probe.Mode(), a.Mode(), "the mode a new file gets")

	// A name that exists: EEXIST, the way kept, the file untouched,
	// nothing else left in the directory.
	w, err := Write(dirFd, "a.txt", []byte("other"), 0o644, way)
	assert.ErrorIs(t, err, syscall.EEXIST)
	assert.Equal(t, way, w)
	got, err = os.ReadFile(filepath.Join(dir, "a.txt"))
	require.NoError(t, err)
	assert.Equal(t, "alpha", string(got))
	assert.ElementsMatch(t, []string{"a.txt", "probe"}, names())

	// Through /proc.
	w, err = Write(dirFd, "b.txt", []byte("beta"), 0o644, Proc)
	require.NoError(t, err)
	assert.Equal(t, Proc, w)
	got, err = os.ReadFile(filepath.Join(dir, "b.txt"))
	require.NoError(t, err)
	assert.Equal(t, "beta", string(got))

	// An empty file, and a directory that is not one.
	_, err = Write(dirFd, "empty", nil, 0o644, way)
	require.NoError(t, err)
	fi, err := os.Stat(filepath.Join(dir, "empty"))
	require.NoError(t, err)
	assert.Zero(t, fi.Size())
	f, err := os.Open(filepath.Join(dir, "probe"))
	require.NoError(t, err)
	defer f.Close()
	w, err = Write(int(f.Fd()), "c.txt", []byte("gamma"), 0o644, way)
	assert.ErrorIs(t, err, syscall.ENOTDIR)
	assert.Equal(t, way, w, "a failure of this file's keeps the way")
	assert.ElementsMatch(t, []string{"a.txt", "b.txt", "empty", "probe"}, names())
}

// A Way learns the way at its first write and keeps it; once it is None
// it tries nothing.
func TestWay(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	require.NoError(t, err)
	defer d.Close()
	var w Way
	require.Zero(t, w.Load())
	require.NoError(t, w.Write(int(d.Fd()), "a", []byte("a"), 0o644))
	learnt := w.Load()
	assert.Contains(t, []int{EmptyPath, Proc}, learnt)
	assert.ErrorIs(t, w.Write(int(d.Fd()), "a", []byte("b"), 0o644), syscall.EEXIST)
	assert.Equal(t, learnt, w.Load(), "a failure of this file's keeps the way")
	w.Store(None)
	assert.ErrorIs(t, w.Write(int(d.Fd()), "b", []byte("b"), 0o644), ErrUnsupported)
	assert.NoFileExists(t, filepath.Join(dir, "b"))

	// A file system without O_TMPFILE (proc): learnt as None, and said so.
	proc, err := os.Open("/proc")
	require.NoError(t, err)
	defer proc.Close()
	var fresh Way
	assert.ErrorIs(t, fresh.Write(int(proc.Fd()), "x", nil, 0o644), ErrUnsupported)
	assert.Equal(t, None, fresh.Load())
}

// Exchange swaps two names atomically, in one directory or across two,
// and fails with ENOENT when either is missing, changing nothing.
func TestExchange(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "tmp"), 0o755))
	d, err := os.Open(dir)
	require.NoError(t, err)
	defer d.Close()
	tmp, err := os.Open(filepath.Join(dir, "tmp"))
	require.NoError(t, err)
	defer tmp.Close()
	read := func(rel string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, rel))
		require.NoError(t, err)
		return string(b)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "out.txt"), []byte("old"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tmp", "new"), []byte("new"), 0o644))
	require.NoError(t, Exchange(int(tmp.Fd()), "new", int(d.Fd()), "out.txt"))
	assert.Equal(t, "new", read("out.txt"))
	assert.Equal(t, "old", read("tmp/new"))

	err = Exchange(int(tmp.Fd()), "missing", int(d.Fd()), "out.txt")
	assert.ErrorIs(t, err, syscall.ENOENT)
	assert.Equal(t, "new", read("out.txt"), "a failed exchange changes nothing")
}
