package pgstore

// A locked batch that acknowledges releases the run's head row at its
// records' COMMIT and waits for their WAL flush after it (commitBatch):
// another session appends while it waits, and Sync returns only once the
// flush's transaction has committed.

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The flush's transaction is held back (another connection holds the
// session's row, which flushSQL updates, as an UPDATE would): the batch's records are in the
// table and the head row is free, so the other session locks it and reads
// them, while Sync has not returned; it returns nil once the row is let go.
func TestSyncReleasesTheHeadRowBeforeItsFlush(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	a, sa, at := openSession(t, db, "r")
	b, _, _ := openSession(t, db, "r")
	at = appendLines(t, a, at, sa, 1, true)

	hold, err := db.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, db.sql(`SELECT 1 FROM {s}.sessions WHERE id = $1 FOR NO KEY UPDATE`), sa)
	require.NoError(t, err)

	synced := make(chan error, 1)
	go func() {
		_, err := markedBatch(ctx, a, at, sa, "held-flush", 2, true)
		synced <- err
	}()

	// The other session's Lock gets the head row while a's flush waits.
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var tail int
	waitFor(t, 20*time.Second, func() bool {
		bb, err := b.Lock(lctx, runstate.Position{})
		require.NoError(t, err, "the head row must be free while the flush waits")
		tail = 0
		require.NoError(t, bb.Tail(func([]byte) error { tail++; return nil }))
		require.NoError(t, bb.Abort())
		return tail == 3
	}, "the batch's records in the table")
	select {
	case err := <-synced:
		t.Fatalf("Sync returned (%v) before its flush's transaction could commit", err)
	case <-time.After(200 * time.Millisecond):
	}

	require.NoError(t, hold.Rollback(ctx))
	select {
	case err := <-synced:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Sync did not return once its flush could commit")
	}
	assert.Len(t, readAll(t, db.Store("r")), 3)
}

// The flush's transaction fails after the records committed (its
// statement errs here; a session row deleted by hand would): the commit is
// settled as one whose reply was lost, which finds the records (and
// flushes them), so Sync returns nil and they are there once.
func TestSyncSettlesAFailedFlush(t *testing.T) {
	defer failFlush()()
	db := newTestDB(t)
	ctx := context.Background()
	st, session, at := openSession(t, db, "r")

	at, err := markedBatch(ctx, st, at, session, "failed-flush", 2, true)
	require.NoError(t, err, "the records committed: acknowledged once settled")
	_, err = markedBatch(ctx, st, at, session, "next", 1, true)
	require.NoError(t, err)
	lines := readAll(t, db.Store("r"))
	require.Len(t, lines, 3, "each record once")
	assert.Contains(t, string(lines[0]), "failed-flush 0")
	assert.Contains(t, string(lines[2]), "next 0")
}

// A failed flush settles to on disk: when Sync returns nil after the
// flush's transaction failed, the records are flushed (by the settle's
// synchronous COMMIT), not merely committed. The server holds lazy WAL
// back (holdWALDB), so that nothing else flushes them meanwhile; the
// check fails only when they are not on disk.
func TestSyncAfterAFailedFlushReturnsOnlyOnDisk(t *testing.T) {
	defer failFlush()()
	db := holdWALDB(t)
	ctx := context.Background()
	st, session, at := openSession(t, db, "r")
	for i := range 3 {
		var err error
		at, err = markedBatch(ctx, st, at, session, fmt.Sprintf("failed-flush-%d", i), 2, true)
		require.NoError(t, err)
		insert, flush := walLSN(t, db)
		assert.GreaterOrEqual(t, flush, insert, "batch %d: Sync returned before its records were on disk", i)
	}
	assert.Len(t, readAll(t, db.Store("r")), int(at.Seq), "each record once")
}

// resolveCommit's "committed" is durable: records it finds in the table
// (a lazy batch's here, as a locked batch's are between their COMMIT and
// their flush) are flushed before it returns. The server holds lazy WAL
// back (holdWALDB), so that nothing else flushes them meanwhile.
func TestResolvedCommitIsFlushed(t *testing.T) {
	db := holdWALDB(t)
	ctx := context.Background()
	st, session, at := openSession(t, db, "r")
	at = appendLines(t, st, at, session, 1, true)

	lsn := func() (insert, flush int64) { t.Helper(); return walLSN(t, db) }
	// The premise: the lazy batch is not on disk yet. Something else may
	// flush it first (the WAL writer is stopped, but a synchronous commit
	// of the session's projections writes all WAL before it): then a new
	// lazy batch is tried.
	var to runstate.Position
	var written, flushed int64
	for try := 0; ; try++ {
		to = appendLines(t, st, at, session, 2, false)
		if written, flushed = lsn(); flushed < written {
			break
		}
		require.Less(t, try, 4, "each of 5 lazy batches was on disk at once: the test's premise does not hold here")
		at = to
	}

	s := st.(*store)
	runID, err := s.id(ctx)
	require.NoError(t, err)
	lines := readAll(t, st)
	require.Len(t, lines, int(to.Seq))
	mark := func(seq int64) commitMark {
		h := sha256.Sum256(lines[seq-1])
		return commitMark{Seq: seq, Hash: h[:]}
	}
	committed, err := resolveCommit(ctx, s.connect, runID, mark(at.Seq+1), mark(to.Seq))
	require.NoError(t, err)
	require.True(t, committed)
	_, flushed = lsn()
	assert.GreaterOrEqual(t, flushed, written, "resolveCommit answered committed before the records were on disk")
}

// openSession opens run in db in a new session, closed at the test's end.
func openSession(t *testing.T, db *DB, run string) (runstate.Store, string, runstate.Position) {
	t.Helper()
	st := db.Store(run)
	session := newSession(t)
	_, at, err := st.Open(context.Background(), session)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close(true) })
	return st, session, at
}

// failFlush makes every flush transaction fail (its statement divides by
// zero), after a locked batch's records committed; the returned function
// puts flushSQL back.
func failFlush() (restore func()) {
	old := flushSQL
	flushSQL = `SELECT 1 / 0 WHERE $1::uuid IS NOT NULL`
	return func() { flushSQL = old }
}

// holdWALDB connects to a server of the test's own that holds lazy
// commits' WAL back (holdWAL, its WAL writer stopped: stopWALWriter), so
// that nothing but a synchronous commit flushes records meanwhile.
func holdWALDB(t *testing.T) *DB {
	t.Helper()
	srv := startServerWith(t, nil, nil, holdWAL)
	db, err := Connect(context.Background(), srv.DSN("127.0.0.1")+"&schema=flush")
	require.NoError(t, err)
	t.Cleanup(db.Close) // after the session's Close (cleanups run last first)
	stopWALWriter(t, db)
	return db
}

// walLSN is the server's WAL insert and flush positions.
func walLSN(t *testing.T, db *DB) (insert, flush int64) {
	t.Helper()
	require.NoError(t, db.pool.QueryRow(context.Background(), `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint, (pg_current_wal_flush_lsn() - '0/0')::bigint`).Scan(&insert, &flush))
	return insert, flush
}
