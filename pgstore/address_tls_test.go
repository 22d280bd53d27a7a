package pgstore

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// DB.Address keeps how the DSN says to connect over TLS and to which host
// of a list: sslrootcert, sslcert and sslkey (each path made absolute, so
// that the runstate command run from another directory reads the same
// files), sslsni and target_session_attrs, from the DSN or, where it does
// not set them, from the environment (PGSSLROOTCERT …), as pgx reads them;
// never sslpassword. Read back from another directory, the address
// trusts the same CA, presents the same client certificate and asks for
// the same kind of server.
func TestAddressKeepsTheTLSFilesAndTheSessionKind(t *testing.T) {
	for _, env := range []string{"PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGSSLSNI", "PGTARGETSESSIONATTRS"} {
		t.Setenv(env, "")
	}
	dir := t.TempDir()
	writeTestCerts(t, dir)
	ca := filepath.Join(dir, "ca.pem")
	other := t.TempDir()

	t.Chdir(dir)
	for _, c := range []struct {
		name, dsn string
		env       map[string]string
		client    bool
		session   bool
	}{
		{name: "absolute root certificate", dsn: "postgres://alice@db.example:5432/billing?sslmode=verify-full&sslrootcert=" + ca},
		{name: "relative paths, client certificate, sslsni, target_session_attrs", client: true, session: true,
			dsn: "postgres://alice@h1:5432,h2:5433/billing?sslmode=verify-ca&sslrootcert=ca.pem&sslcert=client.pem&sslkey=client.key&sslpassword=Zq7Wk&sslsni=0&target_session_attrs=read-write"},
		{name: "key=value DSN", client: true,
			dsn: "host=db.example dbname=billing user=alice sslmode=verify-full sslrootcert=ca.pem sslcert=client.pem sslkey=client.key"},
		{name: "from the environment", dsn: "postgres://alice@db.example/billing?sslmode=verify-full", session: true,
			env: map[string]string{"PGSSLROOTCERT": "ca.pem", "PGTARGETSESSIONATTRS": "read-write"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			cfg, err := pgconn.ParseConfig(c.dsn)
			require.NoError(t, err)
			db := &DB{schema: DefaultSchema, lockCfg: &pgx.ConnConfig{Config: *cfg}, addrParams: addressParams(c.dsn)}
			addr := db.Address("billing-1")
			t.Log(addr)
			assert.NotContains(t, addr, "Zq7Wk", "the address holds no sslpassword")
			assert.Contains(t, addr, "sslrootcert="+ca, "the root certificate, by its absolute path")
			for k := range c.env {
				t.Setenv(k, "") // the address alone says it
			}

			t.Chdir(other)
			dsn, _, err := cutRun(addr)
			require.NoError(t, err)
			got, err := pgconn.ParseConfig(dsn)
			require.NoError(t, err, addr)
			assert.Equal(t, tlsShape(cfg), tlsShape(got), "TLS")
			want := tlsConfigs(cfg)
			for i, g := range tlsConfigs(got) {
				require.NotNil(t, g)
				require.NotNil(t, g.RootCAs, "try %d: the root certificate is read", i)
				assert.True(t, g.RootCAs.Equal(want[i].RootCAs), "try %d: the same CA", i)
				assert.Equal(t, len(want[i].Certificates), len(g.Certificates), "try %d: the client certificate", i)
				if c.client {
					require.Len(t, g.Certificates, 1)
					assert.Equal(t, want[i].Certificates[0].Certificate, g.Certificates[0].Certificate)
				}
			}
			assert.Equal(t, c.session, got.ValidateConnect != nil, "target_session_attrs")
			if c.name == "relative paths, client certificate, sslsni, target_session_attrs" {
				assert.Contains(t, addr, "sslsni=0")
				assert.Contains(t, addr, "sslcert="+filepath.Join(dir, "client.pem"))
			}
			t.Chdir(dir)
		})
	}
}

// writeTestCerts writes a CA (ca.pem) and a client certificate it signed
// with its key (client.pem, client.key) in dir.
func writeTestCerts(t *testing.T, dir string) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		return k
	}
	write := func(name, kind string, der []byte) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600))
	}
	caKey, clientKey := key(), key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "runstate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	write("ca.pem", "CERTIFICATE", caDER)
	clientTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "alice"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	clientDER, err := x509.CreateCertificate(rand.Reader, clientTmpl, caTmpl, &clientKey.PublicKey, caKey)
	require.NoError(t, err)
	write("client.pem", "CERTIFICATE", clientDER)
	keyDER, err := x509.MarshalECPrivateKey(clientKey)
	require.NoError(t, err)
	write("client.key", "EC PRIVATE KEY", keyDER)
}
