package pgstore

import (
	"context"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/require"
)

// foreignKeys returns the names of the foreign keys of the schema's tables.
func (db *DB) foreignKeys(t *testing.T) []string {
	t.Helper()
	rows, err := db.pool.Query(context.Background(), `SELECT conname FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
		WHERE n.nspname = $1 AND c.contype = 'f' ORDER BY conname`, db.schema)
	require.NoError(t, err)
	var names []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names = append(names, n)
	}
	require.NoError(t, rows.Err())
	return names
}

// A run written at schema version 1 (with the foreign keys from records
// to runs and from outputs to records) is upgraded by the next Connect to
// version 2 (without them; outputs' key to blobs stays), and reads and
// appends as before.
func TestMigrationToVersion2KeepsVersion1RunsReadableAndWritable(t *testing.T) {
	ctx := context.Background()
	dsn := withSchema(testDSN(t), newSchema(t))
	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	run, err := db.Open(ctx, "old", t.TempDir(), &runstate.Options{Request: "migrate"})
	require.NoError(t, err)
	for _, name := range []string{"a", "b"} {
		require.NoError(t, run.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
			return st.WriteFile(name+".txt", []byte("output of "+name))
		}))
	}
	require.NoError(t, run.Close())
	// Back to version 1, as a database written by the earlier pgstore is.
	for _, q := range []string{
		`ALTER TABLE {s}.records ADD CONSTRAINT records_run_id_fkey FOREIGN KEY (run_id) REFERENCES {s}.runs`,
		`ALTER TABLE {s}.outputs ADD CONSTRAINT outputs_run_id_seq_fkey FOREIGN KEY (run_id, seq) REFERENCES {s}.records`,
		`DELETE FROM {s}.schema_version WHERE version > 1`,
	} {
		_, err := db.pool.Exec(ctx, db.sql(q))
		require.NoError(t, err, q)
	}
	require.Equal(t, []string{"outputs_run_id_seq_fkey", "outputs_sha256_fkey", "projections_run_id_fkey", "records_run_id_fkey", "sessions_run_id_fkey"}, db.foreignKeys(t))
	db.Close()

	db, err = Connect(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	v, err := db.version(ctx, db.pool)
	require.NoError(t, err)
	require.Equal(t, 2, v)
	require.Equal(t, []string{"outputs_sha256_fkey", "projections_run_id_fkey", "sessions_run_id_fkey"}, db.foreignKeys(t))

	st, err := db.Inspect(ctx, "old")
	require.NoError(t, err)
	require.Equal(t, 2, countComplete(st), "both stages of the version 1 run are complete")
	run, err = db.Open(ctx, "old", t.TempDir(), &runstate.Options{Request: "migrate"})
	require.NoError(t, err)
	require.NoError(t, run.Do(ctx, "c", func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("c.txt", []byte("output of c"))
	}))
	require.NoError(t, run.Close())
	recs := checkChain(t, db, "old")
	completes := 0
	for _, r := range recs {
		if r.Ev == "complete" {
			completes++
		}
	}
	require.Equal(t, 3, completes)
	rep, err := runstate.VerifyStore(ctx, db.Store("old"), "")
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
}

func countComplete(st *runstate.Status) int {
	n := 0
	for _, s := range st.Stages {
		if s.State == runstate.StateComplete {
			n++
		}
	}
	return n
}
