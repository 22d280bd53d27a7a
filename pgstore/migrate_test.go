package pgstore

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpgradeFromVersion1DropsThePerRowKeysAndKeepsTheRuns: a schema that
// an earlier pgstore made (version 1, with the foreign keys records → runs
// and outputs → records, checked on every appended row) is upgraded by
// Connect to version 2 without them (and on, to the newest); a run recorded before the upgrade,
// with an output, resumes after it: its stage is done, a new stage with an
// output is recorded, the ledger verifies (blobs rehashed), and an output
// naming bytes the database lacks is still refused (the key to blobs
// stays).
func TestUpgradeFromVersion1DropsThePerRowKeysAndKeepsTheRuns(t *testing.T) {
	ctx := context.Background()
	base := newTestDB(t)
	schema := newSchema(t)
	old := &DB{pool: base.pool, schema: schema, ident: pgx.Identifier{schema}.Sanitize(), where: base.where, lockCfg: base.lockCfg}
	require.NoError(t, old.migrateTo(ctx, 1))
	keys := func(db *DB) []string {
		rows, err := db.pool.Query(ctx, `SELECT conname FROM pg_constraint WHERE contype = 'f' AND connamespace = $1::regnamespace ORDER BY conname`, db.ident)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	require.Contains(t, keys(old), "records_run_id_fkey", "version 1 has the key")

	write := func(db *DB, stage string, done ...string) {
		t.Helper()
		r, err := db.Open(ctx, "kept", t.TempDir(), &runstate.Options{Request: "upgrade"})
		require.NoError(t, err)
		for _, d := range done {
			require.NoError(t, r.Do(ctx, d, func(context.Context, *runstate.Stage) error {
				t.Errorf("stage %s ran again after the upgrade", d)
				return nil
			}))
		}
		require.NoError(t, r.Do(ctx, stage, func(ctx context.Context, st *runstate.Stage) error {
			return st.WriteFile("out/"+stage+".txt", []byte("made by "+stage+"\n"))
		}))
		require.NoError(t, r.Close())
	}
	write(old, "before")

	db, err := Connect(ctx, withSchema(testDSN(t), schema))
	require.NoError(t, err)
	defer db.Close()
	v, err := db.version(ctx, db.pool)
	require.NoError(t, err)
	assert.Equal(t, SchemaVersion, v, "upgraded to the newest version (3: the run lock, no table change)")
	assert.Equal(t, []string{"outputs_sha256_fkey", "projections_run_id_fkey", "sessions_run_id_fkey"}, keys(db),
		"the per-row keys are gone; the key to blobs and those of the rows written once stay")

	write(db, "after", "before")
	st, err := db.Inspect(ctx, "kept")
	require.NoError(t, err)
	states := map[string]string{}
	for _, s := range st.Stages {
		states[s.Name] = s.State
	}
	assert.Equal(t, map[string]string{"before": "complete", "after": "complete"}, states)
	rep, err := db.Verify(ctx, "kept", RehashBlobs())
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%+v", rep.Problems)
	assert.Positive(t, rep.Records)

	// The key to blobs still refuses an output without its bytes.
	var runID string
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT id FROM {s}.runs WHERE name = 'kept'`)).Scan(&runID))
	_, err = db.pool.Exec(ctx, db.sql(`INSERT INTO {s}.outputs (run_id, seq, path, sha256, size) VALUES ($1, 1, 'x', sha256('no such bytes'), 1)`), runID)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "outputs_sha256_fkey")
}
