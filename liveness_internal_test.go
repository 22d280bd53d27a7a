package runstate

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDeadNeedsProof: a session whose lock file is missing counts as gone
// only when it closed, or when its open record names this host and a pid
// that no longer exists (or this process, which does not have it open).
// Anything else (another host, a pid that exists) is alive.
func TestDeadNeedsProof(t *testing.T) {
	r, err := Open(t.TempDir(), &Options{Request: "liveness", NoSync: true})
	require.NoError(t, err)
	defer r.Close()

	exited := exec.Command(os.Args[0], "-test.run=^$")
	require.NoError(t, exited.Run())
	live := os.Getppid()
	require.False(t, processGone(live))
	require.True(t, processGone(exited.Process.Pid), "pid %d was reused meanwhile", exited.Process.Pid)

	cases := []struct {
		name  string
		ss    *SessionStatus // nil: the session closed
		alive bool
	}{
		{"closed", nil, false},
		{"this host, its process gone", &SessionStatus{PID: exited.Process.Pid, Host: r.host}, false},
		{"this process, not open here", &SessionStatus{PID: os.Getpid(), Host: r.host}, false},
		{"this host, a live pid", &SessionStatus{PID: live, Host: r.host}, true},
		{"another host", &SessionStatus{PID: exited.Process.Pid, Host: "elsewhere.example"}, true},
		{"no host recorded", &SessionStatus{PID: exited.Process.Pid}, true},
	}
	for _, c := range cases {
		id := "0000-" + c.name
		r.stMu.Lock()
		if c.ss != nil {
			c.ss.ID = id
			r.st.sessions[id] = c.ss
		}
		got := fileStoreOf(r).alive(id)
		delete(r.st.sessions, id)
		r.stMu.Unlock()
		assert.Equal(t, c.alive, got, "%s: alive", c.name)
	}
}
