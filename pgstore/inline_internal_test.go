package pgstore

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

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// commitOutputs commits one batch from the head the store knows: a
// record per element of outs, naming those outputs, under the lock
// (locked) or as a bet. It Puts nothing: the test does.
func commitOutputs(t *testing.T, s *store, from runstate.Position, session string, locked bool, outs ...[]runstate.Output) runstate.Position {
	t.Helper()
	return commitOutputsAs(t, s, from, session, locked, true, outs...)
}

// commitOutputsAs is commitOutputs whose batch commits synchronously
// (sync: Sync) or as a batch of begins does (Unlock alone under the lock,
// Confirm as a bet).
func commitOutputsAs(t *testing.T, s *store, from runstate.Position, session string, locked, sync bool, outs ...[]runstate.Output) runstate.Position {
	t.Helper()
	ctx := context.Background()
	var b runstate.Batch
	if locked {
		var err error
		b, err = s.Lock(ctx, from)
		require.NoError(t, err)
	} else {
		ob, ok := s.LockOptimistic(from)
		require.True(t, ok, "the store bets on the head it knows (%d)", from.Seq)
		b = ob
	}
	defer b.Abort() // a no-op after Unlock
	pos := from
	var recs []*runstate.Record
	var lines bytes.Buffer
	for _, o := range outs {
		rec := &runstate.Record{Seq: pos.Seq + 1, At: b.Now(), Ev: "note", Session: session, Outputs: o}
		line := fmt.Sprintf(`{"seq":%d,"at":%q,"ev":"note","session":%q,"note":"outputs","prev":%q}`, rec.Seq, rec.At.Format(time.RFC3339Nano), session, pos.Hash)
		recs = append(recs, rec)
		lines.WriteString(line + "\n")
		pos = runstate.Position{Seq: rec.Seq, Hash: lineHash([]byte(line)), End: pos.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
	}
	require.NoError(t, b.Append(recs, lines.Bytes(), pos))
	switch {
	case sync:
		require.NoError(t, b.Sync(ctx))
	case !locked:
		require.NoError(t, b.(runstate.OptimisticBatch).Confirm(ctx))
	}
	require.NoError(t, b.Unlock())
	return pos
}

// TestSmallOutputsRideInTheirRows (schema version 4): a small output's
// bytes, Put before its record, are stored in the row of each output of
// the batch that names them, in a batch of several records (the array
// statement) as in a bet of one (the scalar one), and not as a blob. A
// blob that no output of the batch names goes to blobs. An output whose
// bytes were Put but taken by an earlier batch with another record of the
// same content (pending blobs are the session's) gets them from that
// row; one whose bytes are only in blobs names its blob. Get reads each.
func TestSmallOutputsRideInTheirRows(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	s, session, at := openBetting(t, db, "inline")
	x, y, z := []byte("the same bytes twice\n"), []byte("other bytes\n"), []byte("bytes for a later batch\n")
	out := func(path string, data []byte) runstate.Output {
		sum := sha256.Sum256(data)
		return runstate.Output{Path: path, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
	}
	for _, data := range [][]byte{x, x, y, z} { // x by two stages
		o := out("", data)
		require.NoError(t, s.Blobs().Put(ctx, o.SHA256, o.Size, bytes.NewReader(data)))
	}
	at = commitOutputs(t, s, at, session, true, []runstate.Output{out("a/x", x)}, []runstate.Output{out("b/x", x), out("b/y", y)})
	at = commitOutputs(t, s, at, session, false, []runstate.Output{out("c/x", x)})
	commitOutputs(t, s, at, session, false, []runstate.Output{out("d/z", z)})

	rows, err := db.pool.Query(ctx, db.sql(`SELECT path, coalesce(data, ''), blob IS NOT NULL FROM {s}.outputs ORDER BY path`))
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var path string
		var data []byte
		var blob bool
		err := r.Scan(&path, &data, &blob)
		return fmt.Sprintf("%s %q blob=%v", path, data, blob), err
	})
	require.NoError(t, err)
	assert.Equal(t, []string{
		`a/x "the same bytes twice\n" blob=false`,
		`b/x "the same bytes twice\n" blob=false`,
		`b/y "other bytes\n" blob=false`,
		`c/x "the same bytes twice\n" blob=false`,
		`d/z "" blob=true`,
	}, got)
	rows, err = db.pool.Query(ctx, db.sql(`SELECT b.sha256 FROM {s}.blobs b JOIN {s}.blob_chunks c USING (sha256)`))
	require.NoError(t, err)
	blobs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	require.NoError(t, err)
	assert.Equal(t, [][]byte{sumOf(z)}, blobs, "only the bytes no output of their batch named are a blob")

	for _, data := range [][]byte{x, y, z} {
		rc, err := s.Blobs().Get(ctx, hex.EncodeToString(sumOf(data)))
		require.NoError(t, err)
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		assert.Equal(t, data, b)
	}
	_, err = s.Blobs().Get(ctx, hex.EncodeToString(sumOf([]byte("never stored"))))
	require.ErrorIs(t, err, errNotExist)
}

// A batch that commits with synchronous_commit off (a batch of begins,
// under the lock or as a bet) carries only the pending small blobs that
// its own outputs name: the bytes of another record's output stay for
// the batch that records it, which holds them in its row (with 8
// goroutines on one run, the batch of begins took the bytes of the
// completes queued behind it, and they went to blobs). A synchronous
// batch still carries every pending one (Put's promise).
func TestALazyBatchCarriesOnlyTheBlobsItsOutputsName(t *testing.T) {
	ctx := context.Background()
	for _, locked := range []bool{true, false} {
		t.Run(fmt.Sprintf("locked=%v", locked), func(t *testing.T) {
			db := newTestDB(t)
			s, session, at := openBetting(t, db, "lazyblobs")
			mine, later, stray := []byte("the lazy record's bytes\n"), []byte("a complete's bytes\n"), []byte("bytes no record names\n")
			out := func(path string, data []byte) runstate.Output {
				return runstate.Output{Path: path, SHA256: hex.EncodeToString(sumOf(data)), Size: int64(len(data))}
			}
			for _, data := range [][]byte{mine, later, stray} {
				o := out("", data)
				require.NoError(t, s.Blobs().Put(ctx, o.SHA256, o.Size, bytes.NewReader(data)))
			}
			at = commitOutputsAs(t, s, at, session, locked, false, nil, []runstate.Output{out("lazy/mine", mine)})
			blobRows := func() [][]byte {
				rows, err := db.pool.Query(ctx, db.sql(`SELECT sha256 FROM {s}.blobs ORDER BY sha256`))
				require.NoError(t, err)
				got, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
				require.NoError(t, err)
				return got
			}
			require.Empty(t, blobRows(), "the lazy batch stored bytes none of its outputs names as blobs")
			s.blobs.mu.Lock()
			require.Len(t, s.blobs.pending, 2, "the bytes the lazy batch does not name stay pending")
			s.blobs.mu.Unlock()

			commitOutputsAs(t, s, at, session, locked, true, []runstate.Output{out("sync/later", later)})
			rows, err := db.pool.Query(ctx, db.sql(`SELECT path, coalesce(data, '') FROM {s}.outputs ORDER BY path`))
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
				var path string
				var data []byte
				err := r.Scan(&path, &data)
				return fmt.Sprintf("%s %q", path, data), err
			})
			require.NoError(t, err)
			assert.Equal(t, []string{`lazy/mine "the lazy record's bytes\n"`, `sync/later "a complete's bytes\n"`}, got)
			assert.Equal(t, [][]byte{sumOf(stray)}, blobRows(), "the synchronous batch stores the bytes no output names as a blob")
			s.blobs.mu.Lock()
			assert.Empty(t, s.blobs.pending)
			s.blobs.mu.Unlock()
		})
	}
}

// On the pipeline the append statement waits for the head row (aheadForm)
// only where it is the first of its transaction to lock anything: a batch
// whose small blobs go to blobs before it (their keys locked by their
// inserts) takes the row NOWAIT (betForm), as a bet off the pipeline
// does, since a wait there could deadlock with a locked batch holding the
// row and storing the same blob.
func TestAnAppendAfterBlobInsertsTakesTheHeadNowait(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	s, session, at := openBetting(t, db, "aheadform")
	mine, stray := []byte("the record's bytes\n"), []byte("bytes no record names\n")
	o := runstate.Output{Path: "out/mine", SHA256: hex.EncodeToString(sumOf(mine)), Size: int64(len(mine))}
	for _, data := range [][]byte{mine, stray} {
		require.NoError(t, s.Blobs().Put(ctx, hex.EncodeToString(sumOf(data)), int64(len(data)), bytes.NewReader(data)))
	}
	// appendAt is the append statement of pb and its place.
	appendAt := func(pb *pgx.Batch) (string, int) {
		for i, q := range pb.QueuedQueries {
			if strings.HasPrefix(q.SQL, "WITH head AS") {
				return q.SQL, i
			}
		}
		t.Fatalf("no append statement in %d queued", len(pb.QueuedQueries))
		return "", 0
	}
	for _, tc := range []struct {
		name   string
		sync   bool // a synchronous batch takes every pending blob: stray too
		blobs  int  // statements queued before the append
		nowait bool
	}{
		{"lazy: its own output's bytes in its row", false, 0, false},
		{"sync: the stray blob stored first", true, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ob, ok := s.LockOptimistic(at)
			require.True(t, ok)
			defer ob.Abort()
			rec := &runstate.Record{Seq: at.Seq + 1, At: ob.Now(), Ev: "note", Session: session, Outputs: []runstate.Output{o}}
			line := fmt.Sprintf(`{"seq":%d,"at":%q,"ev":"note","session":%q,"note":"outputs","prev":%q}`, rec.Seq, rec.At.Format(time.RFC3339Nano), session, at.Hash)
			to := runstate.Position{Seq: rec.Seq, Hash: lineHash([]byte(line)), End: at.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
			require.NoError(t, ob.Append([]*runstate.Record{rec}, []byte(line+"\n"), to))
			b := ob.(betBatch).batch
			var pb pgx.Batch
			b.queueWrites(&pb, !tc.sync, []any{b.ses.key, !tc.sync}, aheadForm)
			defer s.blobs.putBack(b.inline)
			q, place := appendAt(&pb)
			assert.Equal(t, tc.blobs, place, "blob statements before the append")
			assert.Equal(t, tc.nowait, strings.Contains(q, "NOWAIT"), "the append statement takes the head row NOWAIT")
			want := aheadForm
			if tc.nowait {
				want = betForm
			}
			assert.Equal(t, db.sql(want[appendOneOutputSQL]), q)
		})
	}
}
