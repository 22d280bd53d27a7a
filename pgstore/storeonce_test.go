package pgstore

import (
	"context"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A second runstate.OpenStore of one db.Store value is refused, saying
// what to do, and leaves the first Run as it was: its session goes on
// recording, and its Close leaves no session or lock behind.
func TestOpenStoreTwiceOnOneStoreIsRefused(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	opts := &runstate.Options{Request: "one store, one run"}
	st := db.Store("r")
	a, err := runstate.OpenStore(st, t.TempDir(), opts)
	require.NoError(t, err)

	b, err := runstate.OpenStore(st, t.TempDir(), opts)
	if b != nil {
		_ = b.Close()
	}
	require.Error(t, err)
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "one Store value serves one Run")
	assert.Contains(t, err.Error(), `call db.Store("r") again`)

	require.NoError(t, a.Do(ctx, "x", func(context.Context, *runstate.Stage) error { return nil }),
		"the first Run still records")
	assert.Equal(t, 1, sessionRows(t, db), "one session: the first Run's")
	require.NoError(t, a.Close())

	assert.Zero(t, sessionRows(t, db), "no session left after the first Run's Close")
	var runID string
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT id::text FROM {s}.runs WHERE name = 'r'`)).Scan(&runID))
	var locks int
	require.NoError(t, db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
		AND (classid::bigint << 32 | objid::bigint) = $1`, runKey(runID)).Scan(&locks))
	assert.Zero(t, locks, "no lock connection left holding the run's lock")

	status, err := db.Inspect(ctx, "r")
	require.NoError(t, err)
	assert.Equal(t, runstate.StateComplete, status.Stages[0].State)
	// A Store value of its own opens the run again.
	c, err := runstate.OpenStore(db.Store("r"), t.TempDir(), opts)
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// sessionRows counts the rows of db's sessions table: one for each open
// session.
func sessionRows(t *testing.T, db *DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.pool.QueryRow(context.Background(), db.sql(`SELECT count(*) FROM {s}.sessions`)).Scan(&n))
	return n
}
