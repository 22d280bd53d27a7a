package pgstore

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCleanCloseLeavesTheDatabasesProjectionsAtTheCloseRecord: after a
// clean Close, the run's projections row holds the manifest and the
// handoff as of the close record, the handoff byte for byte what a reader
// renders from the records, also when the session's batches came faster
// than the database's handoff pace (handoffEvery): the Run publishes the
// close record's projections after its commit, so only the store's Close
// (writeKept) writes them (without it both stay at the last stage's
// complete).
func TestCleanCloseLeavesTheDatabasesProjectionsAtTheCloseRecord(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	for _, n := range []int{1, 3} {
		name := fmt.Sprintf("close-%d", n)
		r, err := db.Open(ctx, name, t.TempDir(), &runstate.Options{Request: "close"})
		require.NoError(t, err)
		for i := range n {
			require.NoError(t, r.Do(ctx, fmt.Sprintf("s%d", i), func(context.Context, *runstate.Stage) error { return nil }))
		}
		require.NoError(t, r.Close())
		st, err := db.Inspect(ctx, name)
		require.NoError(t, err)
		var seq, handoffSeq int64
		var handoff string
		require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT p.seq, p.handoff_seq, p.handoff FROM {s}.projections p JOIN {s}.runs r ON r.id = p.run_id WHERE r.name = $1`), name).
			Scan(&seq, &handoffSeq, &handoff))
		assert.Equal(t, st.Seq, seq, "%s: the manifest is the close record's", name)
		assert.Equal(t, st.Seq, handoffSeq, "%s: the handoff is the close record's", name)
		want, err := db.NextSteps(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, want, handoff, "%s: the stored handoff is the one a reader renders", name)
	}
}

// A manifest is stored compressed with lz4 where the server has it (CI's
// has: there the test requires it), the server's default (pglz) otherwise,
// and reads back whole either way.
func TestManifestIsStoredWithLZ4WhereTheServerHasIt(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	if os.Getenv("CI") == "true" {
		require.True(t, db.lz4, "CI's server is built with lz4")
	}
	dir := t.TempDir()
	r, err := db.Open(ctx, "r", dir, &runstate.Options{Request: "lz4"})
	require.NoError(t, err)
	for i := range 60 {
		require.NoError(t, r.Do(ctx, fmt.Sprintf("s%02d", i), func(ctx context.Context, st *runstate.Stage) error {
			return st.WriteFile(fmt.Sprintf("out/%02d.txt", i), []byte("some output\n"))
		}))
	}
	require.NoError(t, r.Close())
	var method *string
	var size int
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT pg_column_compression(manifest), length(manifest) FROM {s}.projections`)).Scan(&method, &size))
	require.NotNil(t, method, "a manifest of %d bytes is stored compressed", size)
	want := "pglz"
	if db.lz4 {
		want = "lz4"
	}
	assert.Equal(t, want, *method)
	st, err := db.Inspect(ctx, "r")
	require.NoError(t, err)
	assert.Len(t, st.Stages, 60)
}
