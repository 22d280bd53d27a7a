package pgstore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bigOutput is more than one blob chunk, not a repetition of one byte.
func bigOutput() []byte {
	data := make([]byte, chunkSize+12345)
	for i := range data {
		data[i] = byte(i*31 + i/997)
	}
	return data
}

// A stage on machine B (its own work dir) that depends on a stage done on
// machine A finds A's outputs in its dir, byte for byte.
func TestAfterOutputsFollowTheRunToAnotherDir(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	opts := &runstate.Options{Request: "outputs across machines"}
	a, err := db.Open(ctx, "r", dirA, opts)
	require.NoError(t, err)
	big := bigOutput()
	require.NoError(t, a.Do(ctx, "make", func(ctx context.Context, st *runstate.Stage) error {
		if err := st.WriteFile("out/small.txt", []byte("small\n")); err != nil {
			return err
		}
		return st.WriteFile("out/big.bin", big)
	}))
	require.NoError(t, a.Close())

	b, err := db.Open(ctx, "r", dirB, opts)
	require.NoError(t, err)
	defer b.Close()
	var saw []byte
	require.NoError(t, b.Do(ctx, "use", func(ctx context.Context, st *runstate.Stage) error {
		var err error
		saw, err = os.ReadFile(filepath.Join(dirB, "out", "big.bin"))
		return err
	}, runstate.After("make")))
	assert.True(t, bytes.Equal(big, saw), "the big output arrived whole")
	small, err := os.ReadFile(filepath.Join(dirB, "out", "small.txt"))
	require.NoError(t, err)
	assert.Equal(t, "small\n", string(small))
}

// A done stage whose local copy was altered or removed is restored from
// the database and stays done; one whose bytes are gone from the database
// too runs again.
func TestDoneStageOutputRestoredFromTheStore(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	opts := &runstate.Options{Request: "restore"}
	r, err := db.Open(ctx, "r", dir, opts)
	require.NoError(t, err)
	defer r.Close()
	runs := 0
	stage := func(ctx context.Context, st *runstate.Stage) error {
		runs++
		return st.WriteFile("out/a.txt", []byte("the result\n"))
	}
	require.NoError(t, r.Do(ctx, "a", stage))
	p := filepath.Join(dir, "out", "a.txt")
	require.NoError(t, os.WriteFile(p, []byte("edited by hand\n"), 0o644))
	require.NoError(t, r.Do(ctx, "a", stage))
	assert.Equal(t, 1, runs, "an altered local copy is restored, not redone")
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "the result\n", string(got))

	require.NoError(t, os.Remove(p))
	require.NoError(t, r.Do(ctx, "a", stage))
	assert.Equal(t, 1, runs, "a missing local copy is restored")

	// The bytes gone from the database as well: the stage runs again.
	require.NoError(t, os.Remove(p))
	_, err = db.pool.Exec(ctx, db.sql(`DELETE FROM {s}.outputs; DELETE FROM {s}.blob_chunks; DELETE FROM {s}.blobs`))
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "a", stage))
	assert.Equal(t, 2, runs)
	st, err := r.Status()
	require.NoError(t, err)
	require.Len(t, st.Stages, 1)
	assert.Equal(t, runstate.StateComplete, st.Stages[0].State)
}

func TestOutputOverMaxBlobRefusedClearly(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	old := MaxBlob
	MaxBlob = 1000
	defer func() { MaxBlob = old }()
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "max blob"})
	require.NoError(t, err)
	defer r.Close()
	st, err := r.Begin(ctx, "a")
	require.NoError(t, err)
	require.NoError(t, st.WriteFile("big", make([]byte, 1001)))
	err = st.Complete()
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "MaxBlob")
	assert.Contains(t, err.Error(), "big")
	require.NoError(t, st.Fail(err))
}
