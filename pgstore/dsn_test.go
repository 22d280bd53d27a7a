package pgstore

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

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
