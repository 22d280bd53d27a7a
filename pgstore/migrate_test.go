package pgstore

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpgradeFromVersion1DropsThePerRowKeysAndKeepsTheRuns: a schema that
// an earlier pgstore made (version 1, with the foreign keys records → runs
// and outputs → records, checked on every appended row) is upgraded by
// Connect to version 2 without them, and on to the newest (4: a small
// output's bytes in its row); a run recorded before the upgrade, with an
// output in blobs, resumes after it: its stage is done, a new stage with
// an output is recorded (its bytes in its row), the ledger verifies
// (blobs rehashed), and an output naming bytes the database lacks is
// still refused (the key to blobs, now on the column blob). This pgstore
// writes version 4's columns only, so the run before the upgrade is
// recorded in a schema of the newest version and its rows are copied
// into the version 1 schema as a pgstore of version 1 stores them (the
// output's bytes in blobs and blob_chunks).
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
	src := newTestDB(t)
	write(src, "before")
	for _, q := range []string{
		`INSERT INTO {o}.runs SELECT id, name, last_seq, last_hash, last_end, last_len, last_at, created FROM {s}.runs`,
		`INSERT INTO {o}.records SELECT run_id, seq, line, hash, ev, stage, attempt, key, session, at FROM {s}.records`,
		`INSERT INTO {o}.blobs SELECT DISTINCT sha256, size, 1 FROM {s}.outputs WHERE data IS NOT NULL`,
		`INSERT INTO {o}.blob_chunks SELECT DISTINCT sha256, 0, data FROM {s}.outputs WHERE data IS NOT NULL`,
		`INSERT INTO {o}.outputs SELECT run_id, seq, path, sha256, size FROM {s}.outputs`,
		`INSERT INTO {o}.projections SELECT run_id, seq, hash, "end", last_len, crc, manifest, handoff_seq, handoff, at FROM {s}.projections`,
	} {
		_, err := base.pool.Exec(ctx, strings.NewReplacer("{o}", old.ident, "{s}", src.ident).Replace(q))
		require.NoError(t, err, q)
	}

	db, err := Connect(ctx, withSchema(testDSN(t), schema))
	require.NoError(t, err)
	defer db.Close()
	v, err := db.version(ctx, db.pool)
	require.NoError(t, err)
	assert.Equal(t, SchemaVersion, v, "upgraded to the newest version (4: small outputs in their rows)")
	assert.Equal(t, []string{"outputs_blob_fkey", "projections_run_id_fkey", "sessions_run_id_fkey"}, keys(db),
		"the per-row keys are gone; the key to blobs (on blob) and those of the rows written once stay")

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
	rows, err := db.pool.Query(ctx, db.sql(`SELECT path, data IS NOT NULL, blob IS NOT NULL FROM {s}.outputs ORDER BY seq`))
	require.NoError(t, err)
	where, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var path string
		var inRow, blob bool
		err := r.Scan(&path, &inRow, &blob)
		return fmt.Sprintf("%s row=%v blob=%v", path, inRow, blob), err
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"out/before.txt row=false blob=true", "out/after.txt row=true blob=false"}, where,
		"the output before the upgrade stays in blobs, the one after is in its row")

	// The key to blobs still refuses an output without its bytes.
	var runID string
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT id FROM {s}.runs WHERE name = 'kept'`)).Scan(&runID))
	_, err = db.pool.Exec(ctx, db.sql(`INSERT INTO {s}.outputs (run_id, seq, path, sha256, size) VALUES ($1, 1, 'x', sha256('no such bytes'), 1)`), runID)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "outputs_blob_fkey")
}
