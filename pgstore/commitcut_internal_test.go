package pgstore

// The connection lost around COMMIT (resolve.go's commit ambiguity), on
// the Store: a proxy between the store and the server cuts the batch's
// connection before the COMMIT reaches the server or after the server
// committed and before its reply reaches the store. Never "returned nil
// but not recorded", never recorded twice.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore/internal/pgproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cutFixture is a DB whose every connection goes through a proxy, and a
// direct connection to look at the table.
type cutFixture struct {
	proxy  *pgproxy.Proxy
	db     *DB // through the proxy
	direct *DB // the same schema, not through the proxy
	run    string
}

func newCutFixture(t *testing.T) *cutFixture {
	t.Helper()
	p, db, dsn := proxiedDB(t)
	direct, err := Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	return &cutFixture{proxy: p, db: db, direct: direct, run: "r"}
}

// open opens the run through db in a new session, closed (clean or not)
// at the test's end.
func (f *cutFixture) open(t *testing.T, db *DB, clean bool) (runstate.Store, string, runstate.Position) {
	t.Helper()
	st := db.Store(f.run)
	session := newSession(t)
	_, at, err := st.Open(context.Background(), session)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close(clean) })
	return st, session, at
}

// markedBatch appends n records whose lines carry marker, in one batch
// from pos, and ends it with Sync (sync) or with Unlock alone (a lazy
// batch, as begins are). It returns the position after the batch and the
// first error of Lock, Append, Sync or Unlock. Safe to call from any
// goroutine.
func markedBatch(ctx context.Context, st runstate.Store, from runstate.Position, session, marker string, n int, sync bool) (runstate.Position, error) {
	return eventBatch(ctx, st, from, session, "note", marker, n, sync)
}

// eventBatch is markedBatch with records of event ev.
func eventBatch(ctx context.Context, st runstate.Store, from runstate.Position, session, ev, marker string, n int, sync bool) (runstate.Position, error) {
	b, err := st.Lock(ctx, from)
	if err != nil {
		return from, err
	}
	pos := from
	if err := b.Tail(func(line []byte) error {
		pos = runstate.Position{Seq: pos.Seq + 1, Hash: lineHash(line), End: pos.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
		return nil
	}); err != nil {
		_ = b.Abort()
		return from, err
	}
	var recs []*runstate.Record
	var lines bytes.Buffer
	for i := range n {
		rec := &runstate.Record{Seq: pos.Seq + 1, At: b.Now(), Ev: ev, Session: session, Note: fmt.Sprintf("%s %d", marker, i), Prev: pos.Hash}
		line := fmt.Sprintf(`{"seq":%d,"at":%q,"ev":%q,"session":%q,"note":%q,"prev":%q}`, rec.Seq, rec.At.Format(time.RFC3339Nano), ev, session, rec.Note, pos.Hash)
		recs = append(recs, rec)
		lines.WriteString(line + "\n")
		pos = runstate.Position{Seq: rec.Seq, Hash: lineHash([]byte(line)), End: pos.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
	}
	if err := b.Append(recs, lines.Bytes(), pos); err != nil {
		_ = b.Abort()
		return from, err
	}
	if sync {
		if err := b.Sync(ctx); err != nil {
			_ = b.Abort()
			return pos, err
		}
	}
	return pos, b.Unlock()
}

// copies counts the records whose line carries marker, and checks the
// table's seqs are gapless.
func (f *cutFixture) copies(t *testing.T, marker string) int {
	t.Helper()
	lines := readAll(t, f.direct.Store(f.run))
	n := 0
	for _, l := range lines {
		if bytes.Contains(l, []byte(marker)) {
			n++
		}
	}
	return n
}

func TestCommitCutNeverLosesAnAcknowledgedBatchNorRecordsItTwice(t *testing.T) {
	for _, c := range []struct {
		cut   pgproxy.Cut
		sync  bool
		flush bool // cut the batch's flush transaction (commitBatch), after its records' COMMIT
	}{
		{pgproxy.BeforeCommit, true, false},
		{pgproxy.AfterCommit, true, false},
		{pgproxy.BeforeCommit, false, false},
		{pgproxy.AfterCommit, false, false},
		{pgproxy.BeforeCommit, true, true},
		{pgproxy.AfterCommit, true, true},
	} {
		name := c.cut.String()
		match := []string{"cut-me"}
		if !c.sync {
			name += " (lazy batch)"
		}
		if c.flush {
			name += " of the flush"
			match = []string{"SET pid = pid"} // flushSQL: the first flush after the rule is armed is the cut-me batch's
		}
		t.Run(name, func(t *testing.T) {
			f := newCutFixture(t)
			ctx := context.Background()
			st, session, at := f.open(t, f.db, true)
			at, err := markedBatch(ctx, st, at, session, "before", 2, true)
			require.NoError(t, err)

			a := f.proxy.Arm(pgproxy.Rule{Cut: c.cut, Match: match})
			at, err = markedBatch(ctx, st, at, session, "cut-me", 3, c.sync)
			require.True(t, a.Wait(time.Second), "the proxy did not cut: %q", f.proxy.Log())
			require.NoError(t, err, "the batch must be acknowledged: re-run (cut before COMMIT) or resolved as committed (after)")
			assert.Equal(t, 3, f.copies(t, "cut-me"), "each record of the batch exactly once")

			// The store goes on from where it is.
			_, err = markedBatch(ctx, st, at, session, "after", 1, true)
			require.NoError(t, err)
			lines := readAll(t, f.direct.Store(f.run))
			assert.Len(t, lines, 6)
			assert.Equal(t, 1, f.copies(t, "after"))
		})
	}
}

// A cut right after the COMMIT was sent: whether it landed is a race. The
// batch either returns nil and is there once, or returns an error and is
// absent; never nil and absent, never twice.
func TestCommitCutRacingTheCommitIsOneOrNone(t *testing.T) {
	f := newCutFixture(t)
	ctx := context.Background()
	st, session, at := f.open(t, f.db, true)
	acked := 0
	for i := range 10 {
		marker := fmt.Sprintf("race-%d-", i)
		a := f.proxy.Arm(pgproxy.Rule{Cut: pgproxy.AfterCommitSent, Match: []string{marker}})
		next, err := markedBatch(ctx, st, at, session, marker, 2, true)
		require.True(t, a.Wait(time.Second))
		n := f.copies(t, marker)
		if err == nil {
			acked++
			assert.Equal(t, 2, n, "round %d: acknowledged, so both records exactly once", i)
			at = next
		} else {
			assert.Equal(t, 0, n, "round %d: %v, yet recorded", i, err)
			t.Fatalf("round %d: the batch failed: %v", i, err) // with re-run, it must not
		}
	}
	t.Logf("%d of 10 acknowledged", acked)
}

// The database unreachable after the cut for longer than CommitTimeout:
// the outcome is unknown, the batch's error wraps ErrReadOnly and says so;
// the records are in the table (the server committed), and a new session
// reads them.
func TestCommitCutUnresolvableIsReadOnlyAndOpenFindsTheOutcome(t *testing.T) {
	old := CommitTimeout
	CommitTimeout = 600 * time.Millisecond
	defer func() { CommitTimeout = old }()
	f := newCutFixture(t)
	ctx := context.Background()
	st, session, at := f.open(t, f.db, false)
	f.proxy.Refuse(false)
	f.proxy.Arm(pgproxy.Rule{Cut: pgproxy.AfterCommit, Match: []string{"cut-me"}, Refuse: true})
	_, err := markedBatch(ctx, st, at, session, "cut-me", 2, true)
	require.Error(t, err)
	assert.ErrorIs(t, err, runstate.ErrReadOnly)
	assert.Contains(t, err.Error(), "commit outcome unknown")
	assert.Contains(t, err.Error(), "open the run again")
	assert.Equal(t, 2, f.copies(t, "cut-me"), "the server committed")

	other, _, pos := f.open(t, f.direct, true)
	var n int
	_, err = other.Read(ctx, pos, func([]byte) error { n++; return nil })
	require.NoError(t, err)
	assert.Equal(t, int64(2), pos.Seq+int64(n), "a new session sees both records")
}

// The batch is re-run only under the lock it was decided under: when
// another writer appended between the lost COMMIT and the re-run, the
// batch fails, nothing of it recorded.
func TestCommitCutRerunRefusedWhenTheRunMoved(t *testing.T) {
	f := newCutFixture(t)
	ctx := context.Background()
	st, session, at := f.open(t, f.db, true)
	otherStore, otherSession, _ := f.open(t, f.direct, true)

	// Cut before the COMMIT, and hold the re-run's connections back
	// until the other writer has appended.
	f.proxy.Refuse(false)
	a := f.proxy.Arm(pgproxy.Rule{Cut: pgproxy.BeforeCommit, Match: []string{"cut-me"}, Refuse: true})
	moved := make(chan struct{})
	go func() {
		<-a.Fired()
		_, err := markedBatch(ctx, otherStore, runstate.Position{}, otherSession, "other", 1, true)
		assert.NoError(t, err)
		f.proxy.Refuse(false)
		close(moved)
	}()
	_, err := markedBatch(ctx, st, at, session, "cut-me", 2, true)
	<-moved
	require.Error(t, err)
	assert.ErrorIs(t, err, errRerun)
	assert.Equal(t, 0, f.copies(t, "cut-me"))
	assert.Equal(t, 1, f.copies(t, "other"))
}

// A blob upload (more than one chunk, one transaction) cut in the middle
// stores nothing: the blob is still missing and has no chunks; cut after
// its COMMIT, it is there. Either way Put again succeeds (idempotent) and
// Get returns the bytes.
func TestCommitCutDuringBlobUpload(t *testing.T) {
	for _, cut := range []pgproxy.Cut{pgproxy.OnMatch, pgproxy.AfterCommit} {
		t.Run(cut.String(), func(t *testing.T) {
			f := newCutFixture(t)
			ctx := context.Background()
			data := bytes.Repeat([]byte("blob bytes "), 2*chunkSize/11+100)
			copy(data[chunkSize:], "SECOND-CHUNK-MARK")
			sum := lineHash(data)
			bs := f.db.Store(f.run).Blobs()
			a := f.proxy.Arm(pgproxy.Rule{Cut: cut, Match: []string{"blob_chunks", "SECOND-CHUNK-MARK"}})
			err := bs.Put(ctx, sum, int64(len(data)), bytes.NewReader(data))
			require.True(t, a.Wait(time.Second), "the proxy did not cut: %q", f.proxy.Log())
			assert.Error(t, err, "the cut connection is an error")
			missing, err := f.direct.Store(f.run).Blobs().Missing(ctx, []string{sum})
			require.NoError(t, err)
			var chunks int
			require.NoError(t, f.direct.pool.QueryRow(ctx, f.direct.sql(`SELECT count(*) FROM {s}.blob_chunks WHERE sha256 = decode($1, 'hex')`), sum).Scan(&chunks))
			if cut == pgproxy.OnMatch {
				assert.Equal(t, []string{sum}, missing, "a blob cut mid-upload is missing")
				assert.Zero(t, chunks, "and has no chunks")
			} else {
				assert.Empty(t, missing, "a blob whose COMMIT landed is there")
				assert.Equal(t, 3, chunks)
			}
			require.NoError(t, bs.Put(ctx, sum, int64(len(data)), bytes.NewReader(data)))
			rc, err := bs.Get(ctx, sum)
			require.NoError(t, err)
			got, err := io.ReadAll(rc)
			rc.Close()
			require.NoError(t, err)
			assert.True(t, bytes.Equal(data, got))
		})
	}
}

// The session's lock connection is cut and it cannot reconnect; meanwhile
// another session finds it gone and records so. When it can reconnect
// again it stays lost: every append fails with runstate.ErrSessionLost.
func TestCommitCutLockConnectionStaysLostWhenDeclaredGone(t *testing.T) {
	f := newCutFixture(t)
	ctx := context.Background()
	st, session, at := f.open(t, f.db, true)
	other, otherSession, _ := f.open(t, f.direct, true)
	at, err := markedBatch(ctx, st, at, session, "before", 1, true)
	require.NoError(t, err)
	f.proxy.Refuse(true)
	require.Equal(t, 1, f.proxy.CutWhere(func(c pgproxy.Conn) bool { return c.Saw("pg_try_advisory_lock(") }))
	waitFor(t, 5*time.Second, func() bool {
		b, err := other.Lock(ctx, runstate.Position{})
		require.NoError(t, err)
		defer b.Abort()
		return !b.Alive(session)
	}, "the cut session gone to the others")
	_, err = eventBatch(ctx, other, at, otherSession, "interrupted", "session "+session+" is gone", 1, true)
	require.NoError(t, err)
	f.proxy.Refuse(false)
	// It reconnects, finds the record and gives up: the batch waits for
	// that and fails.
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = markedBatch(actx, st, at, session, "after", 1, true)
	assert.ErrorIs(t, err, runstate.ErrSessionLost)
	assert.Zero(t, f.copies(t, "after"))
}

// The session's lock connection is cut (the server frees its lock): the
// session takes its lock again and its appends go on, none failing. (An
// append may still pass its self-fence while the old backend, not yet
// aware of the cut, holds the lock: safe, since nobody can find the
// session gone before the lock is free, and once someone records it
// gone it cannot take the lock again: the test below.)
func TestCommitCutLockConnectionReheldAppendsGoOn(t *testing.T) {
	f := newCutFixture(t)
	ctx := context.Background()
	st, session, at := f.open(t, f.db, true)
	probe := f.direct.Store(f.run)
	at, err := markedBatch(ctx, st, at, session, "before", 1, true)
	require.NoError(t, err)
	n := f.proxy.CutWhere(func(c pgproxy.Conn) bool { return c.Saw("pg_try_advisory_lock(") })
	require.Equal(t, 1, n, "the session's lock connection")
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for i := range 20 {
		pos, err := markedBatch(actx, st, at, session, fmt.Sprintf("during-%d", i), 1, true)
		require.NoError(t, err, "append %d after the lock connection was cut: the session is not gone, its lock is taken again", i)
		at = pos
	}
	waitFor(t, 5*time.Second, func() bool {
		live, err := probe.Live(ctx, []string{session})
		require.NoError(t, err)
		return live[session]
	}, "the session's lock held again")
	assert.Equal(t, 20, f.copies(t, "during-"))
}

// The connection is cut before the COMMIT, and the session's lock
// connection with it (as a server restart drops both): the re-run finds
// the session's own lock free, waits until the session holds it again,
// and then lands the batch once.
func TestCommitCutRerunWaitsForTheLockTakenAgain(t *testing.T) {
	f := newCutFixture(t)
	ctx := context.Background()
	st, session, at := f.open(t, f.db, true)
	probe := f.direct.Store(f.run)
	a := f.proxy.Arm(pgproxy.Rule{Cut: pgproxy.BeforeCommit, Match: []string{"cut-me"}})
	f.proxy.Refuse(false)
	go func() {
		<-a.Fired()
		// No new connection (the re-run's, the re-hold's) until the
		// server has freed the session's lock.
		f.proxy.Refuse(true)
		f.proxy.CutWhere(func(c pgproxy.Conn) bool { return c.Saw("pg_try_advisory_lock(") })
		poll(5*time.Second, time.Millisecond, func() bool {
			live, err := probe.Live(ctx, []string{session})
			return err == nil && !live[session]
		})
		f.proxy.Refuse(false)
	}()
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := markedBatch(actx, st, at, session, "cut-me", 2, true)
	require.True(t, a.Wait(time.Second))
	require.NoError(t, err, "the re-run must wait for the session's lock, then land")
	assert.Equal(t, 2, f.copies(t, "cut-me"))
}

// The re-run after a cut before COMMIT finds the pool's other connections
// dead too, as after a server restart, which ends them all (the pool hands
// out a connection idle for less than a second without a ping): it tries
// again, with a pause, until one answers, and lands the batch once.
// Before, it gave up after four tries, and the Run turned read-only.
func TestCommitCutRerunGoesOnPastDeadPooledConnections(t *testing.T) {
	f := newCutFixture(t)
	ctx := context.Background()
	st, session, at := f.open(t, f.db, true)
	var conns []*pgxpool.Conn
	for range 8 { // the pool's connections, idle
		c, err := f.db.pool.Acquire(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	afterResolve = func() { // every pooled connection dies; the session's lock connection lives
		f.proxy.CutWhere(func(c pgproxy.Conn) bool { return !c.Saw("pg_try_advisory_lock(") })
	}
	t.Cleanup(func() { afterResolve = nil })
	a := f.proxy.Arm(pgproxy.Rule{Cut: pgproxy.BeforeCommit, Match: []string{"cut-me"}})
	_, err := markedBatch(ctx, st, at, session, "cut-me", 2, true)
	require.True(t, a.Wait(time.Second), "the proxy did not cut: %q", f.proxy.Log())
	require.NoError(t, err, "the re-run must go on past the dead connections, then land")
	assert.Equal(t, 2, f.copies(t, "cut-me"))
}
