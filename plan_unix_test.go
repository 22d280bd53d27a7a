//go:build unix

package runstate_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// TestStagePlanAfterKill kills a child that runs a pipeline with a plan
// stage at random moments, and checks after each kill that the plan stage
// is never complete without the stages it planned.
func TestStagePlanAfterKill(t *testing.T) {
	const req = "plan after kill"
	execute := []string{"execute/1", "execute/2", "execute/3"}
	if childRole() == "planner" {
		ctx := context.Background()
		r, err := runstate.Open(os.Getenv(childDirEnv), &runstate.Options{Request: req})
		if err != nil {
			childFail("%v", err)
		}
		if err := r.Plan(ctx, "inspect", "plan", "verify"); err != nil {
			childFail("%v", err)
		}
		for _, name := range append([]string{"inspect", "plan"}, append(execute, "verify")...) {
			err := r.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
				report("step", name)
				time.Sleep(time.Millisecond)
				if name == "plan" {
					if err := st.Plan(execute...); err != nil {
						return err
					}
				}
				return st.WriteFile("artifacts/"+strings.ReplaceAll(name, "/", "-"), []byte(name))
			})
			if err != nil {
				childFail("%v", err)
			}
		}
		if err := r.Close(); err != nil {
			childFail("%v", err)
		}
		return
	}
	want := append([]string{"inspect", "plan"}, append(execute, "verify")...)
	check := func(dir, when string) *runstate.Status {
		s, err := runstate.Inspect(dir)
		require.NoError(t, err)
		if plan, ok := s.Stage("plan"); ok && plan.State == runstate.StateComplete {
			assert.Equal(t, want, s.Plan, "%s: plan complete without the stages it planned", when)
		}
		return s
	}
	completes := 0
	for trial := range 16 {
		// Kill the child 0-3 ms after the plan stage began: around its
		// complete (it works 1 ms, then writes its output and the batch).
		dir := t.TempDir()
		cmd, stderr, steps := startReporting(t, "planner", dir, "", "step")
		for v := range steps {
			if v == "plan" {
				break
			}
		}
		time.Sleep(time.Duration(trial) * 200 * time.Microsecond)
		_ = cmd.Process.Kill()
		for range steps {
		}
		_ = cmd.Wait()
		s := check(dir, fmt.Sprintf("trial %d, killed", trial))
		if plan, _ := s.Stage("plan"); plan.State == runstate.StateComplete {
			completes++
		}
		// The next run resumes and ends with the whole plan done.
		out, err := childCommand(t, "planner", dir, "").CombinedOutput()
		require.NoError(t, err, "trial %d: %s (killed run: %s)", trial, out, stderr)
		s = check(dir, fmt.Sprintf("trial %d, resumed", trial))
		assert.Equal(t, len(want), s.Done)
		assert.Equal(t, 0, s.Metrics.DuplicatedWork)
	}
	t.Logf("16 kills, %d after the plan stage completed", completes)
}
