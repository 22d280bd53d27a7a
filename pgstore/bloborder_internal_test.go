package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every writer of a blob inserts its chunk before its row, so that two
// transactions storing the same blob never wait for each other in a
// circle. Here a transaction holds the chunk (as the first of queueInline's
// two statements for several blobs does) while a writer of one blob waits
// for it; the holder then inserts the row, which must not wait for the
// waiter. A writer that inserted the row first (a data-modifying CTE that
// nothing reads runs after the main statement) deadlocked here: 40P01
// after deadlock_timeout (seen in TestSessionsShareARunAtAnyDefaultIsolation).
func TestBlobWritersTakeTheChunkFirst(t *testing.T) {
	db := newTestDB(t)
	for _, c := range []struct {
		name  string
		write func(t *testing.T, data []byte) error
	}{
		{"insertOneBlobSQL", func(t *testing.T, data []byte) error {
			sum := sha256.Sum256(data)
			tx, err := db.pool.Begin(context.Background())
			require.NoError(t, err)
			defer tx.Rollback(context.Background())
			if _, err := tx.Exec(context.Background(), db.sql(insertOneBlobSQL), sum[:], data, int64(len(data))); err != nil {
				return err
			}
			return tx.Commit(context.Background())
		}},
		{"a bet's blob that no output of its holds", func(t *testing.T, data []byte) error {
			s, session, at := openBetting(t, db, "rest-blob")
			_, err := betPutAppend(t, s, at, session, data)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			data := []byte("the same bytes, " + c.name)
			sum := sha256.Sum256(data)
			holder, holderPID := beginHolder(t, db)
			_, err := holder.Exec(ctx, db.sql(`INSERT INTO {s}.blob_chunks (sha256, n, data) VALUES ($1, 0, $2)`), sum[:], data)
			require.NoError(t, err)

			rowErr := make(chan error, 1)
			go func() {
				// Once the writer waits for the holder's chunk, the holder
				// inserts the row and commits.
				if !waitsForLock(db.pool, holderPID, 10*time.Second) {
					rowErr <- assert.AnError
					return
				}
				_, err := holder.Exec(ctx, db.sql(`INSERT INTO {s}.blobs (sha256, size, chunks) VALUES ($1, $2, 1) ON CONFLICT DO NOTHING`), sum[:], int64(len(data)))
				if err == nil {
					err = holder.Commit(ctx)
				}
				rowErr <- err
			}()
			werr := c.write(t, data)
			require.NoError(t, <-rowErr, "the holder's row did not wait for the writer")
			require.NoError(t, werr)
			var n int
			require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT count(*) FROM {s}.blobs b JOIN {s}.blob_chunks c USING (sha256) WHERE sha256 = $1`), sum[:]).Scan(&n))
			assert.Equal(t, 1, n)
		})
	}
}

// betPutAppend puts data as a blob and bets a record without outputs: the
// batch carries the blob, which no output row of it holds, to the blobs
// tables (the path of a blob Put for a record of a later batch).
func betPutAppend(t *testing.T, s *store, at runstate.Position, session string, data []byte) (runstate.Position, error) {
	t.Helper()
	sum := sha256.Sum256(data)
	require.NoError(t, s.Blobs().Put(context.Background(), hex.EncodeToString(sum[:]), int64(len(data)), bytes.NewReader(data)))
	return betAppend(t, s, at, session, "m", 1, nil, true)
}

// beginHolder begins the transaction that holds what a test's writer
// waits for, rolled back at the test's end unless committed, and returns
// it with its backend's pid (waitsForLock).
func beginHolder(t *testing.T, db *DB) (pgx.Tx, int) {
	t.Helper()
	holder, err := db.pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	var pid int
	require.NoError(t, holder.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	return holder, pid
}

// waitsForLock reports whether, within d, a backend other than holder
// waits for a lock that holder holds.
func waitsForLock(pool *pgxpool.Pool, holder int, d time.Duration) bool {
	_, ok := poll(d, 5*time.Millisecond, func() bool {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holder).Scan(&n)
		return err == nil && n > 0
	})
	return ok
}

// A bet that the server ends to break a deadlock (40P01) was rolled back
// whole: it is a lost bet (ErrConflict, decided again under the lock), not
// a failed append. Here a holder takes the blob's row before its chunk,
// the order no writer of pgstore uses, so that the bet waits first and is
// the one the deadlock check ends (after deadlock_timeout).
func TestBetEndedByADeadlockIsALostBet(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	s, session, at := openBetting(t, db, "deadlock")
	data := []byte("the bytes both want")
	sum := sha256.Sum256(data)
	holder, holderPID := beginHolder(t, db)
	_, err := holder.Exec(ctx, db.sql(`INSERT INTO {s}.blobs (sha256, size, chunks) VALUES ($1, $2, 1)`), sum[:], int64(len(data)))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		if !waitsForLock(db.pool, holderPID, 10*time.Second) {
			done <- assert.AnError
			return
		}
		// Each waiter checks for a deadlock deadlock_timeout after it began
		// to wait, and the first to check ends itself: 300 ms after the bet,
		// so that a busy machine's scheduling does not reverse the order
		// (once in CI, 2026-12-07: the holder was ended, the bet went on).
		time.Sleep(300 * time.Millisecond)
		_, err := holder.Exec(ctx, db.sql(`INSERT INTO {s}.blob_chunks (sha256, n, data) VALUES ($1, 0, $2) ON CONFLICT DO NOTHING`), sum[:], data)
		done <- err
	}()
	_, err = betPutAppend(t, s, at, session, data)
	require.ErrorIs(t, err, runstate.ErrConflict)
	assert.Contains(t, err.Error(), "deadlock")
	require.NoError(t, <-done, "the holder goes on once the bet is rolled back")
}
