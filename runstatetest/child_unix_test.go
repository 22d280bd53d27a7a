//go:build unix

package runstatetest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

func init() { runstatetest.Register("grandchild", grandchildPipeline) }

// A pipeline that starts a process of its own, which outlives it with the
// pipeline's standard output and error (a model server, a go test), as
// the package doc warns they do.
func grandchildPipeline(ctx context.Context, dir string) error {
	r, err := runstate.Open(dir, &runstate.Options{Request: "grandchild", NoSync: true})
	if err != nil {
		return err
	}
	defer r.Close()
	err = r.Do(ctx, "serve", func(context.Context, *runstate.Stage) error {
		cmd := exec.Command("sleep", "30")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		return os.WriteFile(os.Getenv("GRANDCHILD_PID"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644)
	})
	if err != nil {
		return err
	}
	return r.Close()
}

// TestChildWhoseProcessOutlivesIt: a pipeline that leaves a process of its
// own running with its standard output (a server it started) does not
// make Run wait for that process: Run returns once the child exited (and
// a second more). Run read the child's output to its end, which came only
// when the last process holding it exited: it hung for as long as the
// grandchild lived, past Timeout.
func TestChildWhoseProcessOutlivesIt(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Fatalf("this test needs sleep(1): %v", err)
	}
	pidFile := t.TempDir() + "/pid"
	t.Cleanup(func() {
		if data, err := os.ReadFile(pidFile); err == nil {
			var pid int
			fmt.Sscan(string(data), &pid)
			if p, err := os.FindProcess(pid); err == nil && pid > 0 {
				_ = p.Kill()
				_, _ = p.Wait()
			}
		}
	})
	c := runstatetest.Child{Pipeline: "grandchild", Dir: t.TempDir(), Env: []string{"GRANDCHILD_PID=" + pidFile}, Timeout: 20 * time.Second}
	start := time.Now()
	o := c.Run(runstatetest.Kill{})
	require.NoError(t, o.Err)
	assert.True(t, o.Finished)
	assert.Less(t, time.Since(start), 15*time.Second, "Run waited for the pipeline's own child, which lives 30 s")
}
