package pgstore

// An optimistic batch's commit is one implicit transaction (optimistic.go,
// betBatch): its statements up to the pipeline's Sync, no BEGIN, no
// COMMIT. These tests prove what that must keep: a lazy one commits with
// synchronous_commit off and a synced one with it on, a lost bet writes
// nothing of its batch (its blobs and projections neither), and a
// connection lost around the Sync is resolved as around a COMMIT.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore/internal/pgproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openBetting opens a session of run on db through the Store interface and
// makes it bet whenever it knows the head. It returns the store, the
// session and the position after the record it appended under the lock.
func openBetting(t testing.TB, db *DB, run string) (*store, string, runstate.Position) {
	t.Helper()
	s := db.Store(run).(*store)
	session := newSessionID()
	_, at, err := s.Open(context.Background(), session)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close(true) })
	at = appendLines(t, s, at, session, 1, true) // under the lock: the store knows the head
	s.opt.mu.Lock()
	s.opt.eager = true
	s.opt.mu.Unlock()
	return s, session, at
}

// betAppend makes one optimistic batch from the head the store knows: n
// records whose lines carry marker; with out, the first names an output
// of those bytes, Put just before (a small blob: it rides in the batch).
// The batch commits with Sync (sync) or Confirm (lazy, as a batch of
// begins). The test fails if the store does not bet. It returns the
// position after the batch and the commit's error.
func betAppend(t *testing.T, s *store, from runstate.Position, session, marker string, n int, out []byte, sync bool) (runstate.Position, error) {
	t.Helper()
	ctx := context.Background()
	ob, ok := s.LockOptimistic(from)
	require.True(t, ok, "the store bets on the head it knows (%d)", from.Seq)
	defer ob.Abort() // a no-op after Unlock
	var outs []runstate.Output
	if out != nil {
		sum := sha256.Sum256(out)
		o := runstate.Output{Path: "out/" + marker, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(out))}
		require.NoError(t, s.Blobs().Put(ctx, o.SHA256, o.Size, bytes.NewReader(out)))
		outs = append(outs, o)
	}
	pos := from
	var recs []*runstate.Record
	var lines bytes.Buffer
	for i := range n {
		rec := &runstate.Record{Seq: pos.Seq + 1, At: ob.Now(), Ev: "note", Session: session, Note: fmt.Sprintf("%s %d", marker, i), Prev: pos.Hash}
		if i == 0 {
			rec.Outputs = outs
		}
		line := fmt.Sprintf(`{"seq":%d,"at":%q,"ev":"note","session":%q,"note":%q,"prev":%q}`, rec.Seq, rec.At.Format(time.RFC3339Nano), session, rec.Note, pos.Hash)
		recs = append(recs, rec)
		lines.WriteString(line + "\n")
		pos = runstate.Position{Seq: rec.Seq, Hash: lineHash([]byte(line)), End: pos.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
	}
	require.NoError(t, ob.Append(recs, lines.Bytes(), pos))
	var err error
	if sync {
		err = ob.Sync(ctx)
	} else {
		err = ob.Confirm(ctx)
	}
	if err != nil {
		return pos, err
	}
	return pos, ob.Unlock()
}

// The three shapes of an optimistic batch's append statement (betForm),
// by the batch that takes each.
var betShapes = []struct {
	name string
	n    int
	out  bool
}{{"one record", 1, false}, {"one record with an output", 1, true}, {"three records", 3, false}}

// A bet's implicit transaction commits with synchronous_commit off when the
// batch is lazy (Confirm: a batch of begins) and on when it is synced
// (Sync: a complete's), for each shape of its statement, and a bet of
// projections only (the handoff timer's flush, at Unlock) lazily. The
// setting is read at the commit itself: a deferred constraint trigger on
// records and projections notes current_setting('synchronous_commit')
// when the transaction commits, which is the value the server's commit
// obeys. (A version that forgets it commits every bet synchronously.)
func TestBetCommitIsLazyExactlyWhenConfirmed(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	setting := noteCommitSetting(t, db)

	s, session, at := openBetting(t, db, "lazy")
	for _, shape := range betShapes {
		for _, sync := range []bool{false, true} {
			bets0, lost0 := s.opt.counts()
			var out []byte
			if shape.out {
				out = []byte(fmt.Sprintf("output of %s, sync %v", shape.name, sync))
			}
			from := at
			var err error
			at, err = betAppend(t, s, at, session, "m", shape.n, out, sync)
			require.NoError(t, err)
			bets, lost := s.opt.counts()
			require.Equal(t, [2]int{bets0 + 1, lost0}, [2]int{bets, lost}, "%s: the batch bet and won", shape.name)
			want := "off"
			if sync {
				want = "on"
			}
			for seq := from.Seq + 1; seq <= at.Seq; seq++ {
				assert.Equal(t, want, setting("records", seq), "%s, sync %v: synchronous_commit at the commit of record %d", shape.name, sync, seq)
			}
		}
	}

	// Projections only: the manifest at the head, at Unlock.
	ob, ok := s.LockOptimistic(at)
	require.True(t, ok)
	ob.Publish(at, []byte(`{"manifest":1}`), nil)
	require.NoError(t, ob.Unlock())
	assert.Equal(t, "off", setting("projections", at.Seq), "synchronous_commit at the commit of a bet of projections only")
	var manifest []byte
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT manifest FROM {s}.projections WHERE seq = $1`), at.Seq).Scan(&manifest))
	assert.Equal(t, `{"manifest":1}`, string(manifest), "the bet of projections committed")
}

// A connection whose synchronous_commit is off (here from the DSN; as
// well from the server's, the database's or the role's settings) still
// commits every batch that acknowledges with synchronous_commit on, bet
// or locked (a locked batch's records commit lazily and its flush's
// transaction after them synchronously): Sync's promise (in the WAL on
// disk when it returns) does not depend on a setting the user may not
// know about. A batch of begins still commits lazily.
func TestSyncCommitsAreSynchronousWhateverTheConnectionSays(t *testing.T) {
	base := newTestDB(t)
	setting := noteCommitSetting(t, base)
	db := connectWith(t, base, serverSetting{"synchronous_commit", "off", "off"})
	var err error

	s, session, at := openBetting(t, db, "dsn-off")
	for _, shape := range betShapes {
		for _, sync := range []bool{false, true} {
			var out []byte
			if shape.out {
				out = []byte(fmt.Sprintf("output of %s, sync %v", shape.name, sync))
			}
			from := at
			at, err = betAppend(t, s, at, session, "m", shape.n, out, sync)
			require.NoError(t, err)
			want := map[bool]string{false: "off", true: "on"}[sync]
			for seq := from.Seq + 1; seq <= at.Seq; seq++ {
				assert.Equal(t, want, setting("records", seq), "a bet, %s, sync %v: synchronous_commit at the commit of record %d", shape.name, sync, seq)
			}
		}
	}
	// A locked batch's records commit lazily, releasing the head row;
	// when it acknowledges, the flush's transaction after them commits
	// with synchronous_commit on (commitBatch).
	flushes := func(setting string) int {
		t.Helper()
		var n int
		require.NoError(t, base.pool.QueryRow(context.Background(), base.sql(`SELECT count(*) FROM {s}.commit_setting WHERE tab = 'sessions' AND setting = $1`), setting).Scan(&n))
		return n
	}
	for _, sync := range []bool{false, true} {
		from, on := at, flushes("on")
		at = appendLines(t, s, at, session, 2, sync)
		for seq := from.Seq + 1; seq <= at.Seq; seq++ {
			assert.Equal(t, "off", setting("records", seq), "a locked batch, sync %v: synchronous_commit at the commit of record %d", sync, seq)
		}
		assert.Equal(t, map[bool]int{false: on, true: on + 1}[sync], flushes("on"), "a locked batch, sync %v: its flush's commits with synchronous_commit on", sync)
	}
	assert.Zero(t, flushes("off"), "a flush committed with synchronous_commit off")
}

// noteCommitSetting makes every commit that writes a record or a
// projection in db's schema, or updates a sessions row (a locked batch's
// flush: commitBatch), note current_setting('synchronous_commit') as the
// transaction commits (a deferred constraint trigger: the value the
// server's commit obeys), and returns the reader of those notes: the
// distinct settings noted for tab's row at seq (a sessions row's: seq 0).
func noteCommitSetting(t *testing.T, db *DB) func(tab string, seq int64) string {
	ctx := context.Background()
	_, err := db.pool.Exec(ctx, db.sql(`
CREATE TABLE {s}.commit_setting (tab text NOT NULL, seq bigint NOT NULL, setting text NOT NULL);
CREATE FUNCTION {s}.note_commit_setting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {s}.commit_setting VALUES (TG_TABLE_NAME, NEW.seq, current_setting('synchronous_commit'));
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER note_commit_setting AFTER INSERT ON {s}.records
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.note_commit_setting();
CREATE CONSTRAINT TRIGGER note_commit_setting AFTER INSERT OR UPDATE ON {s}.projections
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.note_commit_setting();
CREATE FUNCTION {s}.note_flush_setting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {s}.commit_setting VALUES (TG_TABLE_NAME, 0, current_setting('synchronous_commit'));
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER note_flush_setting AFTER UPDATE ON {s}.sessions
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.note_flush_setting()`))
	require.NoError(t, err)
	setting := func(tab string, seq int64) string {
		t.Helper()
		var s string
		require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT string_agg(DISTINCT setting, ',') FROM {s}.commit_setting WHERE tab = $1 AND seq = $2`), tab, seq).Scan(&s))
		return s
	}
	return setting
}

// A lost bet writes nothing of its batch: the implicit transaction, in
// which its projection came before the failing statement, is rolled back
// whole at the Sync. The small blob it carries is kept for the next
// batch, which stores its bytes in the row of the output that names them.
func TestLostBetWritesNothingOfItsBatch(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	a, asess, aAt := openBetting(t, db, "lost")
	b, bsess, _ := openBetting(t, db, "lost")
	// b's record moved the head a knows: a bets on aAt, and loses.
	b.opt.mu.Lock()
	bHead := b.opt.head
	b.opt.mu.Unlock()
	_, err := betAppend(t, b, bHead, bsess, "b", 1, nil, true)
	require.NoError(t, err)

	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, db.pool.QueryRow(ctx, db.sql(q), args...).Scan(&n))
		return n
	}
	records := count(`SELECT count(*) FROM {s}.records`)
	// The manifest rides in the bet's transaction, before its append.
	a.pub.keep(aAt, []byte(`{"lost":1}`), nil)
	out := []byte("the lost bet's output")
	sum := sha256.Sum256(out)
	_, err = betAppend(t, a, aAt, asess, "lost-bet", 1, out, true)
	require.ErrorIs(t, err, runstate.ErrConflict, "a bet on a head that moved")
	_, lost := a.opt.counts()
	require.Equal(t, 1, lost)
	assert.Equal(t, records, count(`SELECT count(*) FROM {s}.records`), "no record of the lost bet")
	assert.Zero(t, count(`SELECT count(*) FROM {s}.outputs`), "no output row of it")
	assert.Zero(t, count(`SELECT count(*) FROM {s}.blobs WHERE sha256 = $1`, sum[:]), "no blob row of it")
	assert.Zero(t, count(`SELECT count(*) FROM {s}.blob_chunks WHERE sha256 = $1`, sum[:]), "no blob chunk of it")
	assert.Zero(t, count(`SELECT count(*) FROM {s}.projections WHERE manifest = '{"lost":1}'`), "no projection of it")

	// a decides again under the lock: the blob rides with that batch.
	bl, err := a.Lock(ctx, aAt)
	require.NoError(t, err)
	defer bl.Abort()
	pos := aAt
	require.NoError(t, bl.Tail(func(line []byte) error {
		pos = runstate.Position{Seq: pos.Seq + 1, Hash: lineHash(line), End: pos.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
		return nil
	}))
	line := fmt.Sprintf(`{"seq":%d,"ev":"note","session":%q,"prev":%q}`, pos.Seq+1, asess, pos.Hash)
	to := runstate.Position{Seq: pos.Seq + 1, Hash: lineHash([]byte(line)), End: pos.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
	rec := &runstate.Record{Seq: to.Seq, At: bl.Now(), Ev: "note", Session: asess,
		Outputs: []runstate.Output{{Path: "out/again", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(out))}}}
	require.NoError(t, bl.Append([]*runstate.Record{rec}, []byte(line+"\n"), to))
	require.NoError(t, bl.Sync(ctx))
	require.NoError(t, bl.Unlock())
	assert.Equal(t, 1, count(`SELECT count(*) FROM {s}.outputs WHERE sha256 = $1 AND data = $2`, sum[:], out), "the bytes in the output's row, stored with the batch decided again")
	assert.Zero(t, count(`SELECT count(*) FROM {s}.blobs WHERE sha256 = $1`, sum[:]), "and not also as a blob")
}

// The connection lost around an optimistic batch's commit, the Sync of
// its implicit transaction: cut before the Sync reaches the server (not
// committed: the batch runs again under the lock), or after the server
// committed and before its ReadyForQuery reaches the store (committed:
// resolved by content). Either way the batch is acknowledged and each of
// its records (and its blob) is there exactly once, for each shape of
// the bet's statement, lazy and synced.
func TestBetCommitCutNeverLosesAnAcknowledgedBatchNorRecordsItTwice(t *testing.T) {
	for _, cut := range []pgproxy.Cut{pgproxy.BeforeCommit, pgproxy.AfterCommit} {
		for _, shape := range betShapes {
			for _, sync := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/%s/sync=%v", cut, shape.name, sync), func(t *testing.T) {
					f := newCutFixture(t)
					s, session, at := openBetting(t, f.db, f.run)
					at, err := betAppend(t, s, at, session, "before", 1, nil, true)
					require.NoError(t, err)

					var out []byte
					if shape.out {
						out = []byte("the cut batch's output")
					}
					a := f.proxy.Arm(pgproxy.Rule{Cut: cut, Match: []string{"cut-me"}})
					at, err = betAppend(t, s, at, session, "cut-me", shape.n, out, sync)
					require.True(t, a.Wait(time.Second), "the proxy did not cut: %q", f.proxy.Log())
					where := "message 'S' not forwarded"
					if cut == pgproxy.AfterCommit {
						where = "ReadyForQuery of the implicit transaction's Sync not forwarded"
					}
					assert.True(t, strings.Contains(strings.Join(f.proxy.Log(), "\n"), where), "the cut was at the Sync: %q", f.proxy.Log())
					require.NoError(t, err, "the batch must be acknowledged: re-run (cut before the Sync) or resolved as committed (after)")
					assert.Equal(t, shape.n, f.copies(t, "cut-me"), "each record of the batch exactly once")
					if out != nil {
						rc, err := f.direct.Store(f.run).Blobs().Get(context.Background(), lineHash(out))
						require.NoError(t, err, "the batch's output bytes are stored")
						got, err := io.ReadAll(rc)
						require.NoError(t, err)
						assert.Equal(t, out, got)
					}

					// The store goes on from where it is, betting again.
					_, err = betAppend(t, s, at, session, "after", 1, nil, true)
					require.NoError(t, err)
					assert.Len(t, readAll(t, f.direct.Store(f.run)), 3+shape.n)
					assert.Equal(t, 1, f.copies(t, "after"))
				})
			}
		}
	}
}

// A cut right after an optimistic batch's Sync was sent: whether its
// implicit transaction committed is a race. The batch is acknowledged and
// there once (committed, or re-run), never acknowledged and absent, never
// twice.
func TestBetCommitCutRacingTheSyncIsOneOrNone(t *testing.T) {
	f := newCutFixture(t)
	s, session, at := openBetting(t, f.db, f.run)
	for i := range 10 {
		marker := fmt.Sprintf("race-%d-", i)
		a := f.proxy.Arm(pgproxy.Rule{Cut: pgproxy.AfterCommitSent, Match: []string{marker}})
		next, err := betAppend(t, s, at, session, marker, 2, nil, i%2 == 0)
		require.True(t, a.Wait(time.Second))
		require.NoError(t, err, "round %d: the batch is re-run or resolved as committed", i)
		assert.Equal(t, 2, f.copies(t, marker), "round %d: acknowledged, so both records exactly once", i)
		at = next
	}
}

// A bet's lost transaction that lands after the resolver found it absent
// (its backend had the pipeline but ran it late: a bet takes the head row
// only in its commit round trip, so the resolver's wait for the row does
// not order it) is found by content when the re-run finds the head moved:
// the batch is acknowledged, its records are there once, and the store
// goes on from them. (The re-run alone would report "nothing was
// recorded" for records that are there.)
func TestBetThatLandsAfterTheResolverFoundItAbsentIsAcknowledged(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	s, session, at := openBetting(t, db, "late")
	ob, ok := s.LockOptimistic(at)
	require.True(t, ok)
	defer ob.Abort()
	b := ob.(betBatch).batch
	line := fmt.Sprintf(`{"seq":%d,"ev":"note","session":%q,"note":"late","prev":%q}`, at.Seq+1, session, at.Hash)
	to := runstate.Position{Seq: at.Seq + 1, Hash: lineHash([]byte(line)), End: at.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
	require.NoError(t, b.Append([]*runstate.Record{{Seq: to.Seq, At: b.Now(), Ev: "note", Session: session}}, []byte(line+"\n"), to))
	// The commit round trip as the lost connection sent it; it lands on
	// another connection once the resolver has found it absent.
	pb, err := b.betBatch(ctx, false)
	require.NoError(t, err)
	landed := false
	afterResolve = func() {
		landed = true
		require.NoError(t, db.pool.SendBatch(ctx, pb).Close(), "the lost transaction lands late")
	}
	t.Cleanup(func() { afterResolve = nil })
	require.NoError(t, b.settle(ctx, io.ErrUnexpectedEOF, false), "the late transaction's records are the batch's")
	require.True(t, landed, "the resolver found the batch absent first")
	b.synced = true
	require.NoError(t, ob.Unlock())
	lines := readAll(t, db.Store("late"))
	require.Len(t, lines, int(to.Seq))
	assert.Equal(t, line, string(lines[to.Seq-1]), "the batch's record, once")
	_, err = betAppend(t, s, to, session, "after", 1, nil, true)
	require.NoError(t, err, "the store goes on from the batch's record")
}
