package runstate_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

func flowRun(t *testing.T, dir string) *runstate.Run {
	t.Helper()
	opts := i3Options()
	opts.Flow = runstate.AgentFlow()
	return i3Open(t, dir, opts)
}

func nop(context.Context, *runstate.Stage) error { return nil }

// doAll runs stages in order and requires each to succeed.
func doAll(t *testing.T, r *runstate.Run, stages ...string) {
	t.Helper()
	for _, s := range stages {
		require.NoError(t, r.Do(context.Background(), s, nop), "stage %s", s)
	}
}

func TestAgentFlowPath(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := flowRun(t, dir)
	doAll(t, r, "inspect", "plan", "execute/file-1", "execute/file-2", "verify")
	err := r.Do(ctx, "await-review", func(_ context.Context, st *runstate.Stage) error { return st.Await("look at the diff") })
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
	require.NoError(t, r.Approve(ctx, "await-review", "ann", ""))
	doAll(t, r, "complete")
	st, err := r.Status()
	require.NoError(t, err)
	for _, s := range st.Stages {
		assert.Equal(t, runstate.StateComplete, s.State, s.Name)
	}
	assert.Len(t, st.Stages, 7)
}

func TestAgentFlowForbidden(t *testing.T) {
	for _, tc := range []struct {
		name    string
		done    []string // run first
		begin   string
		allowed string // in the error
	}{
		{"plan cannot start", nil, "plan", "it starts with inspect"},
		{"execute/x cannot start", nil, "execute/file-3", "it starts with inspect"},
		{"execute needs a plan", []string{"inspect"}, "execute", "allowed next: plan"},
		{"verify needs execute", []string{"inspect", "plan"}, "verify", "allowed next: execute"},
		{"sub-stage takes its first segment's flow", []string{"inspect", "plan"}, "verify/vet", "allowed next: execute"},
		{"review comes after verify", []string{"inspect", "plan", "execute"}, "await-review", "allowed next: verify"},
		{"no completion without review", []string{"inspect", "plan", "execute", "verify"}, "complete", "allowed next: await-review, execute, plan"},
		{"unknown stage", []string{"inspect"}, "deploy", "allowed next: plan"},
		{"complete ends the flow", []string{"inspect", "plan", "execute", "verify", "await-review", "complete"}, "deploy", "ends the flow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			r := flowRun(t, dir)
			doAll(t, r, tc.done...)
			n := len(i3Records(t, dir))
			_, err := r.Begin(ctx, tc.begin)
			require.ErrorIs(t, err, runstate.ErrTransition)
			assert.Contains(t, err.Error(), tc.begin)
			assert.Contains(t, err.Error(), tc.allowed)
			assert.Len(t, i3Records(t, dir), n, "a refused transition writes nothing")
		})
	}
}

func TestAgentFlowAllowed(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		done  []string
		begin string
	}{
		{"verify back to execute", []string{"inspect", "plan", "execute/file-1", "verify"}, "execute/file-1"},
		{"verify to a new execute sub-stage", []string{"inspect", "plan", "execute/file-1", "verify"}, "execute/file-2"},
		{"verify back to plan", []string{"inspect", "plan", "execute", "verify"}, "plan"},
		{"sibling sub-stages", []string{"inspect", "plan", "execute/a"}, "execute/b"},
		{"a sub-stage of a segment the run reached", []string{"inspect", "plan", "execute/a", "verify", "await-review"}, "execute/b"},
		{"redo a stage the run reached", []string{"inspect", "plan", "execute", "verify"}, "inspect"},
		{"hierarchical first stage", nil, "inspect/repo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			r := flowRun(t, dir)
			doAll(t, r, tc.done...)
			if len(tc.done) > 0 {
				// A redo of a done stage needs it invalidated first.
				if s, ok := statusStage(t, r, tc.begin); ok && s.State == runstate.StateComplete {
					require.NoError(t, r.Invalidate(ctx, tc.begin, "verify found a problem"))
				}
			}
			st, err := r.Begin(ctx, tc.begin)
			require.NoError(t, err)
			require.NoError(t, st.Complete())
		})
	}
}

func statusStage(t *testing.T, r *runstate.Run, name string) (runstate.StageStatus, bool) {
	t.Helper()
	st, err := r.Status()
	require.NoError(t, err)
	return st.Stage(name)
}

func TestNoFlowAnyOrder(t *testing.T) {
	r := i3Open(t, t.TempDir(), nil)
	doAll(t, r, "complete", "verify", "plan", "deploy/eu", "inspect")
}

func TestCustomFlowEmptyStartAllowsAny(t *testing.T) {
	ctx := context.Background()
	opts := i3Options()
	opts.Flow = &runstate.Flow{Next: map[string][]string{"a": {"b"}}}
	r := i3Open(t, t.TempDir(), opts)
	doAll(t, r, "a")
	_, err := r.Begin(ctx, "c")
	require.ErrorIs(t, err, runstate.ErrTransition)
	assert.Contains(t, err.Error(), "allowed next: b")
	doAll(t, r, "b")
}

// The flow is judged from the ledger, so a later session (resuming from
// the snapshot or replaying the ledger) enforces it the same way.
func TestFlowAcrossSessions(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := flowRun(t, dir)
	doAll(t, r, "inspect", "plan")
	require.NoError(t, r.Close())
	for _, replay := range []bool{false, true} {
		if replay {
			require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
		}
		r = flowRun(t, dir)
		_, err := r.Begin(ctx, "verify")
		require.ErrorIs(t, err, runstate.ErrTransition, "replay=%v", replay)
		assert.Contains(t, err.Error(), "allowed next: execute")
		require.NoError(t, r.Close())
	}
	r = flowRun(t, dir)
	doAll(t, r, "inspect", "plan", "execute", "verify") // the first two are done: no refusal for them
}

func TestAgentFlowIsFresh(t *testing.T) {
	f := runstate.AgentFlow()
	f.Next["verify"] = nil
	f.Start = nil
	g := runstate.AgentFlow()
	assert.Equal(t, []string{"inspect"}, g.Start)
	assert.Equal(t, []string{"await-review", "execute", "plan"}, g.Next["verify"])
	assert.Equal(t, []string{"complete"}, g.Next["await-review"])
	assert.Equal(t, []string{"plan"}, g.Next["inspect"])
	assert.Equal(t, []string{"execute"}, g.Next["plan"])
	assert.Equal(t, []string{"verify"}, g.Next["execute"])
}
