package pgstore

import (
	"context"
	"fmt"
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
