//go:build unix

package cli

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An -in that is not a regular file (bash's <(cmd), /dev/null) is a
// usage error, refused before a session opens, in the command's terms
// (-value). It was refused by Begin, after the open record, with advice
// to use the library's Value.
func TestInThatIsNotAFileIsAUsageError(t *testing.T) {
	dir, work := shellRun(t, "a")
	fifo := filepath.Join(work, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	before := ledgerLines(t, dir)
	for in, kind := range map[string]string{fifo: "a named pipe (a FIFO, or <(...) in the shell)", os.DevNull: "a device"} {
		for _, args := range [][]string{
			{"exec", dir, "a", "-in", in, "--", "true"},
			{"await", dir, "a", "-reason", "look", "-in", in},
		} {
			r := runCLIWithin(t, 20*time.Second, args...)
			assert.Equal(t, exitUsage, r.code, "%v: %s", args, r.err)
			assert.Contains(t, r.err, "runstate "+args[0]+": -in "+in+" is "+kind+", not a regular file: an input is read whole when the stage begins and again when it ends; give what it holds as -value NAME=TEXT, or copy it to a file first\nusage:")
		}
	}
	assert.Equal(t, before, ledgerLines(t, dir), "nothing recorded, not even a session")
}

// An -out inside the run directory given by another name of it (DIR is a
// symbolic link, or the path goes through one: macOS's /tmp is
// /private/tmp, pwd -P) is inside: the stage runs and records it. exec
// refused it as "not inside the run directory" (exit 2).
func TestExecOutThroughAnotherNameOfTheRun(t *testing.T) {
	dir, work := shellRun(t, "a", "b")
	link := filepath.Join(work, "link")
	require.NoError(t, os.Symlink(dir, link))
	write := []string{"sh", "-c", `mkdir -p "$RUNSTATE_DIR/out" && echo hi > "$RUNSTATE_DIR/out/$RUNSTATE_STAGE.txt"`}
	for stage, c := range map[string]struct{ dir, out string }{
		"a": {link, filepath.Join(dir, "out", "a.txt")},
		"b": {dir, filepath.Join(link, "out", "b.txt")},
	} {
		r := execCLI(t, c.dir, stage, []string{"-out", c.out}, write...)
		require.Equal(t, exitOK, r.code, "%s: %s", stage, r.err)
		s := stageStatus(t, dir, stage)
		assert.Equal(t, runstate.StateComplete, s.State)
		var paths []string
		for _, o := range s.Outputs {
			paths = append(paths, o.Path)
		}
		assert.Contains(t, paths, "out/"+stage+".txt", "%s", stage)
	}
	r := execCLI(t, link, "c", []string{"-out", filepath.Join(work, "x")}, "true")
	assert.Equal(t, exitUsage, r.code, "outside is still outside: %s", r.err)
	assert.Contains(t, r.err, "-out "+filepath.Join(work, "x")+" is not inside the run directory "+link)
}
