package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
