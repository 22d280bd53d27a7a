package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// betAppendNamed is betAppend with one record naming an output of out's
// bytes WITHOUT a Put just before (the Put came earlier: the Complete's
// storeOutputs, whose pending blob another goroutine's batch took).
func betAppendNamed(t *testing.T, s *store, from runstate.Position, session, marker string, out []byte) (runstate.Position, error) {
	t.Helper()
	ctx := context.Background()
	ob, ok := s.LockOptimistic(from)
	require.True(t, ok)
	defer ob.Abort()
	sum := sha256.Sum256(out)
	o := runstate.Output{Path: "out/" + marker, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(out))}
	rec := &runstate.Record{Seq: from.Seq + 1, At: ob.Now(), Ev: "note", Session: session, Note: marker, Prev: from.Hash, Outputs: []runstate.Output{o}}
	line := fmt.Sprintf(`{"seq":%d,"at":%q,"ev":"note","session":%q,"note":%q,"prev":%q}`, rec.Seq, rec.At.Format(time.RFC3339Nano), session, rec.Note, from.Hash)
	pos := runstate.Position{Seq: rec.Seq, Hash: lineHash([]byte(line)), End: from.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
	require.NoError(t, ob.Append([]*runstate.Record{rec}, []byte(line+"\n"), pos))
	if err := ob.Sync(ctx); err != nil {
		return pos, err
	}
	return pos, ob.Unlock()
}

// A session's small Put (at most 64 KiB) waits in pending, and a batch
// that carries it without an outputs row holding it (another goroutine's
// synchronous batch) stores it as a blob: that replaces damaged chunks
// too (runstate.Blobs.Put), so the Complete's row, which then points at
// the blob (no row of its batch holds the bytes), reads the repaired
// bytes. (Found in review: queueInline had ON CONFLICT DO NOTHING.)
func TestASessionsSmallPutRepairsADamagedBlob(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("a small output "), 100)
	sum := hex.EncodeToString(sumOf(data))
	// The bytes as a blob (no outputs row holds them: e.g. a record of
	// schema version 3, or one whose batch did not carry them).
	require.NoError(t, db.Store("r0").Blobs().Put(ctx, sum, int64(len(data)), bytes.NewReader(data)))
	tag, err := db.pool.Exec(ctx, db.sql(`UPDATE {s}.blob_chunks SET data = overlay(data placing '\xff'::bytea from 3 for 1) WHERE sha256 = $1`), sumOf(data))
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	s, session, at := openBetting(t, db, "r")
	// Goroutine 1's Complete: storeOutputs puts the bytes again (damaged).
	require.NoError(t, s.Blobs().Put(ctx, sum, int64(len(data)), bytes.NewReader(data)))
	// Goroutine 2's synchronous batch (another stage's complete) commits
	// first and takes every pending blob.
	at, err = betAppend(t, s, at, session, "other", 1, nil, true)
	require.NoError(t, err)
	// Goroutine 1's batch: its record names the output.
	_, err = betAppendNamed(t, s, at, session, "mine", data)
	require.NoError(t, err)

	var inline bool
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT EXISTS (SELECT 1 FROM {s}.outputs WHERE sha256 = $1 AND data IS NOT NULL)`), sumOf(data)).Scan(&inline))
	assert.False(t, inline, "the interleaving: no outputs row holds the bytes")
	rc, err := s.Blobs().Get(ctx, sum)
	require.NoError(t, err)
	_, err = io.ReadAll(rc)
	assert.NoError(t, err, "Put replaced what the blob held")
}

// Two goroutines of a session that wrote the same small bytes put them
// twice; the batch that stores them as blobs stores them once (an ON
// CONFLICT DO UPDATE may not meet one row twice: 21000), and commits.
func TestTheSameSmallBytesPutTwiceGoOnceIntoABatch(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	data := []byte("the same bytes, from two goroutines")
	sum := hex.EncodeToString(sumOf(data))
	s, session, at := openBetting(t, db, "r")
	for range 2 {
		require.NoError(t, s.Blobs().Put(ctx, sum, int64(len(data)), bytes.NewReader(data)))
	}
	_, err := betAppend(t, s, at, session, "sync", 1, nil, true) // a synchronous batch takes every pending blob
	require.NoError(t, err)
	rc, err := s.Blobs().Get(ctx, sum)
	require.NoError(t, err)
	got, err := io.ReadAll(rc)
	require.NoError(t, rc.Close())
	require.NoError(t, err)
	assert.Equal(t, data, got)
}
