package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// testDSN is the server the tests use: RUNSTATE_PG_DSN. Without it the
// test skips, except under CI=true, where a missing server fails it.
func testDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("RUNSTATE_PG_DSN")
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("RUNSTATE_PG_DSN is not set and CI is: .ci/run starts the server and sets it")
		}
		t.Skip("RUNSTATE_PG_DSN is not set: run pgstore/testdb.sh go test ./... to start a throwaway server")
	}
	return dsn
}

// newSchema returns a fresh schema name, t_<random>, dropped at cleanup.
func newSchema(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	dsn := testDSN(t)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+name+" CASCADE")
	})
	return name
}

// withSchema adds schema=NAME to a URL DSN.
func withSchema(dsn, schema string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&schema=" + schema
	}
	return dsn + "?schema=" + schema
}

// newTestDB connects to a schema of its own.
func newTestDB(t testing.TB) *DB {
	t.Helper()
	db, err := Connect(context.Background(), withSchema(testDSN(t), newSchema(t)))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return db
}

// serverSetting is a server setting a test connects with, as a user's,
// database's or server's default could set it: its DSN value, and the
// value current_setting then shows.
type serverSetting struct{ name, value, shows string }

// connectWith connects to base's schema with settings as DSN parameters,
// checks that each reached the connection, and closes the DB when the
// test ends, after the cleanups registered later (the runs' Close).
func connectWith(t *testing.T, base *DB, settings ...serverSetting) *DB {
	t.Helper()
	ctx := context.Background()
	dsn := withSchema(testDSN(t), base.schema)
	for _, s := range settings {
		dsn += "&" + s.name + "=" + url.PathEscape(s.value)
	}
	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	for _, s := range settings {
		var got string
		require.NoError(t, db.pool.QueryRow(ctx, "SELECT current_setting($1)", s.name).Scan(&got))
		require.Equal(t, s.shows, got, "the DSN's %s reached the connection", s.name)
	}
	return db
}
