package pgstore

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Racing Connects create the schema once; each waits for the migration
// under way, also past a server's lock_timeout (here the DSN's: the wait
// is the caller's context's to bound).
func TestConnectCreatesSchemaOnceAmongRacers(t *testing.T) {
	for _, extra := range []string{"", "&lock_timeout=1"} {
		t.Run("dsn"+extra, func(t *testing.T) { testConnectRacers(t, withSchema(testDSN(t), newSchema(t))+extra) })
	}
}

func testConnectRacers(t *testing.T, dsn string) {
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			db, err := Connect(context.Background(), dsn)
			if err == nil {
				db.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	db, err := Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	var versions int
	require.NoError(t, db.pool.QueryRow(context.Background(), db.sql("SELECT count(*) FROM {s}.schema_version")).Scan(&versions))
	assert.Equal(t, SchemaVersion, versions)
}

func TestConnectRefusesUnreachableServerNamingIt(t *testing.T) {
	testDSN(t)
	_, err := Connect(context.Background(), "postgres://nobody@127.0.0.1:1/nodb?sslmode=disable&connect_timeout=2")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "127.0.0.1:1")
	assert.Contains(t, err.Error(), "check that the server runs")
}

func TestConnectRefusesMissingDatabase(t *testing.T) {
	u, err := url.Parse(testDSN(t))
	require.NoError(t, err)
	u.Path = "/no_such_db"
	_, err = Connect(context.Background(), u.String())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no_such_db")
	assert.Contains(t, err.Error(), "createdb")
}

func TestConnectRefusesNewerSchemaVersion(t *testing.T) {
	db := newTestDB(t)
	_, err := db.pool.Exec(context.Background(), db.sql("INSERT INTO {s}.schema_version (version) VALUES ($1)"), SchemaVersion+5)
	require.NoError(t, err)
	_, err = Connect(context.Background(), withSchema(testDSN(t), db.schema))
	require.ErrorIs(t, err, runstate.ErrVersion)
	assert.Contains(t, err.Error(), fmt.Sprintf("version %d", SchemaVersion+5))
	assert.Contains(t, err.Error(), "upgrade")
}

// A user without CREATE on the database gets the GRANT to run; one with
// only the table rights uses an existing schema.
func TestConnectWithoutCreateRightNamesTheGrant(t *testing.T) {
	dsn := testDSN(t)
	schema := newSchema(t)
	admin := adminConn(t, dsn)
	role := schema + "_user"
	asRole := roleDSN(t, admin, withSchema(dsn, schema), role, "")
	_, _ = admin.Exec(context.Background(), "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
	_, err := Connect(context.Background(), asRole)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "GRANT CREATE ON DATABASE")
	assert.Contains(t, err.Error(), role)
	assert.Contains(t, err.Error(), "create schema "+schema)

	// An owner creates the schema; the user gets table rights only.
	db, err := Connect(context.Background(), withSchema(dsn, schema))
	require.NoError(t, err)
	db.Close()
	_, err = admin.Exec(context.Background(), fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO %s", schema, role, schema, role))
	require.NoError(t, err)
	db, err = Connect(context.Background(), asRole)
	require.NoError(t, err, "a user with table rights uses a current schema")
	db.Close()
}

func TestConnectTakesSchemaFromDSN(t *testing.T) {
	schema := newSchema(t)
	for _, dsn := range []string{withSchema(testDSN(t), schema)} {
		db, err := Connect(context.Background(), dsn)
		require.NoError(t, err)
		assert.Equal(t, schema, db.Schema())
		var n int
		require.NoError(t, db.pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n))
		assert.Equal(t, 1, n)
		db.Close()
	}
	_, err := Connect(context.Background(), withSchema(testDSN(t), strings.Repeat("x", 64)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1 to 63 bytes")
}

func TestSplitSchema(t *testing.T) {
	for _, c := range []struct{ in, rest, schema string }{
		{"postgres://u@h/db", "postgres://u@h/db", ""},
		{"postgres://u@h/db?schema=a", "postgres://u@h/db", "a"},
		{"postgres://u@h/db?sslmode=disable&schema=a%20b&x=1", "postgres://u@h/db?sslmode=disable&x=1", "a b"},
		{"host=h schema=a", "host=h schema=a", ""},
		// pgx unescapes a key: it would send this one to the server as a setting
		{"postgres://u@h/db?sch%65ma=a&x=1", "postgres://u@h/db?x=1", "a"},
	} {
		rest, schema, err := splitSchema(c.in)
		require.NoError(t, err)
		assert.Equal(t, c.rest, rest, c.in)
		assert.Equal(t, c.schema, schema, c.in)
	}
	_, _, err := splitSchema("postgres://u@h/db?schema=a&sslmode=disable&schema=b")
	assert.ErrorContains(t, err, "the DSN names two schemas: give schema=NAME once")
}

// A server older than PostgreSQL 12 (no generated columns, no
// plan_cache_mode) is refused at Connect with its version and what to do,
// instead of a syntax error from the schema's migration or a failure at
// every batch; a version that cannot be read is let through.
func TestConnectRefusesAServerOlderThan12(t *testing.T) {
	for _, c := range []struct {
		version string
		refused bool
	}{
		{"15.18 (Debian 15.18-0+deb12u1)", false},
		{"12.0", false},
		{"18beta1", false},
		{"11.22", true},
		{"9.6.24", true},
		{"10.23 (Ubuntu 10.23-1)", true},
		{"", false},
		{"CockroachDB CCL v23.1", false},
	} {
		err := checkServerVersion("127.0.0.1:5432", c.version)
		if !c.refused {
			assert.NoError(t, err, c.version)
			continue
		}
		require.Error(t, err, c.version)
		assert.Contains(t, err.Error(), "127.0.0.1:5432 runs PostgreSQL "+c.version)
		assert.Contains(t, err.Error(), "needs PostgreSQL 12 or later")
	}
	// Connect checks it: a server that says it is 11.22 is refused (a
	// fake one, which answers the startup and pgx's ping).
	addr := fakeOldServer(t, "11.22")
	_, err := Connect(context.Background(), "postgres://agent@"+addr+"/agents?sslmode=disable&connect_timeout=5")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "runs PostgreSQL 11.22; pgstore needs PostgreSQL 12 or later")

	// The development and CI servers pass it.
	db := newTestDB(t)
	conn, err := db.pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, checkServerVersion(db.where, conn.Conn().PgConn().ParameterStatus("server_version")))
	require.NotEmpty(t, conn.Conn().PgConn().ParameterStatus("server_version"))
}

// A reader never creates the schema: a missing one is a clear error.
func TestConnectReadOnlyCreatesNothing(t *testing.T) {
	schema := newSchema(t)
	dsn := withSchema(testDSN(t), schema)
	_, err := ConnectReadOnly(context.Background(), dsn)
	require.ErrorIs(t, err, ErrNoRun)
	assert.Contains(t, err.Error(), "no runstate schema "+schema)
	admin, err := pgx.Connect(context.Background(), testDSN(t))
	require.NoError(t, err)
	defer admin.Close(context.Background())
	var n int
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n))
	assert.Equal(t, 0, n, "the schema was not created")

	db, err := Connect(context.Background(), dsn)
	require.NoError(t, err)
	db.Close()
	db, err = ConnectReadOnly(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	names, err := db.Runs(context.Background())
	require.NoError(t, err)
	assert.Empty(t, names)
	_, err = db.Inspect(context.Background(), "typo")
	assert.ErrorIs(t, err, ErrNoRun)
}

// A server that takes no writes from this connection (a hot standby, or
// default_transaction_read_only on for the user or database: here from
// the DSN) is named as such, with what to do, by Connect on a new schema
// and by the first write on an existing one.
func TestReadOnlyServerIsNamedWithWhatToDo(t *testing.T) {
	ctx := context.Background()
	schema := newSchema(t)
	ro := withSchema(testDSN(t), schema) + "&default_transaction_read_only=on"
	_, err := Connect(ctx, ro)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "read-only")
	assert.Contains(t, err.Error(), "connect to the primary")

	rw, err := Connect(ctx, withSchema(testDSN(t), schema)) // creates the schema
	require.NoError(t, err)
	rw.Close()
	db, err := Connect(ctx, ro)
	require.NoError(t, err, "a schema at the current version needs no write to connect")
	defer db.Close()
	_, err = db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "read-only"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "read-only")
	assert.Contains(t, err.Error(), "connect to the primary")
	assert.Contains(t, err.Error(), "ConnectReadOnly")
}

// A server with no connection slot left for the user (its CONNECTION
// LIMIT here; as well max_connections) is named as such, with what to
// do, not as a server that does not run.
func TestConnectPastTheConnectionLimitSaysSo(t *testing.T) {
	dsn := testDSN(t)
	schema := newSchema(t)
	admin := adminConn(t, dsn)
	_, err := Connect(context.Background(), roleDSN(t, admin, withSchema(dsn, schema), schema+"_none", "CONNECTION LIMIT 0"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "53300")
	assert.Contains(t, err.Error(), "no connection slot")
	assert.Contains(t, err.Error(), "pool_max_conns")
	assert.NotContains(t, err.Error(), "check that the server runs")
}

// roleDSN creates the login role role (with opts, such as "CONNECTION
// LIMIT 0"), dropped with what it owns when the test ends, and returns
// dsn as that role.
func roleDSN(t *testing.T, admin *pgx.Conn, dsn, role, opts string) string {
	t.Helper()
	_, err := admin.Exec(context.Background(), "CREATE ROLE "+role+" LOGIN "+opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String()
}

// adminConn connects as the tests' user (a superuser, who makes roles),
// and closes the connection when the test ends, after the cleanups
// registered later (roleDSN's, which drop the roles).
func adminConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	admin, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	return admin
}

// A server that accepts no connections now (57P03: starting up, shutting
// down, or, here, a standby in recovery with hot_standby off) is named as
// such, with what to do, not as a server that does not run.
func TestConnectToAServerThatAcceptsNoConnectionsNowSaysSo(t *testing.T) {
	s := startServer(t, nil, nil)
	require.NoError(t, s.Run("pg_ctl", "-D", s.Data, "-m", "fast", "-w", "stop"))
	require.NoError(t, os.WriteFile(filepath.Join(s.Data, "standby.signal"), nil, 0o644))
	s.Settings = append(s.Settings, "hot_standby=off")
	s.Start(t)
	_, err := Connect(context.Background(), s.DSN("127.0.0.1"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "57P03")
	assert.Contains(t, err.Error(), "accepts no connections now")
	assert.Contains(t, err.Error(), "(Hot standby mode is disabled)", "the server's detail")
	assert.Contains(t, err.Error(), "pg_isready")
	assert.NotContains(t, err.Error(), "check that the server runs")
}

// On a server with fsync=off (no commit durable, whatever pgstore does)
// the handoff warns first, in the working directory's next-steps.txt and
// in the database's; on one with fsync on it does not.
func TestHandoffWarnsOfAServerWithoutFsync(t *testing.T) {
	s := startServerWith(t, nil, nil, []string{"fsync=off"})
	for _, c := range []struct {
		dsn  string
		warn bool
	}{{withSchema(s.DSN("127.0.0.1"), "runstate"), true}, {withSchema(testDSN(t), newSchema(t)), false}} {
		db, err := Connect(context.Background(), c.dsn)
		require.NoError(t, err)
		dir := t.TempDir()
		r, err := db.Open(context.Background(), "r", dir, &runstate.Options{Request: "durable?"})
		require.NoError(t, err)
		require.NoError(t, r.Do(context.Background(), "a", func(context.Context, *runstate.Stage) error { return nil }))
		require.NoError(t, r.Close())
		local, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
		require.NoError(t, err)
		var stored string
		require.NoError(t, db.pool.QueryRow(context.Background(), db.sql(`SELECT handoff FROM {s}.projections`)).Scan(&stored))
		db.Close()
		for _, h := range []string{string(local), stored} {
			if c.warn {
				assert.Contains(t, h, "WARNING: the server runs with fsync=off")
			} else {
				assert.NotContains(t, h, "fsync=off")
			}
		}
	}
}

// fakeOldServer serves, on 127.0.0.1, the PostgreSQL protocol's startup
// (no password, server_version version) and answers every simple query
// with an empty result, until the test ends. It returns its address.
func fakeOldServer(t *testing.T, version string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				be := pgproto3.NewBackend(c, c)
				if _, err := be.ReceiveStartupMessage(); err != nil {
					return
				}
				be.Send(&pgproto3.AuthenticationOk{})
				be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: version})
				be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
				be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				if be.Flush() != nil {
					return
				}
				for {
					msg, err := be.Receive()
					if err != nil {
						return
					}
					switch msg.(type) {
					case *pgproto3.Query:
						be.Send(&pgproto3.EmptyQueryResponse{})
						be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
						if be.Flush() != nil {
							return
						}
					case *pgproto3.Terminate:
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A Connect that finds another program's migration of the schema under
// way waits for it only as long as its context allows: when the context
// ends first, Connect returns promptly, with an error that wraps the
// context's and says what it waited for and what to do. Once the other
// program lets the lock go, Connect migrates the schema.
func TestConnectWaitsForAMigrationAsLongAsItsContext(t *testing.T) {
	schema := newSchema(t)
	dsn := withSchema(testDSN(t), schema)
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, testDSN(t))
	require.NoError(t, err)
	defer holder.Close(ctx)
	key := hashKey("runstate/migrate/" + schema)
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)

	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Connect(cctx, dsn)
	took := time.Since(start)
	waitErr := err
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), schema)
	assert.Contains(t, err.Error(), "another program is migrating it")
	assert.Less(t, took, 5*time.Second, "Connect returned %v after its context ended", took)

	// The wait left nothing behind: no schema_version, and the lock is
	// the holder's alone (the waiter's session ended with its connection).
	assert.Eventually(t, func() bool {
		var waiters int
		require.NoError(t, holder.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND ((classid::bigint << 32) | objid::bigint) = $1`, key).Scan(&waiters))
		return waiters == 0
	}, 5*time.Second, 20*time.Millisecond, "a waiter for the migration lock outlived Connect")

	// The query the error gives finds the holder.
	q := waitErr.Error()[strings.Index(waitErr.Error(), "SELECT pid"):]
	var pid uint32
	require.NoError(t, holder.QueryRow(ctx, "SELECT pid FROM ("+q+") h").Scan(&pid))
	assert.Equal(t, holder.PgConn().PID(), pid)

	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
	require.NoError(t, err)
	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	var versions int
	require.NoError(t, db.pool.QueryRow(ctx, db.sql("SELECT count(*) FROM {s}.schema_version")).Scan(&versions))
	assert.Equal(t, SchemaVersion, versions)
}

// A pooled connection that the server ended (pg_terminate_backend here; a
// shutdown or restart ends them all) is named as such, not as a server
// that cannot be reached, where a call gives up on it (its context
// ended, or the server stayed away past lostAfter). The readers go on
// through it (retryConn since e5f2aa5; TestReadersGoOnThroughAServerRestart):
// Has on it succeeds.
func TestAConnectionTheServerEndedSaysSo(t *testing.T) {
	ctx := context.Background()
	dsn := testDSN(t)
	app := "ended-" + newSchema(t)
	db, err := Connect(ctx, withSchema(dsn, newSchema(t))+"&application_name="+app)
	require.NoError(t, err)
	defer db.Close()
	admin := adminConn(t, dsn)
	end := func() {
		t.Helper()
		var n int
		require.NoError(t, admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n))
		require.NotZero(t, n)
	}
	// pgxpool pings a connection idle for more than a second before it
	// hands it out, and replaces it if the server ended it: the statement
	// then runs on a new connection and succeeds. On a loaded machine the
	// gap can pass a second; then try again (the point is a statement on
	// the connection the server ended).
	for try := 0; ; try++ {
		start := time.Now() // before the pooled connection's idle time starts
		_, err = db.Has(ctx, "r")
		require.NoError(t, err)
		end()
		_, err = db.pool.Exec(ctx, "SELECT 1") // no retry: pgx's own error
		if idle := time.Since(start); err == nil && idle > time.Second && try < 4 {
			t.Logf("try %d: the connection was idle up to %v, so the pool pinged and replaced it: again", try, idle)
			continue
		}
		break
	}
	require.Error(t, err)
	err = db.rightsError("read run r", err)
	require.Contains(t, err.Error(), "57P01")
	assert.Contains(t, err.Error(), "ended the connection")
	assert.Contains(t, err.Error(), "retry when the server answers")
	assert.NotContains(t, err.Error(), "check that the server runs")

	// A reader goes on through an ended connection.
	_, err = db.Has(ctx, "r")
	require.NoError(t, err)
	end()
	_, err = db.Has(ctx, "r")
	assert.NoError(t, err, "Has goes on through a connection the server ended")
}

// A user that lacks a right to read runs, through ConnectReadOnly (the
// runstate command's read commands), is told the grants that reading
// needs, no more (no CREATE on the schema, no INSERT): and they are
// enough.
func TestReadOnlyUserLackingRightsIsToldWhatReadingNeeds(t *testing.T) {
	base := testDSN(t)
	dsn := withSchema(base, newSchema(t))
	db, err := Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	r, err := db.Open(context.Background(), "r", t.TempDir(), &runstate.Options{Request: "read me"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	admin := adminConn(t, base)
	rdsn := roleDSN(t, admin, dsn, db.schema+"_reader", "")
	read := func() error {
		rdb, err := ConnectReadOnly(context.Background(), rdsn)
		if err != nil {
			return err
		}
		defer rdb.Close()
		_, err = rdb.Inspect(context.Background(), "r")
		return err
	}
	err = read()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lacks the right to read runs")
	m := regexp.MustCompile(`run, as the database owner, (GRANT .*?) \(`).FindStringSubmatch(err.Error())
	require.NotNil(t, m, err.Error())
	assert.NotContains(t, m[1], "CREATE")
	assert.NotContains(t, m[1], "INSERT")
	for _, g := range strings.Split(m[1], "; ") {
		_, err = admin.Exec(context.Background(), g)
		require.NoError(t, err, g)
	}
	assert.NoError(t, read(), "the grants advised are enough to read runs")
}
