package pgstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// resolveFixture is a run row in a schema of its own and the commit
// check's connect function.
type resolveFixture struct {
	db      *DB
	runID   string
	connect func(context.Context) (*pgx.Conn, error)
}

func newResolveFixture(t *testing.T) *resolveFixture {
	t.Helper()
	db := newTestDB(t)
	f := &resolveFixture{db: db, runID: uuid.Must(uuid.NewV7()).String()}
	_, err := db.pool.Exec(context.Background(), db.sql(`INSERT INTO {s}.runs (id, name) VALUES ($1, 'r')`), f.runID)
	require.NoError(t, err)
	f.connect = db.Store("r").(*store).connect
	return f
}

// mark is the commit mark of a line at seq.
func mark(seq int64, line string) commitMark {
	h := sha256.Sum256([]byte(line))
	return commitMark{Seq: seq, Hash: h[:]}
}

// execer is a pool or a transaction.
type execer interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

// insert appends records through q as the append statement does, moving
// the head.
func (f *resolveFixture) insert(t *testing.T, ctx context.Context, q execer, marks ...commitMark) {
	t.Helper()
	for _, m := range marks {
		_, err := q.Exec(ctx, f.db.sql(`INSERT INTO {s}.records (run_id, seq, line, hash, ev, at) VALUES ($1, $2, 'x', $3, 'note', now())`),
			f.runID, m.Seq, m.Hash)
		require.NoError(t, err)
		_, err = q.Exec(ctx, f.db.sql(`UPDATE {s}.runs SET last_seq = $2, last_hash = $3 WHERE id = $1`), f.runID, m.Seq, m.Hash)
		require.NoError(t, err)
	}
}

func TestResolveCommitByContent(t *testing.T) {
	ctx := context.Background()
	ours1, ours2 := mark(1, "ours 1"), mark(2, "ours 2")
	for _, c := range []struct {
		name      string
		table     []commitMark
		committed bool
		half      bool
	}{
		{"both ours: committed", []commitMark{ours1, ours2}, true, false},
		{"absent: not committed", nil, false, false},
		{"another writer's records: not committed", []commitMark{mark(1, "theirs 1"), mark(2, "theirs 2")}, false, false},
		{"only the first: the table was edited", []commitMark{ours1}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newResolveFixture(t)
			f.insert(t, ctx, f.db.pool, c.table...)
			committed, err := resolveCommit(ctx, f.connect, f.runID, ours1, ours2)
			if c.half {
				assert.ErrorIs(t, err, errHalf)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.committed, committed)
		})
	}
}

// A COMMIT still under way on the old connection (it holds the head row)
// lands after the check started: the check waits for the row, so it sees
// the records and answers committed. A plain SELECT answers "absent", and
// the batch would then be re-run or reported lost while it is in the table.
func TestResolveCommitWaitsForTheLostTransaction(t *testing.T) {
	ctx := context.Background()
	f := newResolveFixture(t)
	ours1, ours2 := mark(1, "ours 1"), mark(2, "ours 2")
	old, err := f.db.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = old.Rollback(ctx) }()
	_, err = old.Exec(ctx, f.db.sql(`SELECT 1 FROM {s}.runs WHERE id = $1 FOR UPDATE`), f.runID)
	require.NoError(t, err)
	f.insert(t, ctx, old, ours1, ours2)

	type answer struct {
		committed bool
		err       error
	}
	got := make(chan answer, 1)
	go func() {
		c, err := resolveCommit(ctx, f.connect, f.runID, ours1, ours2)
		got <- answer{c, err}
	}()
	select {
	case a := <-got:
		t.Fatalf("resolveCommit answered (%v, %v) while the old transaction was still open", a.committed, a.err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, old.Commit(ctx))
	a := <-got
	require.NoError(t, a.err)
	assert.True(t, a.committed, "the old transaction committed our records")
}

// A database that cannot be reached: resolveCommit keeps trying, with
// backoff, until CommitTimeout, then says the outcome is unknown.
func TestResolveCommitUnreachableIsUnknownAfterTimeout(t *testing.T) {
	old := CommitTimeout
	CommitTimeout = 700 * time.Millisecond
	defer func() { CommitTimeout = old }()
	var tries atomic.Int32
	connect := func(ctx context.Context) (*pgx.Conn, error) {
		tries.Add(1)
		return nil, errors.New("connection refused")
	}
	start := time.Now()
	committed, err := resolveCommit(context.Background(), connect, uuid.NewString(), mark(1, "a"), mark(1, "a"))
	d := time.Since(start)
	assert.False(t, committed)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "commit outcome unknown")
	assert.Contains(t, err.Error(), "connection refused")
	assert.GreaterOrEqual(t, d, 700*time.Millisecond, "gave up before CommitTimeout")
	assert.Less(t, d, 2*time.Second, "did not stop at CommitTimeout")
	n := tries.Load()
	assert.GreaterOrEqual(t, n, int32(4), "too few tries: no retry")
	assert.LessOrEqual(t, n, int32(30), "too many tries: no backoff")
	t.Logf("%d tries in %v", n, d.Round(time.Millisecond))
}

// A database that comes back within CommitTimeout: the answer is found.
func TestResolveCommitReconnects(t *testing.T) {
	ctx := context.Background()
	f := newResolveFixture(t)
	ours := mark(1, "ours")
	f.insert(t, ctx, f.db.pool, ours)
	var tries atomic.Int32
	connect := func(ctx context.Context) (*pgx.Conn, error) {
		if tries.Add(1) <= 3 {
			return nil, fmt.Errorf("try %d: connection refused", tries.Load())
		}
		return f.connect(ctx)
	}
	committed, err := resolveCommit(ctx, connect, f.runID, ours, ours)
	require.NoError(t, err)
	assert.True(t, committed)
	assert.Equal(t, int32(4), tries.Load())
}
