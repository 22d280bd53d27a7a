package pgproxy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate/pgstore/internal/pgproxy"
)

// serverDSN is the test server's DSN (RUNSTATE_PG_DSN); without it the
// test skips, except under CI=true, where it fails.
func serverDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("RUNSTATE_PG_DSN")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("RUNSTATE_PG_DSN is not set under CI=true: .ci/run starts a PostgreSQL server and exports it")
		}
		t.Skip("RUNSTATE_PG_DSN is not set: start a PostgreSQL server (see pgstore/README.md) and export its DSN")
	}
	return dsn
}

// through returns the DSN with its host and port replaced by the proxy's,
// and the server's host:port.
func through(t *testing.T, dsn string, p *pgproxy.Proxy) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err, "RUNSTATE_PG_DSN must be a postgres:// URL")
	u.Host = p.Addr()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return u.String()
}

func serverAddr(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	return net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
}

// fixture makes a proxy to the server and a table of its own.
func fixture(t *testing.T) (p *pgproxy.Proxy, direct, proxied string, table string) {
	dsn := serverDSN(t)
	p, err := pgproxy.New(serverAddr(t, dsn))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	table = fmt.Sprintf("pgproxy_%d", time.Now().UnixNano())
	ctx := context.Background()
	c := connect(t, dsn)
	_, err = c.Exec(ctx, "CREATE TABLE "+table+" (k text PRIMARY KEY, v bytea)")
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, dsn)
		if err == nil {
			_, _ = c.Exec(ctx, "DROP TABLE "+table)
			c.Close(ctx)
		}
	})
	return p, dsn, through(t, dsn, p), table
}

// connect opens a connection closed at the test's end.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func count(t *testing.T, dsn, table, k string) int {
	t.Helper()
	ctx := context.Background()
	c := connect(t, dsn)
	var n int
	require.NoError(t, c.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE k = $1", k).Scan(&n))
	return n
}

// insert runs one transaction that inserts k, the way style says: "tx"
// (pgx's Begin/Exec/Commit: simple-protocol BEGIN and COMMIT, the insert
// prepared) or "batch" (BEGIN, the insert and COMMIT in one pipelined
// pgx.Batch, each statement through the extended protocol and the
// statement cache) or "implicit" (the insert alone in a pgx.Batch: an
// implicit transaction, committed at the pipeline's Sync).
func insert(ctx context.Context, c *pgx.Conn, style, table, k string, v []byte) error {
	q := "INSERT INTO " + table + " (k, v) VALUES ($1, $2)"
	switch style {
	case "tx":
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q, k, v); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx)
	case "batch":
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(q, k, v)
		b.Queue("COMMIT")
		return c.SendBatch(ctx, b).Close()
	case "implicit":
		b := &pgx.Batch{}
		b.Queue(q, k, v)
		return c.SendBatch(ctx, b).Close()
	}
	panic(style)
}

// The proxy cuts before the COMMIT (not committed) and after it (committed,
// the client gets an error), for COMMIT sent either way pgx sends it; a
// rule with a Match fires only on the transaction that carries it. An
// implicit transaction's commit is its Sync.
func TestCutAroundCommit(t *testing.T) {
	for _, style := range []string{"tx", "batch", "implicit"} {
		for _, cut := range []pgproxy.Cut{pgproxy.BeforeCommit, pgproxy.AfterCommit} {
			t.Run(style+"/"+cut.String(), func(t *testing.T) {
				p, direct, proxied, table := fixture(t)
				ctx := context.Background()
				c, err := pgx.Connect(ctx, proxied)
				require.NoError(t, err)
				defer c.Close(ctx)
				// Twice, so that the second round runs on cached
				// prepared statements (Bind/Execute only).
				require.NoError(t, insert(ctx, c, style, table, "warm-1", []byte("x")))
				require.NoError(t, insert(ctx, c, style, table, "warm-2", []byte("x")))

				a := p.Arm(pgproxy.Rule{Cut: cut, Match: []string{"marker-42"}})
				// A transaction without the marker passes.
				require.NoError(t, insert(ctx, c, style, table, "other", []byte("no mark")))
				select {
				case <-a.Fired():
					t.Fatal("the rule fired on a transaction without its marker")
				default:
				}
				err = insert(ctx, c, style, table, "cut", []byte("payload marker-42 payload"))
				require.Error(t, err, "the client must see the cut as an error")
				assert.True(t, a.Wait(time.Second), "the rule did not fire")
				var pgErr *pgconn.PgError
				assert.False(t, errors.As(err, &pgErr), "a cut is a connection error, not a server error: %v", err)
				want := 0
				if cut == pgproxy.AfterCommit {
					want = 1
				}
				assert.Equal(t, want, count(t, direct, table, "cut"), "rows of the cut transaction; proxy log %q", p.Log())
				assert.Equal(t, 1, count(t, direct, table, "other"))
			})
		}
	}
}

// Two transactions in one pipeline (a pgx.Batch: BEGIN … COMMIT twice,
// one Sync), the rule matching the second: AfterCommit cuts at the second
// COMMIT's reply, not the first's, which reaches the client; BeforeCommit
// lets the first COMMIT through and keeps the second from the server.
func TestCutTheSecondTransactionOfAPipeline(t *testing.T) {
	for _, cut := range []pgproxy.Cut{pgproxy.BeforeCommit, pgproxy.AfterCommit} {
		t.Run(cut.String(), func(t *testing.T) {
			p, direct, proxied, table := fixture(t)
			ctx := context.Background()
			c, err := pgx.Connect(ctx, proxied)
			require.NoError(t, err)
			defer c.Close(ctx)
			q := "INSERT INTO " + table + " (k, v) VALUES ($1, $2)"
			// Refuse: pgx answers the cut with a CancelRequest (a new
			// connection, through the proxy); on a loaded machine it reached
			// the backend while that was still running the first
			// transaction, forwarded before the cut, and rolled it back
			// ("canceling statement due to user request" on the INSERT).
			a := p.Arm(pgproxy.Rule{Cut: cut, Match: []string{"marker-43"}, Refuse: true})
			b := new(pgx.Batch)
			b.Queue("BEGIN")
			b.Queue(q, "first", []byte("no mark"))
			b.Queue("COMMIT")
			b.Queue("BEGIN")
			b.Queue(q, "second", []byte("payload marker-43"))
			b.Queue("COMMIT")
			br := c.SendBatch(ctx, b)
			failed := -1
			for i := range b.Len() {
				if _, err := br.Exec(); err != nil {
					failed = i
					break
				}
			}
			_ = br.Close()
			assert.True(t, a.Wait(time.Second), "the rule did not fire")
			// The cut is the proxy's; the server's backend may not have
			// read, let alone run, what the proxy forwarded before it (the
			// first COMMIT, before COMMIT) when the client hears of it:
			// the rows are counted once that backend is gone, when what it
			// committed and what it rolled back are settled.
			backendGone(t, direct, c.PgConn().PID())
			assert.Equal(t, 1, count(t, direct, table, "first"))
			if cut == pgproxy.AfterCommit {
				assert.Equal(t, 5, failed, "the client hears every reply but the second COMMIT's; proxy log %q", p.Log())
				assert.Equal(t, 1, count(t, direct, table, "second"), "the second transaction committed")
			} else {
				assert.Equal(t, 0, count(t, direct, table, "second"), "the second transaction did not commit")
				assert.GreaterOrEqual(t, failed, 0, "the client sees the cut")
			}
		})
	}
}

// backendGone waits, up to 10 s, until the server has ended the backend
// pid (a connection the proxy cut).
func backendGone(t *testing.T, dsn string, pid uint32) {
	t.Helper()
	ctx := context.Background()
	c := connect(t, dsn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var alive bool
		require.NoError(t, c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", int64(pid)).Scan(&alive))
		if !alive {
			return
		}
		require.True(t, time.Now().Before(deadline), "the server did not end the cut connection's backend (pid %d) in 10 s", pid)
		time.Sleep(time.Millisecond)
	}
}

// An implicit transaction that the server rolled back at its Sync (a
// statement failed) is no commit: an AfterCommit rule does not fire on it
// and stays armed, and fires on the next one that commits; an implicit
// transaction ends at its Sync, so the next one matches on its own
// statements only.
func TestImplicitTransactionThatFailedIsNoCommit(t *testing.T) {
	p, direct, proxied, table := fixture(t)
	ctx := context.Background()
	c := connect(t, proxied)
	require.NoError(t, insert(ctx, c, "implicit", table, "dup", nil))
	require.NoError(t, insert(ctx, c, "implicit", table, "warm", nil))
	a := p.Arm(pgproxy.Rule{Cut: pgproxy.AfterCommit, Match: []string{"marker-7"}})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, insert(ctx, c, "implicit", table, "dup", []byte("marker-7")), &pgErr, "a duplicate key: the server's error, no cut")
	select {
	case <-a.Fired():
		t.Fatal("the rule fired on a transaction the server rolled back")
	default:
	}
	require.NoError(t, insert(ctx, c, "implicit", table, "plain", nil), "the failed transaction's marker does not carry over")
	require.Error(t, insert(ctx, c, "implicit", table, "cut", []byte("marker-7")))
	assert.True(t, a.Wait(time.Second), "the rule did not fire on the next commit; log %q", p.Log())
	assert.Equal(t, 1, count(t, direct, table, "cut"), "committed before the cut")
}

// Text-format parameters (bytea spelled as hex) match too.
func TestMatchHexParameter(t *testing.T) {
	p, direct, proxied, table := fixture(t)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(proxied)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	c, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer c.Close(ctx)
	a := p.Arm(pgproxy.Rule{Cut: pgproxy.BeforeCommit, Match: []string{"marker-hex"}})
	require.Error(t, insert(ctx, c, "tx", table, "cut", []byte("marker-hex")))
	assert.True(t, a.Wait(time.Second))
	assert.Equal(t, 0, count(t, direct, table, "cut"))
}

// OnMatch cuts in the middle of a transaction (a blob upload), before the
// matching statement reaches the server.
func TestCutOnMatch(t *testing.T) {
	p, direct, proxied, table := fixture(t)
	ctx := context.Background()
	c := connect(t, proxied)
	a := p.Arm(pgproxy.Rule{Cut: pgproxy.OnMatch, Match: []string{"INSERT INTO " + table, "chunk-7"}})
	for i := 0; i < 7; i++ {
		require.NoError(t, insert(ctx, c, "batch", table, fmt.Sprintf("chunk-%d", i), nil))
	}
	assert.Error(t, insert(ctx, c, "batch", table, "chunk-7", nil))
	assert.True(t, a.Wait(time.Second))
	assert.Equal(t, 0, count(t, direct, table, "chunk-7"))
	assert.Equal(t, 1, count(t, direct, table, "chunk-6"))
}

// CutWhere finds a connection by what it ran (the session-lock
// connection) and cuts it: the server frees its session lock.
func TestCutWhereSawStatement(t *testing.T) {
	p, direct, proxied, _ := fixture(t)
	ctx := context.Background()
	holder := connect(t, proxied)
	other := connect(t, proxied)
	key := time.Now().UnixNano()
	var ok bool
	require.NoError(t, holder.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok))
	require.True(t, ok)
	require.NoError(t, other.Ping(ctx))

	d := connect(t, direct)
	require.NoError(t, d.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok))
	require.False(t, ok, "the holder's lock must be held")

	n := p.CutWhere(func(c pgproxy.Conn) bool { return c.Saw("pg_try_advisory_lock(") })
	assert.Equal(t, 1, n, "exactly the holder's connection")
	assert.NoError(t, other.Ping(ctx), "the other connection is not cut")
	assert.Error(t, holder.Ping(ctx))
	deadline := time.Now().Add(5 * time.Second)
	for !ok && time.Now().Before(deadline) {
		require.NoError(t, d.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok))
		if !ok {
			time.Sleep(5 * time.Millisecond)
		}
	}
	assert.True(t, ok, "the server did not free the cut holder's lock in 5 s")
}

// Refuse turns new connections away; connections already open go on.
func TestRefuse(t *testing.T) {
	p, _, proxied, _ := fixture(t)
	ctx := context.Background()
	c := connect(t, proxied)
	p.Refuse(true)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := pgx.Connect(cctx, proxied)
	assert.Error(t, err)
	assert.NoError(t, c.Ping(ctx))
	p.Refuse(false)
	c2, err := pgx.Connect(ctx, proxied)
	require.NoError(t, err)
	c2.Close(ctx)
	assert.True(t, strings.Contains(proxied, p.Addr()))
}

// A rule with Refuse turns new connections away from the moment it fires:
// the cut connection's client cannot reconnect before the test says so.
func TestRuleRefusesFromTheCut(t *testing.T) {
	p, _, proxied, _ := fixture(t)
	ctx := context.Background()
	c := connect(t, proxied)
	a := p.Arm(pgproxy.Rule{Cut: pgproxy.OnMatch, Match: []string{"refuse-me"}, Refuse: true})
	_, _ = c.Exec(ctx, "SELECT 'refuse-me'")
	require.True(t, a.Wait(5*time.Second))
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := pgx.Connect(cctx, proxied)
	assert.Error(t, err, "refused since the cut")
	p.Refuse(false)
	c2, err := pgx.Connect(ctx, proxied)
	require.NoError(t, err)
	c2.Close(ctx)
}
