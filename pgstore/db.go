package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/runstate/runstate/pgstore/internal/dsnparam"
)

// DefaultSchema is the schema a DSN without schema=NAME uses.
const DefaultSchema = "runstate"

// DB is a connection pool to one PostgreSQL database and the pgstore schema
// in it. Its methods are safe for concurrent use by multiple goroutines, and
// any number of processes on any number of machines may use one database at
// once.
type DB struct {
	pool   *pgxpool.Pool
	schema string // as given (schema=NAME)
	ident  string // the schema, quoted for SQL
	where  string // host:port/database as user, for messages
	// lockCfg is the configuration of the session lock connections
	// (session.go): the pool's, with keepalives and tcp_user_timeout.
	lockCfg *pgx.ConnConfig
	// addrParams: how the DSN (else the environment) says to connect,
	// for Address (addressParams); in addressKeys' order.
	addrParams [][2]string
	closed     atomic.Bool // Close was called: errors say so (closedError)
	stmts      sync.Map    // statement templates → with the schema (sql)
	// lz4: the server compresses with lz4 (PostgreSQL 14 or later, built
	// with it): a manifest is stored with it (queuePublish).
	lz4 bool
	// fsyncOff: the server runs with fsync=off, so that no commit is
	// durable; the handoff says so (LookAt).
	fsyncOff bool
	// spare: a lock connection made with the pool's first (checkSessions),
	// for the first session to open (takeSpare); closed unused after
	// spareFor, or by Close.
	spareMu sync.Mutex
	spare   *spareConn
	// readOnly: made by ConnectReadOnly, for programs that read runs; a
	// right it lacks for a read is advised as a reader's (rightsError).
	readOnly bool
}

// spareConn is a lock connection not yet a session's. note is the
// session's handler of its notifications once it takes the connection
// (the handler of a connection is fixed when it connects).
type spareConn struct {
	conn *pgx.Conn
	note atomic.Pointer[func(*pgconn.Notification)]
	// named: it started as "runstate spare" (the DSN names no
	// application), and is renamed "runstate session" when taken.
	named bool
	// expiry closes it unused (keepSpare); takeSpare stops it.
	expiry *time.Timer
}

// spareFor is how long an unused spare lock connection is kept: a
// program that opens a run right after Connect (the runstate command)
// finds it made; one that opens later makes its own.
var spareFor = 30 * time.Second

// serverSQL reads what Connect notes of the server: fsync off, lz4.
const serverSQL = `SELECT current_setting('fsync') = 'off', EXISTS (SELECT FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals))`

// Connect opens a pool to the database dsn names (a postgres:// URL or a
// key=value string, as pgx reads it) and creates or upgrades the pgstore
// schema in it. The DSN may carry schema=NAME (default "runstate"); Connect
// removes it before pgx sees it. Nothing is written but the schema: when
// Connect returns, the schema is committed (durably). Connect is safe for
// concurrent use: processes that race to create the schema wait for one
// another (the migrations run under a transaction-level advisory lock).
//
// Connect fails with an error naming the server and what to check when the
// database cannot be reached, with runstate.ErrVersion when the schema was
// made by a newer pgstore or holds pgstore's tables without their
// schema_version rows (emptied or dropped by hand: nothing is migrated
// then), for a user who may not create the schema, with the GRANT to
// run, through a pooler that shares server sessions among clients
// (pgbouncer pool_mode=transaction: see the package doc, Poolers), with
// what to do, for a server older than PostgreSQL 12, naming its
// version, and for a URL DSN whose user or password holds an '@', '/',
// '?' or '#' that is not percent-encoded (where the password ends is then
// a guess), saying how to encode it. No error shows the DSN's password.
//
// Connect starts two server connections at once: the pool's first, and a
// session's lock connection, kept for the first Open (or Store's session)
// that comes within 30 seconds and closed unused after that (its
// application_name is "runstate spare" meanwhile, unless the DSN names
// one). A program that connects and opens a run, as the runstate command
// does for each call, waits for one connection's start instead of two.
func Connect(ctx context.Context, dsn string) (*DB, error) { return connect(ctx, dsn, true) }

// ConnectReadOnly is Connect for programs that only read runs (a status
// command): it never creates or upgrades the schema, and fails with an
// error naming the schema when it is missing or at another version. Its
// connections are Connect's, the spare lock connection too: a session may
// be opened through it on a schema that is there (the runstate command's
// pipeline commands do). Safe for concurrent use.
func ConnectReadOnly(ctx context.Context, dsn string) (*DB, error) { return connect(ctx, dsn, false) }

func connect(ctx context.Context, dsn string, write bool) (*DB, error) {
	if err := checkUserinfo(dsn); err != nil {
		return nil, err
	}
	dsn, schema, err := splitSchema(dsn)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, parseError(err)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["run"]; ok {
		// pgx would send it to the server as a setting: "unrecognized
		// configuration parameter".
		return nil, errors.New("pgstore: the DSN has a run parameter: run= names a run for the runstate command; Connect takes the DSN without it: pass the run name to Open")
	}
	if s, ok := cfg.ConnConfig.RuntimeParams["schema"]; ok { // key=value form
		delete(cfg.ConnConfig.RuntimeParams, "schema")
		if schema == "" {
			schema = s
		}
	}
	if schema == "" {
		schema = DefaultSchema
	}
	if err := checkSchemaName(schema); err != nil {
		return nil, err
	}
	db := &DB{schema: schema, ident: pgx.Identifier{schema}.Sanitize(), where: describe(cfg.ConnConfig), addrParams: addressParams(dsn), readOnly: !write}
	// Every connection notices a server it can no longer reach within
	// about userTimeout, instead of the kernel's minutes: keepalives
	// when idle, TCP_USER_TIMEOUT (Linux) while data waits for an ACK;
	// and a connect gives up after userTimeout.
	d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: time.Second, Count: 5},
		Control: userTimeoutControl}
	cfg.ConnConfig.DialFunc = d.DialContext
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = userTimeout
	}
	db.lockCfg = lockConfig(cfg.ConnConfig)
	if cfg.MaxConns < 8 {
		cfg.MaxConns = 8
	}
	db.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, db.connectError(err)
	}
	if err := db.checkSessions(ctx); err != nil {
		db.pool.Close()
		return nil, err
	}
	if write {
		err = db.migrate(ctx)
	} else {
		err = db.checkVersion(ctx)
	}
	if err == nil {
		if err = db.pool.QueryRow(ctx, serverSQL).Scan(&db.fsyncOff, &db.lz4); err != nil {
			err = db.connectError(err)
		}
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// Close closes the pool. Runs opened through db must be closed first.
// Close is idempotent and safe for concurrent use. Afterwards every call
// that needs the database fails with an error that says db was closed.
func (db *DB) Close() {
	db.closed.Store(true)
	if sp := db.takeSpare(); sp != nil {
		closeGently(sp.conn)
	}
	db.pool.Close()
}

// takeSpare returns the spare lock connection, once (nil: none, or
// taken, or closed unused).
func (db *DB) takeSpare() *spareConn {
	db.spareMu.Lock()
	defer db.spareMu.Unlock()
	sp := db.spare
	db.spare = nil
	if sp != nil {
		sp.expiry.Stop()
	}
	return sp
}

// keepSpare keeps sp for the first session to open, for spareFor.
func (db *DB) keepSpare(sp *spareConn) {
	db.spareMu.Lock()
	defer db.spareMu.Unlock()
	db.spare = sp
	sp.expiry = time.AfterFunc(spareFor, func() {
		db.spareMu.Lock()
		unused := db.spare == sp
		if unused {
			db.spare = nil
		}
		db.spareMu.Unlock()
		if unused {
			closeGently(sp.conn)
		}
	})
}

// dialSpare makes a lock connection whose notifications go to the
// handler of whoever takes it.
func (db *DB) dialSpare(ctx context.Context) (*spareConn, error) {
	sp := &spareConn{}
	cfg := db.lockCfg.Copy()
	if cfg.RuntimeParams["application_name"] == sessionApp {
		cfg.RuntimeParams["application_name"] = "runstate spare"
		sp.named = true
	}
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if f := sp.note.Load(); f != nil {
			(*f)(n)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	sp.conn = conn
	return sp, nil
}

// closeGently ends conn with the protocol's goodbye, without waiting
// long for a server that does not answer.
func closeGently(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// closedError is the error of a call that needed the pool after Close
// (pgx says only "closed pool"); nil while db is open.
func (db *DB) closedError() error {
	if !db.closed.Load() {
		return nil
	}
	return fmt.Errorf("pgstore: the DB for %s was closed (DB.Close) before this call: close it only after its last use (and after the Runs opened through it), or Connect again", db.where)
}

// Schema is the name of the schema db uses. Safe for concurrent use.
func (db *DB) Schema() string { return db.schema }

// splitSchema removes the schema parameter from a URL DSN. A key=value DSN
// keeps it: pgx reads it into RuntimeParams, and Connect takes it there.
func splitSchema(dsn string) (rest, schema string, err error) {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn, "", nil
	}
	base, query, ok := strings.Cut(dsn, "?")
	if !ok {
		return dsn, "", nil
	}
	rest, schema, _, err = dsnparam.Cut(query, "schema")
	switch {
	case errors.Is(err, dsnparam.ErrTwice):
		return "", "", errors.New("pgstore: the DSN names two schemas: give schema=NAME once")
	case err != nil:
		return "", "", fmt.Errorf("pgstore: the DSN's schema parameter: %w", err)
	case rest == "":
		return base, schema, nil
	}
	return base + "?" + rest, schema, nil
}

// checkUserinfo refuses a URL DSN whose user or password holds an '@',
// '/', '?' or '#' that is not percent-encoded: where the userinfo ends is
// then a guess, and pgx guessed otherwise than the user meant (part of the
// password became the host, the port or the database, and so reached the
// messages that name them). An '@' after the host (in the path, the
// fragment or a parameter's name) is such a character, as is a second '@'
// before it. The error shows no part of the DSN.
func checkUserinfo(dsn string) error {
	rest, ok := strings.CutPrefix(dsn, "postgres://")
	if !ok {
		rest, ok = strings.CutPrefix(dsn, "postgresql://")
	}
	if !ok || !strings.Contains(rest, "@") {
		return nil
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	ambiguous := strings.Count(rest[:end], "@") > 1
	rest, fragment, _ := strings.Cut(rest[end:], "#")
	path, query, _ := strings.Cut(rest, "?")
	ambiguous = ambiguous || strings.Contains(fragment, "@") || strings.Contains(path, "@")
	for _, kv := range strings.Split(query, "&") {
		k, _, _ := strings.Cut(kv, "=")
		ambiguous = ambiguous || strings.ContainsAny(k, "@/")
	}
	if !ambiguous {
		return nil
	}
	return errors.New(`pgstore: the DSN is ambiguous (not shown: it may hold a password): an '@', '/', '?' or '#' in its user or password must be percent-encoded: '@' as %40, '/' as %2F, '?' as %3F, '#' as %23 (an '@' in the database name too); or leave the password out of the DSN and set PGPASSWORD or ~/.pgpass`)
}

// parseError is Connect's error for a DSN that pgx cannot parse: pgx's
// reason without pgx's copy of the DSN, whose password it masks only as
// far as it can tell where the password ends (a key=value DSN's
// "password=se\ cret" kept "cret").
func parseError(err error) error {
	reason := "pgx cannot read it"
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		// "cannot parse `DSN`: reason": pgx's reasons hold no backquote.
		msg := pe.Error()
		if i := strings.LastIndex(msg, "`: "); i >= 0 {
			reason = msg[i+len("`: "):]
		}
	}
	return fmt.Errorf("pgstore: cannot parse the DSN (not shown: it may hold a password): %s; expected postgres://USER@HOST:PORT/DATABASE?schema=NAME or key=value pairs (host=H port=P dbname=D user=U)", reason)
}

// addressKeys are the DSN's settings that Address keeps, besides the
// hosts, database, user and schema: how to connect (TLS, and which host
// of a list), never a secret (sslpassword, password). Each with the
// environment variable pgx reads when the DSN does not set it, and
// whether it is a file's path.
var addressKeys = []struct {
	key, env string
	path     bool
}{
	{"sslmode", "PGSSLMODE", false},
	{"sslrootcert", "PGSSLROOTCERT", true},
	{"sslcert", "PGSSLCERT", true},
	{"sslkey", "PGSSLKEY", true},
	{"sslsni", "PGSSLSNI", false},
	{"target_session_attrs", "PGTARGETSESSIONATTRS", false},
}

// addressParams is what of dsn Address keeps (addressKeys): each set by
// the DSN, else by its environment variable, a relative path made
// absolute (a command run elsewhere reads the same file).
func addressParams(dsn string) [][2]string {
	var params [][2]string
	for _, k := range addressKeys {
		v := dsnSetting(dsn, k.key)
		if v == "" {
			v = os.Getenv(k.env) // pgx's default too
		}
		if v == "" {
			continue
		}
		if k.path && !filepath.IsAbs(v) && v != "system" {
			if abs, err := filepath.Abs(v); err == nil {
				v = abs
			}
		}
		params = append(params, [2]string{k.key, v})
	}
	return params
}

// dsnSetting is the value the DSN gives key: a URL's query parameter, or
// a key=value DSN's value (unquoted, its backslash escapes undone, as
// libpq reads it); "" when it gives none or cannot be read.
func dsnSetting(dsn, key string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return ""
		}
		return u.Query().Get(key)
	}
	value := ""
	for s := dsn; ; {
		s = strings.TrimLeft(s, " \t\n\r\f\v")
		k, rest, ok := strings.Cut(s, "=")
		if !ok {
			return value
		}
		k = strings.TrimSpace(k)
		s = strings.TrimLeft(rest, " \t\n\r\f\v")
		var v strings.Builder
		quoted := strings.HasPrefix(s, "'")
		if quoted {
			s = s[1:]
		}
		i := 0
		for ; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				v.WriteByte(s[i])
				continue
			}
			if quoted && c == '\'' {
				i++
				break
			}
			if !quoted && strings.IndexByte(" \t\n\r\f\v", c) >= 0 {
				break
			}
			v.WriteByte(c)
		}
		s = s[i:]
		if k == key {
			value = v.String() // the last one counts, as in libpq
		}
	}
}

// checkSchemaName refuses names PostgreSQL would truncate, refuse
// (reserved) or that are empty.
func checkSchemaName(s string) error {
	if s == "" || len(s) > 63 || strings.ContainsRune(s, 0) {
		return fmt.Errorf("pgstore: schema name %q: use 1 to 63 bytes", s)
	}
	if strings.HasPrefix(s, "pg_") {
		return fmt.Errorf("pgstore: schema name %q: PostgreSQL reserves names that begin with pg_ for its system schemas: choose another (schema=NAME in the DSN)", s)
	}
	return nil
}

// describe names where a configuration connects, for messages.
func describe(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s (database %q, user %q)", net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))), c.Database, c.User)
}

// connectError says what to check when the database cannot be reached.
func (db *DB) connectError(err error) error {
	if cerr := db.closedError(); cerr != nil {
		return cerr
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "28P01", "28000":
			return fmt.Errorf("pgstore: cannot connect to %s: %w; check the user and password in the DSN (or PGPASSWORD, ~/.pgpass) and pg_hba.conf", db.where, err)
		case "3D000":
			return fmt.Errorf("pgstore: cannot connect to %s: %w; create the database (createdb) or name another in the DSN", db.where, err)
		case "57P03":
			detail := ""
			if pe.Detail != "" {
				detail = " (" + strings.TrimSuffix(pe.Detail, ".") + ")"
			}
			return fmt.Errorf("pgstore: cannot connect to %s: %w%s; the server runs but accepts no connections now: it is starting up, shutting down, or a standby in recovery (with hot_standby off): retry when pg_isready says it accepts connections, or connect to the primary", db.where, err, detail)
		case "08P01":
			if p, ok := strings.CutPrefix(pe.Message, "unsupported startup parameter: "); ok {
				return fmt.Errorf("pgstore: cannot connect to %s: %w; a pooler between pgstore and the server (pgbouncer?) refuses the startup parameter %s, which a session's lock connection sets (tcp_keepalives_idle, _interval, _count and tcp_user_timeout: how the server notices a vanished machine within about 10 s): connect directly, or let the pooler ignore them (pgbouncer: ignore_startup_parameters = %s) and set its own keepalives and tcp_user_timeout toward the clients, as the session's liveness is then the pooler's", db.where, err, p, ignoredParams)
			}
		case "57P01", "57P02": // a connection the server ended: no connect failed
			return fmt.Errorf("pgstore: the server at %s ended the connection: %w; it is shutting down or restarting, or this backend was ended (pg_terminate_backend, a failover): retry when the server answers (pg_isready)", db.where, err)
		case "57014": // a statement of the connection's setup ran past statement_timeout: the server answers
			return fmt.Errorf("pgstore: %s: %w", db.where, err)
		case "53300":
			return fmt.Errorf("pgstore: cannot connect to %s: %w; the server has no connection slot left for this user (max_connections, or the role's or database's CONNECTION LIMIT): each open Run holds a lock connection of its own besides the pool's (up to pool_max_conns in the DSN, at least 8): raise the limit, or lower pool_max_conns, or close idle programs", db.where, err)
		}
	}
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		// Connected, then a statement waited past the context: a lock,
		// as a rule (a LOCK TABLE, a VACUUM FULL, a schema upgrade), not
		// a server that cannot be reached.
		return fmt.Errorf("pgstore: %s: %w: a statement waited until the context ended (its deadline: Options.LockTimeout while a Run opens, the runstate command's -timeout): a lock that another transaction holds, as a rule (SELECT pid, pg_blocking_pids(pid), query FROM pg_stat_activity WHERE wait_event_type = 'Lock' shows who waits for whom), or a server too busy to answer", db.where, lockTimeout(err))
	}
	return fmt.Errorf("pgstore: cannot connect to %s: %w; check that the server runs and accepts connections there (host, port and sslmode in the DSN, listen_addresses, pg_hba.conf)", db.where, err)
}

// minServer is the oldest PostgreSQL major version pgstore runs on: its
// schema has a generated column (12), and its batches set plan_cache_mode
// (12).
const minServer = 12

// checkServerVersion refuses a server older than minServer, whose
// server_version (as the server reports it at startup: "15.18 (Debian
// 15.18-0+deb12u1)", "9.6.24") is version; where names the server. A
// version it cannot read (a pooler or a fork that reports something else)
// is let through: the schema's migration then says what fails.
func checkServerVersion(where, version string) error {
	end := strings.IndexFunc(version, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(version)
	}
	major, err := strconv.Atoi(version[:end])
	if err != nil || major >= minServer {
		return nil
	}
	return fmt.Errorf("pgstore: %s runs PostgreSQL %s; pgstore needs PostgreSQL %d or later (generated columns, plan_cache_mode): upgrade the server, or keep runs in directories (runstate.Open)",
		where, version, minServer)
}

// checkSessions makes sure that each of the pool's connections is a
// server session of its own: a pooler in transaction or statement mode
// (pgbouncer pool_mode=transaction) hands one server session to client
// after client, where pgstore's session locks (session.go) and pgx's
// prepared statements would go to whoever runs next. Two connections at
// once: a setting made on one for its session must not be seen on the
// other. A pooler that hands the last server session used to the next
// client (pgbouncer's default, server_round_robin=0) shows it every time.
// The simple protocol, so that the check itself prepares nothing. It
// checks the server's version first (checkServerVersion). The two
// connections are made at once: the pool's first, and a lock connection
// kept for the first session to open (keepSpare). A server connection
// takes 16-25 ms to start on the development machine, most of Connect,
// and a command that opens a run would otherwise make its lock
// connection after them.
func (db *DB) checkSessions(ctx context.Context) error {
	type dialed struct {
		sp  *spareConn
		err error
	}
	second := make(chan dialed, 1)
	go func() {
		sp, err := db.dialSpare(ctx)
		second <- dialed{sp, err}
	}()
	a, err := db.pool.Acquire(ctx)
	d := <-second
	if a != nil {
		defer a.Release()
	}
	kept := false
	if d.sp != nil {
		defer func() {
			if !kept {
				closeGently(d.sp.conn)
			}
		}()
	}
	if err != nil {
		return db.connectError(err)
	}
	if err := checkServerVersion(db.where, a.Conn().PgConn().ParameterStatus("server_version")); err != nil {
		return err
	}
	var b *pgx.Conn
	if d.err == nil {
		b = d.sp.conn
	} else {
		// A pooler that refuses the lock connection's parameters (Open
		// says which) still lets the pool's connections through: the
		// check takes another of those, and no session finds a spare.
		pb, err := db.pool.Acquire(ctx)
		if err != nil {
			return db.connectError(err)
		}
		defer pb.Release()
		b = pb.Conn()
	}
	token := strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := a.Exec(ctx, "SELECT set_config('runstate.session_probe', $1, false)", pgx.QueryExecModeSimpleProtocol, token); err != nil {
		return db.connectError(err)
	}
	var seen *string
	err = b.QueryRow(ctx, "SELECT current_setting('runstate.session_probe', true)", pgx.QueryExecModeSimpleProtocol).Scan(&seen)
	_, _ = a.Exec(ctx, "RESET runstate.session_probe", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return db.connectError(err)
	}
	if seen != nil && *seen == token {
		return fmt.Errorf("pgstore: %s: two of its connections reached one server session (a setting made on one was seen on the other): something between pgstore and the server shares server sessions among clients, such as pgbouncer with pool_mode=transaction or statement; pgstore needs a server session per connection (for its session locks and prepared statements): connect directly, or through a pooler in session mode (pgbouncer pool_mode=session)", db.where)
	}
	if d.sp != nil {
		kept = true
		db.keepSpare(d.sp)
	}
	return nil
}

// lockConfig is cfg for a session's lock connection: the server drops the
// connection, and so the session's advisory lock, within about 10 s of the
// client's machine vanishing. Keepalives alone do not fire while an ACK is
// pending (measured: a lock not freed in 15 s, 3 tries of 3, after a link
// cut; the kernel's default is about 15 minutes); tcp_user_timeout does
// (5.2 s for 5000 ms).
func lockConfig(cfg *pgx.ConnConfig) *pgx.ConnConfig {
	c := cfg.Copy()
	for k, v := range map[string]string{
		"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "1", "tcp_keepalives_count": "5",
		"tcp_user_timeout": strconv.Itoa(int(userTimeout / time.Millisecond)),
		"application_name": sessionApp,
	} {
		if _, set := c.RuntimeParams[k]; !set {
			c.RuntimeParams[k] = v
		}
	}
	return c
}

// ignoredParams are the startup parameters a pooler must ignore to pass a
// lock connection (lockConfig), as pgbouncer's ignore_startup_parameters.
const ignoredParams = "tcp_keepalives_idle,tcp_keepalives_interval,tcp_keepalives_count,tcp_user_timeout"

// sessionApp is a lock connection's application_name, unless the DSN
// names one.
const sessionApp = "runstate session"

// userTimeout is the server's tcp_user_timeout on a lock connection: how
// long an unacknowledged send may wait before the server drops the
// connection (and so the session's lock).
const userTimeout = 10 * time.Second

// lockKey is the advisory lock key of a session: the first 8 bytes of
// sha256("runstate/session/"+id), as an int64.
func lockKey(session string) int64 {
	return hashKey("runstate/session/" + session)
}

// runKey and wantKey are the advisory lock keys of a run's lock and want
// lock (session.go, ahead.go).
func runKey(runID string) int64  { return hashKey("runstate/run/" + runID) }
func wantKey(runID string) int64 { return hashKey("runstate/want/" + runID) }

// pipeKey is the advisory lock key a session's pipeline connection holds
// for its life (ahead.go): while it is held the session is alive, as while
// its own lock (lockKey) is.
func pipeKey(session string) int64 { return hashKey("runstate/pipe/" + session) }

func hashKey(s string) int64 {
	h := sha256.Sum256([]byte(s))
	return int64(binary.BigEndian.Uint64(h[:8]))
}

// sql replaces {s} in q with the quoted schema. Every q is one of the
// package's constant statements, so the results are kept (stmts): a
// checkpoint's statements are 0.5-1.5 KB, and replacing in them on every
// call cost 13 µs of CPU a checkpoint (pgcompare -cpuprofile). Safe for
// concurrent use.
func (db *DB) sql(q string) string {
	if s, ok := db.stmts.Load(q); ok {
		return s.(string)
	}
	s := strings.ReplaceAll(q, "{s}", db.ident)
	db.stmts.Store(q, s)
	return s
}

// Every transaction of pgstore that writes, or locks a row and then reads
// (Lock's, a re-run's, a session's re-hold, the commit check, the
// migration, a blob's) runs at READ COMMITTED, whatever
// default_transaction_isolation the server, database, role or DSN sets:
// each statement after a row lock then sees what the lock waited for (the
// tail the holder appended, the schema version a concurrent migration
// wrote). At REPEATABLE READ or SERIALIZABLE a second session on one run
// failed its Locks with "could not serialize access due to concurrent
// update" (40001). An optimistic batch's implicit transaction takes the
// default; a serialization failure there is a lost bet (lostBet).
const beginSQL = "BEGIN ISOLATION LEVEL READ COMMITTED"

var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// noTimeoutsSQL lifts the server's lock_timeout and statement_timeout
// (the user's, database's or DSN's) for the rest of a transaction that
// waits for a row lock (the head row, a blob's index entry): how long a
// call waits is its context's to bound (Options.LockTimeout), as with a
// run directory's flock. Before, a Do whose Lock waited longer than a
// server's lock_timeout failed with the server's bare "canceling
// statement due to lock timeout". It lifts
// idle_in_transaction_session_timeout too: a locked batch's transaction
// is idle while the Run decides (a GC pause, an Alive probe, a loaded
// machine), and the server would end the session (25P03) and the batch.
const noTimeoutsSQL = "SELECT set_config('lock_timeout', '0', true), set_config('statement_timeout', '0', true), set_config('idle_in_transaction_session_timeout', '0', true)"

// noTimeoutsSessionSQL is noTimeoutsSQL for a session (the migration's
// connection, closed after): set_config not local to the transaction.
var noTimeoutsSessionSQL = strings.ReplaceAll(noTimeoutsSQL, "'0', true)", "'0', false)")
