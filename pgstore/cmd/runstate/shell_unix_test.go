//go:build unix

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The shell example (examples/shell/pipeline.sh) with an address: two
// machines, each with its working directory, share the run. Machine 1 is
// SIGKILLed (the pipeline's whole process group) after its notification
// was appended to the outbox and before the receipt was recorded; machine
// 2 then runs the pipeline: it skips the three stages done on machine 1
// (their outputs restored in its directory), the check finds the
// notification, and it is not sent again. A third run on machine 1
// records nothing but its sessions' open and close.
func TestShellExampleSharesARunAcrossMachines(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("bash is needed for the shell example")
	}
	dsn := testDSN(t)
	addr := address(dsn, "shell")
	tmp := t.TempDir()
	src := filepath.Join(tmp, "gopkg")
	require.NoError(t, os.CopyFS(src, os.DirFS("../../../testdata/gopkg")))
	script, err := filepath.Abs("../../../examples/shell/pipeline.sh")
	require.NoError(t, err)
	path := filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH")
	outbox := filepath.Join(tmp, "outbox")
	start := func(work, delay string) (*exec.Cmd, *strings.Builder) {
		cmd := exec.Command("bash", script, src, work, outbox, addr)
		cmd.Env = append(os.Environ(), "PATH="+path, "NOTIFY_DELAY="+delay)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		require.NoError(t, cmd.Start())
		return cmd, &out
	}
	w1, w2 := filepath.Join(tmp, "m1", "work"), filepath.Join(tmp, "m2", "work")

	m1, out := start(w1, "60")
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if fi, err := os.Stat(outbox); err == nil && fi.Size() > 0 {
			break // the line is appended; notify.sh sleeps before it answers
		}
		require.True(t, time.Now().Before(deadline), "no notification within 2 minutes: %s", out)
	}
	require.NoError(t, syscall.Kill(-m1.Process.Pid, syscall.SIGKILL))
	_ = m1.Wait()
	killed := time.Now()
	db, err := pgstore.ConnectReadOnly(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	st, err := db.Inspect(context.Background(), "shell")
	require.NoError(t, err, out.String())
	for _, stage := range []string{"vet", "test", "report"} {
		s, _ := st.Stage(stage)
		require.Equal(t, runstate.StateComplete, s.State, "%s on machine 1: %s", stage, out)
	}

	// Machine 2. Until the server has seen machine 1's connections close,
	// the effect's key is held by a live session: exit 121, nothing
	// recorded, and the pipeline is run again.
	var m2 *exec.Cmd
	for {
		m2, out = start(w2, "0")
		err = m2.Wait()
		if m2.ProcessState.ExitCode() != 121 || time.Since(killed) > 30*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, err, out.String())
	for _, stage := range []string{"vet", "test", "report"} {
		assert.Contains(t, out.String(), "runstate exec: "+stage+": skipped: ")
	}
	assert.Contains(t, out.String(), "runstate effect: notify:report: the check found that it landed: confirmed, not sent again")
	assert.Contains(t, out.String(), `{"line":1}`)
	assert.FileExists(t, filepath.Join(w2, "cover.out"), "test's output restored on machine 2")
	assert.FileExists(t, filepath.Join(w2, "exec", "report.stdout"))
	lines, err := os.ReadFile(outbox)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(lines), "\n"), "the notification was sent once: %s", lines)

	count := func() map[string]int {
		evs := map[string]int{}
		require.NoError(t, db.ReadLedger(context.Background(), "shell", func(r *runstate.Record) error {
			evs[r.Ev]++
			return nil
		}))
		return evs
	}
	before := count()
	assert.Equal(t, 3, before["complete"], "each stage completed once")
	m1, out = start(w1, "0")
	require.NoError(t, m1.Wait(), out.String())
	after := count()
	sessions := after["open"] - before["open"]
	assert.Equal(t, 5, sessions, "a session for each of the pipeline's five commands")
	assert.Equal(t, sessions, after["close"]-before["close"])
	delete(after, "open")
	delete(after, "close")
	delete(before, "open")
	delete(before, "close")
	assert.Equal(t, before, after, "the last run records nothing but open and close")
}
