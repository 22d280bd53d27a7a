package pgstore

import (
	"context"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOpenRunsStagesAcrossTwoSessions(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	a, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "two sessions"})
	require.NoError(t, err)
	require.NoError(t, a.Plan(ctx, "x", "y"))
	require.NoError(t, a.Do(ctx, "x", func(ctx context.Context, st *runstate.Stage) error { return nil }))

	b, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "two sessions"})
	require.NoError(t, err)
	_, err = b.Begin(ctx, "x")
	assert.ErrorIs(t, err, runstate.ErrDone)
	st, err := a.Begin(ctx, "y")
	require.NoError(t, err)
	_, err = b.Begin(ctx, "y")
	assert.ErrorIs(t, err, runstate.ErrBusy)
	require.NoError(t, st.Complete())
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())

	status, err := db.Inspect(ctx, "r")
	require.NoError(t, err)
	assert.Equal(t, runstate.StateComplete, status.Stages[0].State)
	assert.Equal(t, runstate.StateComplete, status.Stages[1].State)

	_, err = db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "another request"})
	assert.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), `run "r"`)
}
