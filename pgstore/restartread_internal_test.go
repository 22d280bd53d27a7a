package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A server restart (its pooled connections ended, new ones refused until
// it is up) does not fail the blob reads and writes under way, as it does
// not fail a batch (store.Lock): Missing, Put and Get wait for the server
// for as long as a session may take its lock back. Before, a worker of the
// fleet example whose stage found its output made on another machine
// failed with "fetch output ...: FATAL: terminating connection due to
// administrator command" after a restart.
func TestBlobReadsGoOnThroughAServerRestart(t *testing.T) {
	srv := startServer(t, nil, nil)
	ctx := context.Background()
	db, err := Connect(ctx, srv.dsn("127.0.0.1"))
	require.NoError(t, err)
	defer db.Close()
	bs := db.Store("restart").Blobs()
	data := bytes.Repeat([]byte("the bytes of an output made on another machine\n"), 3000) // more than inlineMax
	h := sha256.Sum256(data)
	sum := hex.EncodeToString(h[:])
	get := func() ([]byte, error) {
		rc, err := bs.Get(ctx, sum)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	require.NoError(t, bs.Put(ctx, sum, int64(len(data)), bytes.NewReader(data)))
	got, err := get() // the pool's connections in use, then idle
	require.NoError(t, err)
	require.Equal(t, data, got)

	restart := func() {
		t.Helper()
		// Every connection ended (57P01), none taken until the start; a
		// fast stop keeps the blobs put with synchronous_commit off.
		require.NoError(t, srv.run("pg_ctl", "-D", srv.data, "-m", "fast", "-w", "stop"))
		go func() {
			time.Sleep(time.Second)
			srv.start(t)
		}()
	}
	restart()
	missing, err := bs.Missing(ctx, []string{sum})
	require.NoError(t, err, "Missing through a restart")
	assert.Empty(t, missing)

	restart()
	got, err = get()
	require.NoError(t, err, "Get through a restart")
	assert.Equal(t, data, got)

	other := bytes.Repeat([]byte("another output\n"), 10000)
	h = sha256.Sum256(other)
	restart()
	require.NoError(t, bs.Put(ctx, hex.EncodeToString(h[:]), int64(len(other)), bytes.NewReader(other)), "Put through a restart")
	missing, err = bs.Missing(ctx, []string{hex.EncodeToString(h[:])})
	require.NoError(t, err)
	assert.Empty(t, missing)
}
