package pgstore

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An Open whose Options.LockTimeout ends while a statement waits for a
// table's lock (here LOCK TABLE runs, as an administrator's or a schema
// upgrade's) fails with ErrLockTimeout, saying a statement waited and how
// to see for whom; it said "cannot connect ... check that the server
// runs".
func TestOpenPastItsLockTimeoutBehindATableLockSaysSo(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	r, err := db.Open(ctx, "locked", t.TempDir(), &runstate.Options{Request: "r"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	conn, err := pgx.Connect(ctx, os.Getenv("RUNSTATE_PG_DSN"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{db.Schema(), "runs"}.Sanitize()+" IN EXCLUSIVE MODE")
	require.NoError(t, err)

	start := time.Now()
	_, err = db.Open(ctx, "locked", t.TempDir(), &runstate.Options{Request: "r", LockTimeout: time.Second})
	require.Error(t, err)
	assert.Less(t, time.Since(start), 10*time.Second, "LockTimeout bounds the wait")
	assert.ErrorIs(t, err, runstate.ErrLockTimeout)
	assert.Contains(t, err.Error(), "a statement waited until the context ended (its deadline: Options.LockTimeout while a Run opens")
	assert.Contains(t, err.Error(), "pg_blocking_pids(pid)")
	assert.NotContains(t, err.Error(), "cannot connect")
}
