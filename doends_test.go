package runstate_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDoReturnsNilOnlyForACompletedStage: an fn that ends the attempt
// itself and returns nil gets from Do what ended it, so that a pipeline
// written as `if err := run.Do(...); err != nil` does not go on past a
// stage that failed or awaits a person.
func TestDoReturnsNilOnlyForACompletedStage(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	run, err := runstate.Open(dir, &runstate.Options{Request: "do ends"})
	require.NoError(t, err)
	defer run.Close()
	state := func(name string) string {
		st, err := run.Status()
		require.NoError(t, err)
		s, _ := st.Stage(name)
		return s.State
	}

	boom := errors.New("boom")
	err = run.Do(ctx, "failed", func(_ context.Context, st *runstate.Stage) error {
		_ = st.Fail(runstate.Fatal(boom))
		return nil
	})
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, runstate.StateFatal, state("failed"))

	err = run.Do(ctx, "review", func(_ context.Context, st *runstate.Stage) error {
		_ = st.Await("read the diff")
		return nil
	})
	assert.ErrorIs(t, err, runstate.ErrNeedsPerson)
	assert.Equal(t, runstate.StateAwaiting, state("review"))

	in := filepath.Join(dir, "in.txt")
	require.NoError(t, os.WriteFile(in, []byte("one"), 0o644))
	err = run.Do(ctx, "stale", func(_ context.Context, st *runstate.Stage) error {
		require.NoError(t, os.WriteFile(in, []byte("two"), 0o644))
		_ = st.Complete()
		return nil
	}, runstate.File(in))
	assert.ErrorIs(t, err, runstate.ErrStale)
	assert.NotEqual(t, runstate.StateComplete, state("stale"))

	err = run.Do(ctx, "done", func(_ context.Context, st *runstate.Stage) error {
		return st.Complete()
	})
	assert.NoError(t, err)
	err = run.Do(ctx, "done2", func(_ context.Context, st *runstate.Stage) error {
		_ = st.Complete()
		return nil
	})
	assert.NoError(t, err)
	assert.Equal(t, runstate.StateComplete, state("done2"))

	// fn's own error still wins.
	mine := errors.New("mine")
	err = run.Do(ctx, "own", func(_ context.Context, st *runstate.Stage) error {
		_ = st.Complete()
		return mine
	})
	assert.ErrorIs(t, err, mine)
}

// TestAwaitOfAnAttemptTakenOverEndsIt: Await of an attempt that no longer
// runs (an operator invalidated it) returns ErrStale and ends the Stage,
// as Complete and Fail do: a later call is ErrClosed.
func TestAwaitOfAnAttemptTakenOverEndsIt(t *testing.T) {
	ctx := context.Background()
	run, err := runstate.Open(t.TempDir(), &runstate.Options{Request: "await stale"})
	require.NoError(t, err)
	defer run.Close()
	st, err := run.Begin(ctx, "review")
	require.NoError(t, err)
	require.NoError(t, run.Invalidate(ctx, "review", "operator"))
	assert.ErrorIs(t, st.Await("read it"), runstate.ErrStale)
	assert.ErrorIs(t, st.Complete(), runstate.ErrClosed)
	assert.ErrorIs(t, st.Context().Err(), context.Canceled, "the attempt's context ends with it")
}

// completer is a Store whose every Lock first has another session
// complete stage again, while armed.
type completer struct {
	runstate.Store
	other *runstate.Run
	stage string
	armed bool
	t     *testing.T
}

func (c *completer) Lock(ctx context.Context, from runstate.Position) (runstate.Batch, error) {
	if c.armed {
		require.NoError(c.t, c.other.Invalidate(ctx, c.stage, "again"))
		require.NoError(c.t, c.other.Do(ctx, c.stage, func(context.Context, *runstate.Stage) error { return nil }))
	}
	return c.Store.Lock(ctx, from)
}

// TestBeginOfAStageCompletedUnderEveryLookIsBusy: a done stage that other
// sessions complete again between each of Begin's looks and its decision
// under the lock makes Begin give up after ten looks with ErrBusy and
// nothing recorded (it returned an internal error before).
func TestBeginOfAStageCompletedUnderEveryLookIsBusy(t *testing.T) {
	ctx := context.Background()
	ms := runstatetest.NewMemStore()
	opts := &runstate.Options{Request: "recheck"}
	other, err := ms.Open(t.TempDir(), opts)
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }))

	c := &completer{Store: ms.Session(), other: other, stage: "a", t: t}
	dir := t.TempDir()
	run, err := runstate.OpenStore(c, dir, opts)
	require.NoError(t, err)
	defer run.Close()
	c.armed = true
	_, err = run.Begin(ctx, "a")
	c.armed = false
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), "nothing recorded")
	st, err := run.Status()
	require.NoError(t, err)
	s, _ := st.Stage("a")
	assert.Equal(t, runstate.StateComplete, s.State, "this session recorded no begin")
	assert.Equal(t, 12, s.Attempt, "the first attempt and eleven again, all the other session's")
}
