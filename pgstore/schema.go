package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/runstate/runstate"
)

// migrations are the schema's versions, NNNN_name.sql, applied in order.
//
//go:embed migrations/*.sql
var migrations embed.FS

// SchemaVersion is the newest schema version this package knows (the
// number of embedded migrations); read it, never set it.
var SchemaVersion = len(must(fs.Glob(migrations, "migrations/*.sql")))

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// migrate creates the schema when it is missing and applies the
// migrations it lacks, in one transaction, under an advisory lock that
// serializes racing processes. A user who may only use an existing,
// current schema needs no CREATE right: nothing is created then.
func (db *DB) migrate(ctx context.Context) error { return db.migrateTo(ctx, SchemaVersion) }

// migrateTo is migrate up to version want (tests make older schemas).
func (db *DB) migrateTo(ctx context.Context, want int) error {
	have, err := db.version(ctx, db.pool)
	if err == nil && have >= want {
		return nil // the common case: no lock, no write
	}
	if err != nil && !errors.Is(err, errNoSchema) {
		return err
	}
	// A session-level lock, taken before the transaction: a backend
	// refreshes its catalog caches when a transaction starts, so one that
	// waited for the lock inside its transaction would not see the tables
	// the lock's holder just created.
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return db.connectError(err)
	}
	defer conn.Release()
	key := hashKey("runstate/migrate/" + db.schema)
	// The wait for a concurrent migration is the caller's context's to
	// bound, not the server's lock_timeout or statement_timeout: lifted
	// for this connection's session, which is closed after (the lock ends
	// with it too), so that the pool never hands out a connection whose
	// timeouts were lifted.
	defer conn.Conn().PgConn().Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, noTimeoutsSessionSQL); err != nil {
		return db.connectError(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		if ctx.Err() != nil {
			// The wait is for another program's migration (or Connect)
			// holding the lock: this one's context ended first.
			return fmt.Errorf("pgstore: schema %s in %s: another program is migrating it (it holds the advisory lock %d), and this Connect's context ended before it finished: %w; connect again, or find the holder: SELECT pid, application_name, state, query FROM pg_stat_activity JOIN pg_locks USING (pid) WHERE locktype = 'advisory' AND granted AND ((classid::bigint << 32) | objid::bigint) = %d",
				db.schema, db.where, key, err, key)
		}
		return fmt.Errorf("pgstore: lock the schema %s for its migration: %w", db.schema, err)
	}
	tx, err := conn.BeginTx(ctx, readCommitted)
	if err != nil {
		return db.connectError(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	have, err = db.version(ctx, tx)
	if errors.Is(err, errNoSchema) {
		err = db.create(ctx, tx)
	}
	if err != nil {
		return err
	}
	names := must(fs.Glob(migrations, "migrations/*.sql"))
	slices.Sort(names)
	for i, name := range names[min(have, want):want] {
		v := have + i + 1
		data := must(migrations.ReadFile(name))
		if _, err := tx.Exec(ctx, db.sql(string(data))); err != nil {
			return db.rightsError(fmt.Sprintf("apply %s to schema %s", name, db.schema), err)
		}
		if _, err := tx.Exec(ctx, db.sql("INSERT INTO {s}.schema_version (version) VALUES ($1)"), v); err != nil {
			return db.rightsError("record schema version "+strconv.Itoa(v), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return db.rightsError("commit the schema "+db.schema, err)
	}
	return nil
}

var errNoSchema = errors.New("pgstore: no schema")

// checkVersion is migrate for a reader: it only checks.
func (db *DB) checkVersion(ctx context.Context) error {
	v, err := db.version(ctx, db.pool)
	switch {
	case errors.Is(err, errNoSchema):
		return fmt.Errorf("%w: no runstate schema %s in %s (or its schema_version table is missing): check schema=NAME in the DSN; a program that writes runs creates it",
			ErrNoRun, db.schema, db.where)
	case err != nil:
		return err
	case v < SchemaVersion:
		return fmt.Errorf("%w: schema %s in %s is at version %d, older than the %d this pgstore reads: connect once with a writer (pgstore.Connect) to upgrade it",
			runstate.ErrVersion, db.schema, db.where, v, SchemaVersion)
	}
	return nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// version reads the schema's version: errNoSchema when the schema or its
// schema_version table is missing; ErrVersion when a newer pgstore wrote it,
// and when the schema holds pgstore's tables without a version (migrating
// it again would fail on the first CREATE TABLE, or worse).
func (db *DB) version(ctx context.Context, q querier) (int, error) {
	var exists, tables bool
	if err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL",
		db.ident+".schema_version", db.ident+".runs").Scan(&exists, &tables); err != nil {
		return 0, db.rightsError("read the schema "+db.schema, err)
	}
	v := 0
	if exists {
		if err := q.QueryRow(ctx, db.sql("SELECT coalesce(max(version), 0) FROM {s}.schema_version")).Scan(&v); err != nil {
			return 0, db.rightsError("read the version of schema "+db.schema, err)
		}
	}
	if v == 0 && tables {
		return 0, fmt.Errorf("%w: schema %s in %s holds pgstore's tables (%s.runs) but no schema version (%s.schema_version is missing or empty: dropped or emptied by hand, or restored in part), so pgstore cannot tell which of its %d migrations the tables have; restore %s.schema_version from the backup the tables came from (a row per applied migration, version 1 up), or use another schema (schema=NAME in the DSN)",
			runstate.ErrVersion, db.schema, db.where, db.schema, db.schema, SchemaVersion, db.schema)
	}
	if !exists {
		return 0, errNoSchema
	}
	if v > SchemaVersion {
		return v, fmt.Errorf("%w: schema %s in %s is at version %d, newer than the %d this pgstore knows: upgrade the program (github.com/runstate/runstate/pgstore), or use another schema (schema=NAME in the DSN)",
			runstate.ErrVersion, db.schema, db.where, v, SchemaVersion)
	}
	return v, nil
}

// create makes the schema (when missing) and its schema_version table.
func (db *DB) create(ctx context.Context, tx pgx.Tx) error {
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", db.schema).Scan(&exists); err != nil {
		return db.rightsError("look up schema "+db.schema, err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+db.ident); err != nil {
			return db.rightsError("create schema "+db.schema, err)
		}
	}
	_, err := tx.Exec(ctx, db.sql(`CREATE TABLE {s}.schema_version (version int PRIMARY KEY, applied timestamptz NOT NULL DEFAULT now())`))
	if err != nil {
		return db.rightsError("create "+db.schema+".schema_version", err)
	}
	return nil
}

// rightsError says which GRANT a user lacking a right needs, and what to
// do where the server takes no writes from the connection (read-only).
func (db *DB) rightsError(what string, err error) error {
	if cerr := db.closedError(); cerr != nil {
		return cerr
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "25006" { // read_only_sql_transaction
		return fmt.Errorf("pgstore: cannot %s in %s: %w; the server takes no writes from this connection (a hot standby, or default_transaction_read_only on for this user, database or DSN): connect to the primary, or use pgstore.ConnectReadOnly to only read runs",
			what, db.where, err)
	}
	if !errors.As(err, &pe) || pe.Code != "42501" { // insufficient_privilege
		if isConnError(err) {
			return db.connectError(err)
		}
		return fmt.Errorf("pgstore: %s in %s: %w", what, db.where, err)
	}
	user := db.lockCfg.User
	database := db.lockCfg.Database
	u := pgx.Identifier{user}.Sanitize()
	var grant string
	switch {
	case db.readOnly && readsOnly(what):
		// A program that only reads (the runstate command's read
		// commands) needs no more; the schema is there.
		return fmt.Errorf("pgstore: cannot %s in %s: %w; user %q lacks the right to read runs: run, as the database owner, GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT ON ALL TABLES IN SCHEMA %s TO %s (a user whose programs open runs needs INSERT, UPDATE, DELETE too)",
			what, db.where, err, user, db.ident, u, db.ident, u)
	case strings.Contains(pe.Message, "for database"):
		grant = fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s", pgx.Identifier{database}.Sanitize(), u)
	case strings.Contains(pe.Message, "for schema"):
		grant = fmt.Sprintf("GRANT USAGE, CREATE ON SCHEMA %s TO %s", db.ident, u)
	default:
		grant = fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO %s",
			db.ident, u, db.ident, u)
	}
	return fmt.Errorf("pgstore: cannot %s in %s: %w; user %q lacks the right: run, as the database owner, %s (or let an owner run the program once to create the schema)",
		what, db.where, err, user, grant)
}

// retryConn calls fn, and again while it fails for want of a connection
// (isConnError: a server restart ends every pooled connection, whose next
// use fails, and refuses new ones until it is up) for as long as a session
// may take its lock back (lostAfter), pausing 50 ms, then longer up to 1 s:
// a restart does not fail a read under way, as it does not fail a batch
// (store.Lock). fn must be safe to call again after a failure: a read, or
// an idempotent write. The error is fn's last, or ctx's.
func retryConn(ctx context.Context, fn func() error) error {
	var down time.Time
	wait := 50 * time.Millisecond
	for {
		err := fn()
		if err == nil || !isConnError(err) || ctx.Err() != nil {
			return err
		}
		if down.IsZero() {
			down = time.Now()
		}
		if time.Since(down) >= lostAfter {
			return err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return err
		}
		wait = min(2*wait, time.Second)
	}
}

// readsOnly reports whether the operation rightsError names, what, only
// reads.
func readsOnly(what string) bool {
	for _, p := range []string{"read ", "list ", "look up ", "verify "} {
		if strings.HasPrefix(what, p) {
			return true
		}
	}
	return false
}

// isConnError reports whether err is a connection failure rather than a
// statement's error.
func isConnError(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")
	}
	return pgconn.SafeToRetry(err) || errors.As(err, new(*pgconn.ConnectError)) || pgconn.Timeout(err) || errors.As(err, new(net.Error)) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}
