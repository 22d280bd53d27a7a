//go:build unix

package cli

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A session whose lock file cannot be tried (another user's run: the file
// is 0600) is taken for alive, the safe side, but status does not say it
// is alive: it says it cannot tell, and why. Here the lock file is a
// socket, which open refuses to the root user too.
func TestStatusSaysWhenItCannotTellASession(t *testing.T) {
	dir, r := newRun(t)
	t.Cleanup(func() { r.Close() })
	_, err := r.Begin(context.Background(), "execute", runstate.After("plan"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the session's own republish, first
		b, _ := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
		return strings.Contains(string(b), "execute (running")
	}, 10*time.Second, time.Millisecond)
	lock := filepath.Join(dir, "logs", "sessions", r.Session()+".lock")
	require.NoError(t, os.Remove(lock))
	t.Chdir(filepath.Dir(lock)) // a socket's path is short
	l, err := net.Listen("unix", filepath.Base(lock))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })

	res := runCLI(t, "status", dir) // not readCLI: it cannot hash a socket
	assert.Equal(t, 0, res.code, "taken for alive: nothing blocks")
	assert.NotContains(t, res.out, ", alive)")
	assert.Contains(t, res.out, "sessions  "+short(r.Session())+" (pid ")
	assert.Contains(t, res.out, ", alive or gone: cannot tell)")
	assert.Contains(t, res.out, "note      cannot tell whether session "+short(r.Session())+" is alive (open "+lock+": ")
	assert.Contains(t, res.out, "it is taken for alive, so a stage it began is not shown interrupted; run status as the user that runs the run's sessions")

	res = runCLI(t, "status", "-json", dir)
	assert.Contains(t, res.err, "runstate: cannot tell whether session "+short(r.Session())+" is alive")
	var s statusJSON
	require.NoError(t, json.Unmarshal([]byte(res.out), &s), "stdout stays one JSON value")
}

// ls says of a run what status says: a stage begun by a session whose
// lock file cannot be tried (another user's) is neither running nor
// interrupted, but unknown, and why; it showed a killed run as running.
// Here the session is gone, as a killed process leaves it, and its lock
// file is a socket, which open refuses to the root user too.
func TestLsSaysWhenItCannotTellASession(t *testing.T) {
	dir, r := deadSessionRun(t)
	lock := filepath.Join(dir, "logs", "sessions", r.Session()+".lock")
	require.NoError(t, os.Remove(lock))
	root := filepath.Dir(dir)
	t.Chdir(filepath.Dir(lock)) // a socket's path is short
	l, err := net.Listen("unix", filepath.Base(lock))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })

	res := runCLI(t, "status", dir)
	assert.Contains(t, res.out, "note      cannot tell whether session "+short(r.Session())+" is alive (open "+lock+": ")

	res = runCLI(t, "ls", root) // not readCLI: it cannot hash a socket
	assert.Equal(t, 0, res.code, res.err)
	lines := strings.Split(strings.TrimSuffix(res.out, "\n"), "\n")
	require.Len(t, lines, 2, res.out)
	assert.Regexp(t, `  2/4   unknown  execute unknown: cannot tell whether session `+short(r.Session())+`, wh\.\.\.  `, lines[1])
	assert.NotContains(t, lines[1], "running")

	res = runCLI(t, "ls", "-json", root)
	var runs []lsRun
	require.NoError(t, json.Unmarshal([]byte(res.out), &runs), res.out)
	require.Len(t, runs, 1)
	assert.Equal(t, "unknown", runs[0].State)
	require.NotNil(t, runs[0].Blocker)
	assert.Equal(t, "execute", runs[0].Blocker.Stage)
	assert.Equal(t, "unknown", runs[0].Blocker.Kind)
	assert.Contains(t, runs[0].Blocker.Reason, "cannot tell whether session "+short(r.Session())+", which began attempt 1, is alive (open "+lock+": ")
	assert.Equal(t, "run ls or status as the user that runs the run's sessions: it tells a running stage from an interrupted one", runs[0].Blocker.Action)
}
