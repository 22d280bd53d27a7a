package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newSession(t *testing.T) string {
	id, err := uuid.NewV7()
	require.NoError(t, err)
	return id.String()
}

// appendLines appends n fake records in one batch from pos and returns
// the position after them.
func appendLines(t testing.TB, st runstate.Store, from runstate.Position, session string, n int, sync bool) runstate.Position {
	t.Helper()
	ctx := context.Background()
	b, err := st.Lock(ctx, from)
	require.NoError(t, err)
	defer b.Abort() // a no-op after Unlock
	pos := from
	require.NoError(t, b.Tail(func(line []byte) error {
		pos.Seq++
		pos.Hash = lineHash(line)
		pos.End += int64(len(line) + 1)
		pos.LastLen = int64(len(line) + 1)
		return nil
	}))
	var recs []*runstate.Record
	var lines bytes.Buffer
	for range n {
		rec := &runstate.Record{Seq: pos.Seq + 1, At: b.Now(), Ev: "plan", Session: session, Prev: pos.Hash}
		line := fmt.Sprintf(`{"seq":%d,"at":%q,"ev":"plan","session":%q,"prev":%q}`, rec.Seq, rec.At.Format(time.RFC3339Nano), session, pos.Hash)
		recs = append(recs, rec)
		lines.WriteString(line + "\n")
		pos = runstate.Position{Seq: rec.Seq, Hash: lineHash([]byte(line)), End: pos.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
	}
	require.NoError(t, b.Append(recs, lines.Bytes(), pos))
	if sync {
		require.NoError(t, b.Sync(ctx))
	}
	require.NoError(t, b.Unlock())
	return pos
}

func lineHash(line []byte) string {
	h := sha256.Sum256(line)
	return hex.EncodeToString(h[:])
}

func readAll(t *testing.T, st runstate.Store) [][]byte {
	var lines [][]byte
	_, err := st.Read(context.Background(), runstate.Position{}, func(line []byte) error {
		lines = append(lines, bytes.Clone(line))
		return nil
	})
	require.NoError(t, err)
	return lines
}

func TestStoreAppendsGaplessAndCatchesUp(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	a, b := db.Store("r"), db.Store("r")
	sa, sb := newSession(t), newSession(t)
	_, at, err := a.Open(ctx, sa)
	require.NoError(t, err)
	defer a.Close(true)
	assert.Equal(t, runstate.Position{}, at)
	_, _, err = b.Open(ctx, sb)
	require.NoError(t, err)
	defer b.Close(true)

	pa := appendLines(t, a, runstate.Position{}, sa, 3, true)
	// b is behind: its batch first catches up with a's three records.
	pb := appendLines(t, b, runstate.Position{}, sb, 2, false)
	assert.Equal(t, int64(5), pb.Seq)
	pa = appendLines(t, a, pa, sa, 1, true)
	assert.Equal(t, int64(6), pa.Seq)
	lines := readAll(t, db.Store("r"))
	require.Len(t, lines, 6)
	assert.Equal(t, pa.Hash, lineHash(lines[5]))
}

func TestStoreAliveUntilSessionDies(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	a, b := db.Store("r"), db.Store("r")
	sa, sb := newSession(t), newSession(t)
	_, _, err := a.Open(ctx, sa)
	require.NoError(t, err)
	_, _, err = b.Open(ctx, sb)
	require.NoError(t, err)
	defer b.Close(true)
	alive := func() bool {
		bt, err := b.Lock(ctx, runstate.Position{})
		require.NoError(t, err)
		defer bt.Abort()
		return bt.Alive(sa)
	}
	assert.True(t, alive())
	live, err := b.Live(ctx, []string{sa, sb})
	require.NoError(t, err)
	assert.Equal(t, map[string]bool{sa: true, sb: true}, live)

	start := time.Now()
	require.NoError(t, a.Close(false)) // as a SIGKILL would
	for alive() {
		require.Less(t, time.Since(start), 5*time.Second, "the dead session's lock is still held")
		time.Sleep(time.Millisecond)
	}
	t.Logf("session gone after %v", time.Since(start))
	live, err = b.Live(ctx, []string{sa, sb})
	require.NoError(t, err)
	assert.Equal(t, map[string]bool{sa: false, sb: true}, live)
}

// killLock ends the server process that holds session's lock.
func killLock(t *testing.T, db *DB, session string) {
	t.Helper()
	_, err := db.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
		AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid`, lockKey(session))
	require.NoError(t, err)
}

// A session whose lock connection was cut (here by the server) and that
// no record names gone takes its lock again and goes on appending.
func TestStoreReholdsLockAfterItsConnectionDied(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	a := db.Store("r")
	sa := newSession(t)
	_, _, err := a.Open(ctx, sa)
	require.NoError(t, err)
	defer a.Close(true)
	pos := appendLines(t, a, runstate.Position{}, sa, 1, true)
	killLock(t, db, sa)
	time.Sleep(20 * time.Millisecond) // the backend ends
	pos = appendLines(t, a, pos, sa, 1, true)
	assert.Equal(t, int64(2), pos.Seq)
	live, err := db.Store("r").Live(ctx, []string{sa})
	require.NoError(t, err)
	assert.True(t, live[sa], "the lock is held again")
}

// A session whose lock connection died and that a record names gone
// (another session took it for dead meanwhile) cannot append again.
func TestStoreFencesSessionNamedGone(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	a, b := db.Store("r"), db.Store("r")
	sa, sb := newSession(t), newSession(t)
	_, _, err := a.Open(ctx, sa)
	require.NoError(t, err)
	defer a.Close(true)
	_, _, err = b.Open(ctx, sb)
	require.NoError(t, err)
	defer b.Close(true)
	pos := appendLines(t, a, runstate.Position{}, sa, 1, true)
	// b's record that names a gone, as b's Open would write on finding a's
	// lock free.
	bt, err := b.Lock(ctx, pos)
	require.NoError(t, err)
	line := fmt.Sprintf(`{"seq":2,"at":"2026-12-01T00:00:00Z","ev":"interrupted","session":%q,"reason":"session %s is gone","prev":%q}`, sb, sa, pos.Hash)
	to := runstate.Position{Seq: 2, Hash: lineHash([]byte(line)), End: pos.End + int64(len(line)+1), LastLen: int64(len(line) + 1), CRC: true}
	require.NoError(t, bt.Append([]*runstate.Record{{Seq: 2, Ev: "interrupted", Session: sb, At: bt.Now()}}, []byte(line+"\n"), to))
	require.NoError(t, bt.Sync(ctx))
	require.NoError(t, bt.Unlock())

	killLock(t, db, sa)
	var lockErr error
	for range 100 {
		var bt runstate.Batch
		if bt, lockErr = a.Lock(ctx, to); lockErr != nil {
			break
		}
		require.NoError(t, bt.Abort())
		time.Sleep(50 * time.Millisecond)
	}
	require.ErrorIs(t, lockErr, runstate.ErrSessionLost)
	assert.Contains(t, lockErr.Error(), "record 2 names this session gone")
	assert.Len(t, readAll(t, a), 2)
}

func TestBlobsRoundTrip(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	bs := db.Store("r").Blobs()
	for _, size := range []int{0, 10, chunkSize, 2*chunkSize + 17} {
		data := bytes.Repeat([]byte{byte(size)}, size)
		for i := range data {
			data[i] ^= byte(i * 7)
		}
		sum := lineHash(data)
		missing, err := bs.Missing(ctx, []string{sum})
		require.NoError(t, err)
		assert.Equal(t, []string{sum}, missing)
		require.NoError(t, bs.Put(ctx, sum, int64(size), bytes.NewReader(data)))
		require.NoError(t, bs.Put(ctx, sum, int64(size), bytes.NewReader(data)), "Put is idempotent")
		missing, err = bs.Missing(ctx, []string{sum})
		require.NoError(t, err)
		assert.Empty(t, missing)
		rc, err := bs.Get(ctx, sum)
		require.NoError(t, err)
		got, err := io.ReadAll(rc)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(data, got), "size %d", size)
	}
	_, err := bs.Get(ctx, lineHash([]byte("nope")))
	assert.ErrorIs(t, err, fs.ErrNotExist)
	err = bs.Put(ctx, lineHash([]byte("abc")), 3, bytes.NewReader([]byte("abd")))
	assert.Error(t, err, "bytes that do not match their hash are refused")
	old := MaxBlob
	MaxBlob = 5
	defer func() { MaxBlob = old }()
	err = bs.Put(ctx, lineHash([]byte("abcdef")), 6, bytes.NewReader([]byte("abcdef")))
	assert.True(t, errors.Is(err, runstate.ErrInvalid), "%v", err)
	assert.Contains(t, err.Error(), "MaxBlob")
}

// Lock waits as long as its context allows for a batch another session
// holds, then fails with the context's error and ErrLockTimeout.
func TestStoreLockWaitEndsWithItsContext(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	a, b := db.Store("r"), db.Store("r")
	sa, sb := newSession(t), newSession(t)
	_, _, err := a.Open(ctx, sa)
	require.NoError(t, err)
	defer a.Close(true)
	_, _, err = b.Open(ctx, sb)
	require.NoError(t, err)
	defer b.Close(true)
	held, err := a.Lock(ctx, runstate.Position{})
	require.NoError(t, err)
	defer held.Abort()
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = b.Lock(wctx, runstate.Position{})
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, runstate.ErrLockTimeout)
	assert.Less(t, time.Since(start), 5*time.Second)
	tl, ok, err := b.(runstate.TryLocker).TryLock(runstate.Position{})
	require.NoError(t, err)
	assert.False(t, ok, "TryLock does not wait")
	assert.Nil(t, tl)
}

// A batch whose Sync failed (here: an output without its bytes) is not
// sent again by Unlock; nothing of it is recorded, and the next batch goes
// on from the same place.
func TestStoreFailedSyncIsNotResentByUnlock(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	a := db.Store("r")
	sa := newSession(t)
	_, _, err := a.Open(ctx, sa)
	require.NoError(t, err)
	defer a.Close(true)
	b, err := a.Lock(ctx, runstate.Position{})
	require.NoError(t, err)
	line := fmt.Sprintf(`{"seq":1,"at":"2026-12-01T00:00:00Z","ev":"complete","session":%q,"stage":"s","attempt":1,"prev":""}`, sa)
	to := runstate.Position{Seq: 1, Hash: lineHash([]byte(line)), End: int64(len(line) + 1), LastLen: int64(len(line) + 1), CRC: true}
	rec := &runstate.Record{Seq: 1, Ev: "complete", Stage: "s", Attempt: 1, Session: sa, At: b.Now(),
		Outputs: []runstate.Output{{Path: "x", SHA256: lineHash([]byte("never stored")), Size: 12}}}
	require.NoError(t, b.Append([]*runstate.Record{rec}, []byte(line+"\n"), to))
	err = b.Sync(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "store them first")
	assert.NoError(t, b.Unlock())
	assert.Empty(t, readAll(t, a))
	pos := appendLines(t, a, runstate.Position{}, sa, 1, true)
	assert.Equal(t, int64(1), pos.Seq)
}

// A locked batch whose transaction sits idle longer than the server's
// idle_in_transaction_session_timeout (a slow decision: a GC pause, an
// Alive probe, a loaded machine) still commits: the Lock's transaction
// lifts it, as lock_timeout and statement_timeout.
func TestLockedBatchOutlivesTheServersIdleInTransactionTimeout(t *testing.T) {
	ctx := context.Background()
	base := newTestDB(t)
	db := connectWith(t, base, serverSetting{"idle_in_transaction_session_timeout", "100", "100ms"})
	s := db.Store("idle")
	session := newSessionID()
	_, at, err := s.Open(ctx, session)
	require.NoError(t, err)
	defer s.Close(true)
	at = appendLines(t, s, at, session, 1, true)
	b, err := s.Lock(ctx, at)
	require.NoError(t, err)
	defer b.Abort()
	time.Sleep(400 * time.Millisecond) // idle in the Lock's transaction
	line := fmt.Sprintf(`{"seq":%d,"ev":"note","session":%q,"prev":%q}`, at.Seq+1, session, at.Hash)
	to := runstate.Position{Seq: at.Seq + 1, Hash: lineHash([]byte(line)), End: at.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
	require.NoError(t, b.Append([]*runstate.Record{{Seq: to.Seq, At: b.Now(), Ev: "note", Session: session}}, []byte(line+"\n"), to))
	require.NoError(t, b.Sync(ctx))
	require.NoError(t, b.Unlock())
	assert.Len(t, readAll(t, s), int(to.Seq))
}
