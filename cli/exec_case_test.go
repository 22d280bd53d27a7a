package cli

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// foldFS is the directory dir as a file system that ignores case sees it
// (macOS's and Windows's by default): each part of a name is found under
// any spelling, its own first. No file system on the machines that run
// these tests ignores case, and tmpfs and ext4 need a kernel built for it.
type foldFS struct{ dir string }

// real is the path under which dir keeps name: each part the entry of its
// own name, else the first whose name differs only in case, else name's
// own (which does not exist).
func (f foldFS) real(name string) string {
	p := f.dir
	for part := range strings.SplitSeq(name, "/") {
		if part == "." {
			continue
		}
		entries, _ := os.ReadDir(p)
		found := part
		for _, e := range entries {
			if e.Name() == part {
				found = part
				break
			}
			if found == part && strings.EqualFold(e.Name(), part) {
				found = e.Name()
			}
		}
		p = filepath.Join(p, found)
	}
	return p
}

func (f foldFS) Open(name string) (fs.File, error)          { return os.Open(f.real(name)) }
func (f foldFS) Stat(name string) (fs.FileInfo, error)      { return os.Stat(f.real(name)) }
func (f foldFS) Lstat(name string) (fs.FileInfo, error)     { return os.Lstat(f.real(name)) }
func (f foldFS) ReadLink(name string) (string, error)       { return os.Readlink(f.real(name)) }
func (f foldFS) ReadDir(name string) ([]fs.DirEntry, error) { return os.ReadDir(f.real(name)) }

func TestSpelledAs(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"exec/Build.stdout", "exec/A/b.stdout", "exec/c.stdout", "exec/C.STDOUT"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(p), 0o644))
	}
	for _, c := range []struct {
		fsys       fs.StatFS
		path, want string
	}{
		// A file system that tells case apart finds each name as its own,
		// or not at all.
		{osDir(dir), "exec/build.stdout", ""},
		{osDir(dir), "exec/Build.stdout", ""},
		{osDir(dir), "exec/a/b.stdout", ""},
		{osDir(dir), "exec/c.stdout", ""}, // C.STDOUT is there too: read, and not this one
		// One that ignores case finds another stage's file.
		{foldFS{dir}, "exec/build.stdout", "exec/Build.stdout"},
		{foldFS{dir}, "exec/BUILD.stdout", "exec/Build.stdout"},
		{foldFS{dir}, "exec/a/b.stdout", "exec/A/b.stdout"},
		{foldFS{dir}, "exec/a/B.stdout", "exec/A/b.stdout"},
		// Its own, or a file in another spelling of a directory that is
		// no other stage's file, is no other name.
		{foldFS{dir}, "exec/Build.stdout", ""},
		{foldFS{dir}, "exec/c.stdout", ""},
		{foldFS{dir}, "exec/a/new.stdout", ""},
		{foldFS{dir}, "exec/new.stdout", ""},
	} {
		got, err := spelledAs(c.fsys, c.path)
		require.NoError(t, err, c.path)
		assert.Equal(t, c.want, got, "%T %s", c.fsys, c.path)
	}
	// A directory that cannot be read is an error, not a collision left
	// unseen.
	if os.Geteuid() != 0 {
		require.NoError(t, os.Chmod(filepath.Join(dir, "exec"), 0o311))
		t.Cleanup(func() { _ = os.Chmod(filepath.Join(dir, "exec"), 0o755) })
		_, err := spelledAs(foldFS{dir}, "exec/c.stdout")
		assert.True(t, errors.Is(err, fs.ErrPermission), "%v", err)
	}
}

// Two stages whose names differ only in case run side by side where the
// file system tells case apart. Where it does not, the second is refused
// before its begin, with nothing recorded: its attempt would have replaced
// the first one's recorded output (exec removes the old file and creates
// its own), and the first would have been redone on the next run, and
// then the second. A stage's own file from an earlier attempt is no other
// stage's there.
func TestExecStagesWhoseNamesDifferOnlyInCase(t *testing.T) {
	dir, work := shellRun(t, "Build", "build", "test")
	out := `echo "out of $RUNSTATE_STAGE"`
	for _, stage := range []string{"Build", "build"} {
		r := execCLI(t, dir, stage, nil, "sh", "-c", out)
		require.Equal(t, exitOK, r.code, "%s: %s", stage, r.err)
	}
	for _, stage := range []string{"Build", "build"} {
		assert.Equal(t, runstate.StateComplete, stageStatus(t, dir, stage).State, stage)
		b, err := os.ReadFile(filepath.Join(dir, "exec", stage+".stdout"))
		require.NoError(t, err)
		assert.Equal(t, "out of "+stage+"\n", string(b))
	}

	dir, _ = shellRun(t, "Build", "build", "test")
	r := execCLI(t, dir, "Build", nil, "sh", "-c", out)
	require.Equal(t, exitOK, r.code, r.err)
	r = execCLI(t, dir, "test", nil, "false")
	require.Equal(t, 1, r.code, r.err)

	// exec in this process (Run), where the file system is osDir's.
	real := osDir
	osDir = func(dir string) fs.StatFS { return foldFS{dir} }
	t.Cleanup(func() { osDir = real })
	count := filepath.Join(work, "count")
	before := len(ledgerLines(t, dir))
	r = execHere(t, dir, "build", counted(count, "", "")...)
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "runstate: exec/build.stdout, where exec keeps the output of stage build, is exec/Build.stdout on this file system, which ignores case: the output of stage Build, which exec would replace; rename one of the two stages (their names differ only in case), then run the stage again; nothing recorded")
	assert.Equal(t, 0, lines(t, count), "the command did not run")
	for _, line := range ledgerLines(t, dir)[before:] { // the session's open and close
		assert.NotContains(t, line, `"stage":"build"`, "nothing recorded of the stage")
	}
	b, err := os.ReadFile(filepath.Join(dir, "exec", "Build.stdout"))
	require.NoError(t, err)
	assert.Equal(t, "out of Build\n", string(b), "Build's output is its own")
	r = execHere(t, dir, "Build", "false")
	assert.Equal(t, exitOK, r.code, "Build is done and its output holds: %s", r.err)

	r = execHere(t, dir, "test", "sh", "-c", out)
	assert.Equal(t, exitOK, r.code, "test's own file from its failed attempt is no other stage's: %s", r.err)
	assert.Equal(t, runstate.StateComplete, stageStatus(t, dir, "test").State)
}

// execHere runs exec in this process, as Run does for a program that
// embeds the command.
func execHere(t *testing.T, dir, stage string, argv ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(append([]string{"exec", dir, stage, "--"}, argv...), &out, &errb, nil)
	return result{out.String(), errb.String(), code}
}
