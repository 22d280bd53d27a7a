package runstate_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// planStage is a plan stage that discovers the stages it lists.
func planStage(stages ...string) func(context.Context, *runstate.Stage) error {
	return func(_ context.Context, st *runstate.Stage) error {
		if err := st.Plan(stages...); err != nil {
			return err
		}
		return st.WriteFile("artifacts/plan.txt", []byte(strings.Join(stages, "\n")))
	}
}

func noop(context.Context, *runstate.Stage) error { return nil }

func TestStagePlanPlacesDiscoveredStagesAfterIt(t *testing.T) {
	r, dir := newTestRun(t)
	ctx := context.Background()
	require.NoError(t, r.Plan(ctx, "inspect", "plan", "verify"))
	require.NoError(t, r.Do(ctx, "inspect", noop))
	require.NoError(t, r.Do(ctx, "plan", planStage("execute/a", "execute/b")))

	s, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, []string{"inspect", "plan", "execute/a", "execute/b", "verify"}, s.Plan)
	assert.Equal(t, "execute/a", s.Next)
	assert.Equal(t, 2, s.Done)
	assert.Equal(t, 3, s.Remaining)
	next, err := r.NextSteps()
	require.NoError(t, err)
	assert.Contains(t, next, "next:     execute/a (not started)")
	assert.Contains(t, next, "then:     execute/b, verify")

	// The plan record is written in the same batch as the complete, and
	// before it: one write, so no crash keeps the complete without it.
	lines := parseLedger(t, readLedgerBytes(t, dir))
	var i int
	for i = range lines {
		if lines[i].rec.Ev == "complete" && lines[i].rec.Stage == "plan" {
			break
		}
	}
	require.Greater(t, i, 0)
	p := lines[i-1].rec
	assert.Equal(t, "plan", p.Ev)
	assert.Equal(t, "plan", p.Stage)
	assert.JSONEq(t, `["execute/a","execute/b"]`, string(p.Data))
	assert.Equal(t, lines[i].rec.At, p.At, "one batch")

	// The next session plans the run's part again: that keeps the
	// discovered stages, and writes nothing.
	require.NoError(t, r.Close())
	size := len(readLedgerBytes(t, dir))
	r = openRun(t, dir, testOptions())
	before := len(readLedgerBytes(t, dir))
	require.NoError(t, r.Plan(ctx, "inspect", "plan", "verify"))
	require.NoError(t, r.Do(ctx, "plan", planStage("execute/a", "execute/b")))
	assert.Equal(t, before, len(readLedgerBytes(t, dir)), "nothing written: the plan holds, plan is done")
	assert.Greater(t, before, size)
	s, err = r.Status()
	require.NoError(t, err)
	assert.Equal(t, []string{"inspect", "plan", "execute/a", "execute/b", "verify"}, s.Plan)

	// And so does a replay of the ledger, without the manifest.
	require.NoError(t, r.Close())
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	s, err = runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{"inspect", "plan", "execute/a", "execute/b", "verify"}, s.Plan)
}

func TestRedonePlanStageReplacesItsPlanAndDropsTheRest(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	src := filepath.Join(dir, "findings.txt")
	require.NoError(t, os.WriteFile(src, []byte("a b c"), 0o644))
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Plan(ctx, "plan", "verify"))
	require.NoError(t, r.Do(ctx, "plan", planStage("execute/a", "execute/b", "execute/c"), runstate.File(src)))
	require.NoError(t, r.Do(ctx, "execute/a", noop))
	require.NoError(t, r.Do(ctx, "execute/c", noop))

	// The findings change: plan is redone and finds other work.
	require.NoError(t, os.WriteFile(src, []byte("a d"), 0o644))
	require.NoError(t, r.Do(ctx, "plan", planStage("execute/a", "execute/d"), runstate.File(src)))

	check := func(s *runstate.Status) {
		t.Helper()
		assert.Equal(t, []string{"plan", "execute/a", "execute/d", "verify"}, s.Plan)
		assert.Equal(t, "execute/d", s.Next)
		assert.Equal(t, 2, s.Done, "plan and execute/a")
		assert.Equal(t, 2, s.Remaining, "execute/d and verify: not the dropped ones")
		b, _ := s.Stage("execute/b")
		assert.True(t, b.Dropped)
		assert.Equal(t, runstate.StatePending, b.State)
		c, _ := s.Stage("execute/c")
		assert.True(t, c.Dropped)
		assert.Equal(t, runstate.StateComplete, c.State, "a dropped stage keeps its state")
		a, _ := s.Stage("execute/a")
		assert.False(t, a.Dropped)
	}
	s, err := r.Status()
	require.NoError(t, err)
	check(s)
	next, err := r.NextSteps()
	require.NoError(t, err)
	assert.Contains(t, next, "progress: 2 of 4 planned stages done")
	assert.Contains(t, next, "dropped:  execute/b, execute/c (planned once, no longer: not counted)")
	assert.NotContains(t, next, "then:     verify, execute/b")

	// From the manifest and from a replay alike.
	require.NoError(t, r.Close())
	s, err = runstate.Inspect(dir)
	require.NoError(t, err)
	check(s)
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	s, err = runstate.Inspect(dir)
	require.NoError(t, err)
	check(s)

	// Planned again, a dropped stage is not dropped any more.
	r = openRun(t, dir, testOptions())
	require.NoError(t, os.WriteFile(src, []byte("a b c d"), 0o644))
	require.NoError(t, r.Do(ctx, "plan", planStage("execute/a", "execute/b", "execute/d"), runstate.File(src)))
	s, err = r.Status()
	require.NoError(t, err)
	b, _ := s.Stage("execute/b")
	assert.False(t, b.Dropped)
	assert.Equal(t, []string{"plan", "execute/a", "execute/b", "execute/d", "verify"}, s.Plan)
}

func TestRunPlanDropsTheStagesItNoLongerNames(t *testing.T) {
	r, _ := newTestRun(t)
	ctx := context.Background()
	require.NoError(t, r.Plan(ctx, "a", "b", "c"))
	require.NoError(t, r.Do(ctx, "b", noop))
	require.NoError(t, r.Plan(ctx, "a", "c"))
	s, err := r.Status()
	require.NoError(t, err)
	b, _ := s.Stage("b")
	assert.True(t, b.Dropped)
	assert.Equal(t, 0, s.Done)
	assert.Equal(t, 2, s.Remaining)
}

func TestStagePlanIsNotRecordedWithoutAComplete(t *testing.T) {
	r, _ := newTestRun(t)
	ctx := context.Background()
	require.NoError(t, r.Plan(ctx, "plan"))
	err := r.Do(ctx, "plan", func(_ context.Context, st *runstate.Stage) error {
		require.NoError(t, st.Plan("execute/a"))
		return errors.New("the model timed out")
	})
	require.Error(t, err)
	s, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, []string{"plan"}, s.Plan)
}

func TestStagePlanRefusesBadNames(t *testing.T) {
	r, _ := newTestRun(t)
	st, err := r.Begin(context.Background(), "plan")
	require.NoError(t, err)
	for _, names := range [][]string{{""}, {"a", "a"}, {"plan"}, {"bad\nname"}} {
		assert.ErrorIs(t, st.Plan(names...), runstate.ErrInvalid, "%q", names)
	}
	require.NoError(t, st.Plan("a"))
	require.NoError(t, st.Complete())
	assert.ErrorIs(t, st.Plan("b"), runstate.ErrClosed)
}

// TestStagePlanSurvivesEveryCut cuts the ledger at every byte of the
// batch that completes a plan stage (what a crash, or a power loss that
// kept only part of the write, can leave) and reads the run back: the
// stage is never complete without its plan.
func TestStagePlanSurvivesEveryCut(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Plan(ctx, "plan", "verify"))
	before := len(readLedgerBytes(t, dir))
	require.NoError(t, r.Do(ctx, "plan", planStage("execute/a", "execute/b")))
	ledger := readLedgerBytes(t, dir)
	require.NoError(t, r.Close())
	complete := 0
	cdir := filepath.Join(t.TempDir(), "run")
	require.NoError(t, os.MkdirAll(filepath.Join(cdir, "logs"), 0o755))
	for cut := before; cut <= len(ledger); cut++ {
		require.NoError(t, os.WriteFile(ledgerPath(cdir), ledger[:cut], 0o644))
		_ = os.Remove(filepath.Join(cdir, "manifest.json")) // the last Open's
		s, err := runstate.Inspect(cdir)
		require.NoError(t, err, "cut at %d", cut)
		plan, _ := s.Stage("plan")
		if plan.State == runstate.StateComplete {
			complete++
			assert.Equal(t, []string{"plan", "execute/a", "execute/b", "verify"}, s.Plan, "cut at %d: complete without its plan", cut)
		}
		// A session resumes from there too (cuts at each line's end
		// and in its middle: Inspect saw every byte).
		if cut == len(ledger) || ledger[cut-1] == '\n' || cut%97 == 0 {
			r := openRun(t, cdir, testOptions())
			require.NoError(t, r.Close())
		}
	}
	assert.Greater(t, complete, 0)
}

// A plan stage that waits for a review of its plan records the plan with
// its await: a reviewer sees the stages it found.
func TestStagePlanIsRecordedWithAwait(t *testing.T) {
	r, _ := newTestRun(t)
	ctx := context.Background()
	require.NoError(t, r.Plan(ctx, "plan", "verify"))
	err := r.Do(ctx, "plan", func(_ context.Context, st *runstate.Stage) error {
		require.NoError(t, st.Plan("execute/a"))
		return st.Await("review the plan")
	})
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
	s, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, []string{"plan", "execute/a", "verify"}, s.Plan)
	require.NoError(t, r.Approve(ctx, "plan", "reviewer", "ok"))
	s, err = r.Status()
	require.NoError(t, err)
	assert.Equal(t, "execute/a", s.Next)
}
