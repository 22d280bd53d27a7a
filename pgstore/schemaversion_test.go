package pgstore

import (
	"context"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConnectRefusesTablesWithoutTheirSchemaVersion: a schema that holds
// pgstore's tables and a run, but whose schema_version table was emptied
// or dropped, is refused by Connect and ConnectReadOnly alike with
// runstate.ErrVersion naming the schema_version table and what to do
// (restore it, or use another schema), and Connect changes nothing: it
// neither applies the migrations again over the tables (which failed on
// "relation runs already exists", naming no cure) nor recreates an empty
// schema_version; ConnectReadOnly does not send the user to a writer that
// cannot fix it.
func TestConnectRefusesTablesWithoutTheirSchemaVersion(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	r, err := db.Open(ctx, "kept", t.TempDir(), &runstate.Options{Request: "schema version"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	dsn := withSchema(testDSN(t), db.schema)
	for _, damage := range []string{`DELETE FROM {s}.schema_version`, `DROP TABLE {s}.schema_version`} {
		_, err := db.pool.Exec(ctx, db.sql(damage))
		require.NoError(t, err, damage)
		for what, connect := range map[string]func(context.Context, string) (*DB, error){"Connect": Connect, "ConnectReadOnly": ConnectReadOnly} {
			got, err := connect(ctx, dsn)
			if got != nil {
				got.Close()
			}
			require.Error(t, err, "%s after %s", what, damage)
			assert.ErrorIs(t, err, runstate.ErrVersion, "%s after %s", what, damage)
			assert.Contains(t, err.Error(), db.schema+".schema_version is missing or empty", what)
			assert.Contains(t, err.Error(), "restore "+db.schema+".schema_version", what)
			assert.NotContains(t, err.Error(), "connect once with a writer", what)
		}
		var versions int
		if damage[:6] == "DELETE" {
			require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT count(*) FROM {s}.schema_version`)).Scan(&versions))
			assert.Zero(t, versions, "Connect recorded no version over tables it did not migrate")
		} else {
			var exists bool
			require.NoError(t, db.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, db.ident+".schema_version").Scan(&exists))
			assert.False(t, exists, "Connect made no new schema_version beside the old tables")
		}
		runs, err := db.Runs(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"kept"}, runs, "the run is left as it was")
	}
}
