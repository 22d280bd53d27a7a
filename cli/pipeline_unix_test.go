//go:build unix

package cli

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

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
