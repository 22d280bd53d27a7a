package pgstore

import (
	"context"
	"crypto/tls"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/runstate/runstate/pgstore/internal/dsnparam"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A URL DSN whose password holds an '@', '/', '?' or '#' that is not
// percent-encoded is refused before pgx reads it (which took part of the
// password for the host, the port or the database, and so showed it in
// its messages), with an error that shows no part of the password and
// says how to encode it. Encoded, the same password connects.
func TestConnectRefusesAPasswordThatIsNotPercentEncoded(t *testing.T) {
	for _, pw := range []string{"Zq7@Wk", "Zq7/Wk", "74/Wk", "Zq7@Wk/Mv", "Mv/Zq7@Wk", "Zq7?Wk@", "Zq7#Wk", "Zq7@@Wk"} {
		for _, dsn := range []string{
			"postgres://u:" + pw + "@127.0.0.1:1/db",
			"postgresql://u:" + pw + "@127.0.0.1:1/db?sslmode=disable&schema=s",
			"postgres://u:" + pw + "@h1:5432,h2:5433/db",
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := Connect(ctx, dsn)
			cancel()
			require.Error(t, err, dsn)
			msg := err.Error()
			assert.Contains(t, msg, "ambiguous", dsn)
			assert.Contains(t, msg, "'@' as %40, '/' as %2F", dsn)
			for _, part := range strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("@/?#", r) }) {
				assert.NotContains(t, msg, part, "%s: the message shows no part of the password", dsn)
			}
			assert.NotContains(t, msg, "127.0.0.1", "%s: nor any of the DSN", dsn)
		}
	}
	// Parameters and hosts may hold those characters; an encoded password
	// is read as it is meant (the test server may ignore it: trust).
	for _, dsn := range []string{
		"postgres://u@127.0.0.1:1/db?options=-c%20x=a@b&application_name=a/b@c",
		"postgres:///db?host=/var/run/postgresql&user=me@example.com",
		"host=127.0.0.1 port=1 password=Zq7@Wk/Mv",
		"postgres://u:" + url.QueryEscape("Zq7@Wk/Mv?#") + "@127.0.0.1:1/db",
	} {
		assert.NoError(t, checkUserinfo(dsn), dsn)
	}
	u, err := url.Parse(testDSN(t))
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "Zq7@Wk/Mv?#")
	db, err := Connect(context.Background(), withSchema(u.String(), newSchema(t)))
	if err != nil {
		assert.NotContains(t, err.Error(), "ambiguous", "an encoded password (%s) is not ambiguous", u.Redacted())
		assert.Contains(t, err.Error(), "check the user and password", "a server that checks passwords refuses it as one")
	} else {
		db.Close()
	}
}

// A DSN that pgx cannot parse is refused with pgx's reason, without pgx's
// copy of the DSN, whose password pgx masks only where it can tell where
// the password ends.
func TestConnectParseErrorShowsNoPassword(t *testing.T) {
	for _, c := range []struct{ dsn, reason string }{
		{`host=127.0.0.1 password=Zq7\ Wk port=abc`, "invalid port"},
		{`host=127.0.0.1 password='Zq7 Wk' sslmode=bogus`, "sslmode is invalid"},
		{"postgres://u:Zq7Wk@127.0.0.1:abc/db", "invalid port"},
		{"postgres://u:Zq7%zzWk@127.0.0.1:1/db", "invalid percent-encoded token in password"},
	} {
		_, err := Connect(context.Background(), c.dsn)
		require.Error(t, err, c.dsn)
		assert.Contains(t, err.Error(), "pgstore: cannot parse the DSN", c.dsn)
		assert.Contains(t, err.Error(), c.reason, c.dsn)
		assert.NotContains(t, err.Error(), "Zq7", c.dsn)
		assert.NotContains(t, err.Error(), "Wk", c.dsn)
	}
}

// DB.Address names the server as the DSN did: a Unix socket's directory,
// a port other than 5432, every host of a list, sslmode (from the DSN,
// else PGSSLMODE), the database and the user; never the password. Read
// back (without run=, as the runstate command reads it), it connects to
// the same place the same way.
func TestAddressRoundTrips(t *testing.T) {
	t.Setenv("PGSSLMODE", "") // pgx reads it too
	for _, dsn := range []string{
		"postgres://alice:Zq7Wk@127.0.0.1:5433/billing?sslmode=disable",
		"postgres://alice:Zq7Wk@db.example:5432/billing?sslmode=require",
		"postgres://alice@h1:5432,h2:5434/billing?sslmode=verify-full",
		"postgres://alice@%2Fvar%2Frun%2Fpostgresql:5433/billing",
		"postgres:///billing?host=/var/run/postgresql&user=alice&password=Zq7Wk",
		"host=/tmp/pg port=5439 dbname='my db' user=alice password='Zq7 Wk'",
		"host=127.0.0.1 port=5439 dbname=billing user=alice sslmode='allow'",
		"postgres://alice@127.0.0.1/billing?schema=s2",
	} {
		rest, _, err := splitSchema(dsn)
		require.NoError(t, err)
		cfg, err := pgconn.ParseConfig(rest)
		require.NoError(t, err, dsn)
		db := &DB{schema: DefaultSchema, lockCfg: &pgx.ConnConfig{Config: *cfg}, addrParams: addressParams(rest)}
		if strings.Contains(dsn, "schema=s2") {
			db.schema = "s2"
		}
		addr := db.Address("billing-1")
		assert.NotContains(t, addr, "Zq7", "%s: the address holds no password", dsn)
		dsn2, run, err := cutRun(addr)
		require.NoError(t, err, addr)
		assert.Equal(t, "billing-1", run, addr)
		rest2, schema, err := splitSchema(dsn2)
		require.NoError(t, err, addr)
		if db.schema != DefaultSchema {
			assert.Equal(t, db.schema, schema, addr)
		}
		got, err := pgconn.ParseConfig(rest2)
		require.NoError(t, err, addr)
		assert.Equal(t, hosts(cfg), hosts(got), "%s -> %s: hosts and ports", dsn, addr)
		assert.Equal(t, cfg.Database, got.Database, addr)
		assert.Equal(t, cfg.User, got.User, addr)
		assert.Equal(t, dsnSetting(rest, "sslmode"), dsnSetting(rest2, "sslmode"), addr)
		assert.Equal(t, tlsShape(cfg), tlsShape(got), "%s -> %s: TLS", dsn, addr)
		t.Logf("%s\n  -> %s", dsn, addr)
	}

	// The test server's address connects to its schema.
	db := newTestDB(t)
	dsn, run, err := cutRun(db.Address("r"))
	require.NoError(t, err)
	assert.Equal(t, "r", run)
	back, err := ConnectReadOnly(context.Background(), dsn)
	require.NoError(t, err, dsn)
	defer back.Close()
	assert.Equal(t, db.Address("r"), back.Address("r"))
}

// cutRun removes run=NAME from an address as the runstate command does
// (dsnparam.Cut).
func cutRun(addr string) (string, string, error) {
	base, query, _ := strings.Cut(addr, "?")
	rest, run, _, err := dsnparam.Cut(query, "run")
	if rest != "" {
		base += "?" + rest
	}
	return base, run, err
}

func hosts(c *pgconn.Config) []string {
	list := []string{c.Host + ":" + strconv.Itoa(int(c.Port))}
	for _, f := range c.Fallbacks {
		if hp := f.Host + ":" + strconv.Itoa(int(f.Port)); hp != list[len(list)-1] {
			list = append(list, hp)
		}
	}
	return list
}

// tlsShape is whether each try of c uses TLS, and checks the server's name.
func tlsShape(c *pgconn.Config) []string {
	shape := func(t *tls.Config) string {
		switch {
		case t == nil:
			return "plain"
		case t.InsecureSkipVerify:
			return "tls"
		default:
			return "tls verify " + t.ServerName
		}
	}
	var list []string
	for _, t := range tlsConfigs(c) {
		list = append(list, shape(t))
	}
	return list
}

// tlsConfigs is the TLS configuration of each try of c: its own, then its
// fallbacks'.
func tlsConfigs(c *pgconn.Config) []*tls.Config {
	list := []*tls.Config{c.TLSConfig}
	for _, f := range c.Fallbacks {
		list = append(list, f.TLSConfig)
	}
	return list
}
