package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blobRun is a run with a small output and one of two chunks, made on a
// machine that then went away.
func blobRun(t *testing.T, db *DB) (small, big []byte) {
	t.Helper()
	ctx := context.Background()
	small, big = []byte("small\n"), bigOutput()
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "verify blobs"})
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "make", func(ctx context.Context, st *runstate.Stage) error {
		if err := st.WriteFile("out/small.txt", small); err != nil {
			return err
		}
		return st.WriteFile("out/big.bin", big)
	}))
	require.NoError(t, r.Close())
	return small, big
}

func sumOf(data []byte) []byte {
	h := sha256.Sum256(data)
	return h[:]
}

// TestVerifyRehashesBlobs: with RehashBlobs, Verify reads every blob's
// bytes back from blob_chunks and reports a blob whose bytes no longer
// hash to its sha256 (a byte changed, the size the same: the row counts
// cannot tell), naming the run, the output's stage, path and record, and
// what to do; a missing chunk is reported once; a clean run is clean.
func TestVerifyRehashesBlobs(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	_, big := blobRun(t, db)
	rep, err := db.Verify(ctx, "r", RehashBlobs())
	require.NoError(t, err)
	assert.Empty(t, rep.Problems, "a clean run is clean")

	// One byte of the big blob's second chunk flipped, its length kept.
	tag, err := db.pool.Exec(ctx, db.sql(`UPDATE {s}.blob_chunks SET data = overlay(data placing '\xff'::bytea from 100 for 1) WHERE sha256 = $1 AND n = 1`), sumOf(big))
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
	rep, err = db.Verify(ctx, "r")
	require.NoError(t, err)
	assert.Empty(t, rep.Problems, "without RehashBlobs the bytes are not read")

	rep, err = db.Verify(ctx, "r", RehashBlobs())
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1, "%v", rep.Problems)
	p := rep.Problems[0]
	assert.Contains(t, p.File, `run "r"`)
	assert.Contains(t, p.What, "output out/big.bin of stage make (record ")
	assert.Contains(t, p.What, hex.EncodeToString(sumOf(big)))
	assert.Contains(t, p.What, "another hash")
	assert.Contains(t, p.Fix, "restore "+db.schema+".blob_chunks from a backup")
	assert.Contains(t, p.Fix, "run stage make in a working directory without out/big.bin", "the repair a rerun makes")

	// The big blob's first chunk gone: the row check finds it, and the
	// rehash does not report it a second time.
	_, err = db.pool.Exec(ctx, db.sql(`DELETE FROM {s}.blob_chunks WHERE sha256 = $1 AND n = 0`), sumOf(big))
	require.NoError(t, err)
	rep, err = db.Verify(ctx, "r", RehashBlobs())
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1, "%v", rep.Problems)
	assert.Contains(t, rep.Problems[0].What, "output out/big.bin of stage make (record ")
	assert.Contains(t, rep.Problems[0].What, "1 of 2 chunks")
}

// TestVerifyChecksTheBytesInAnOutputsRow: a small output's bytes are in
// its outputs row (schema version 4), where the check outputs_data_sum
// refuses bytes that do not hash to the row's sha256. Edited by hand with
// the check dropped, Verify (without RehashBlobs: the row's bytes are
// small) reports the output, and Get refuses the bytes (ErrCorrupt).
func TestVerifyChecksTheBytesInAnOutputsRow(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	small, _ := blobRun(t, db)
	var inRow, asBlob int
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT (SELECT count(*) FROM {s}.outputs WHERE sha256 = $1 AND data = $2),
		(SELECT count(*) FROM {s}.blobs WHERE sha256 = $1)`), sumOf(small), small).Scan(&inRow, &asBlob))
	assert.Equal(t, 1, inRow, "the small output's bytes are in its row")
	assert.Zero(t, asBlob, "and not in blobs")

	_, err := db.pool.Exec(ctx, db.sql(`UPDATE {s}.outputs SET data = $2 WHERE sha256 = $1`), sumOf(small), []byte("smell\n"))
	require.Error(t, err, "the check refuses other bytes")
	assert.Contains(t, err.Error(), "outputs_data_sum")

	_, err = db.pool.Exec(ctx, db.sql(`ALTER TABLE {s}.outputs DROP CONSTRAINT outputs_data_sum`))
	require.NoError(t, err)
	_, err = db.pool.Exec(ctx, db.sql(`UPDATE {s}.outputs SET data = $2 WHERE sha256 = $1`), sumOf(small), []byte("smell\n"))
	require.NoError(t, err)
	rep, err := db.Verify(ctx, "r")
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1, "%v", rep.Problems)
	assert.Contains(t, rep.Problems[0].What, "output out/small.txt of stage make (record ")
	assert.Contains(t, rep.Problems[0].What, "the bytes in its outputs row are not the ones its sha256 and size name")
	assert.Contains(t, rep.Problems[0].Fix, "restore "+db.schema+".outputs from a backup")

	rc, err := db.Store("r").Blobs().Get(ctx, hex.EncodeToString(sumOf(small)))
	require.NoError(t, err)
	_, err = io.ReadAll(rc)
	require.ErrorIs(t, err, runstate.ErrCorrupt)
}
