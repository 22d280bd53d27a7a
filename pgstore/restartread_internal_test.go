package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"
	"time"

	"github.com/runstate/runstate"
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
	db, err := Connect(ctx, srv.DSN("127.0.0.1"))
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

	srv.Restart(t, time.Second) // every connection ended, none taken until the start
	missing, err := bs.Missing(ctx, []string{sum})
	require.NoError(t, err, "Missing through a restart")
	assert.Empty(t, missing)

	srv.Restart(t, time.Second)
	got, err = get()
	require.NoError(t, err, "Get through a restart")
	assert.Equal(t, data, got)

	other := bytes.Repeat([]byte("another output\n"), 10000)
	h = sha256.Sum256(other)
	srv.Restart(t, time.Second)
	require.NoError(t, bs.Put(ctx, hex.EncodeToString(h[:]), int64(len(other)), bytes.NewReader(other)), "Put through a restart")
	missing, err = bs.Missing(ctx, []string{hex.EncodeToString(h[:])})
	require.NoError(t, err)
	assert.Empty(t, missing)
}

// The DB's readers go on through a server restart too: a status command,
// or the fleet's leader reading its run at the end, got "FATAL:
// terminating connection due to administrator command" from a pooled
// connection the restart had ended. ReadLedger and Export are tried again
// only until they hand over a record.
func TestReadersGoOnThroughAServerRestart(t *testing.T) {
	srv := startServer(t, nil, nil)
	ctx := context.Background()
	db, err := Connect(ctx, srv.DSN("127.0.0.1"))
	require.NoError(t, err)
	defer db.Close()
	r, err := db.Open(ctx, "one", t.TempDir(), &runstate.Options{Request: "read through a restart"})
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, r.Close())

	for name, read := range map[string]func() error{
		"Inspect": func() error {
			st, err := db.Inspect(ctx, "one")
			if err == nil {
				a, _ := st.Stage("a")
				assert.Equal(t, runstate.StateComplete, a.State)
			}
			return err
		},
		"NextSteps": func() error { _, err := db.NextSteps(ctx, "one"); return err },
		"Verify": func() error {
			rep, err := db.Verify(ctx, "one")
			if err == nil {
				assert.Empty(t, rep.Problems)
			}
			return err
		},
		"Runs": func() error {
			names, err := db.Runs(ctx)
			assert.Equal(t, []string{"one"}, names)
			return err
		},
		"Has": func() error { _, err := db.Has(ctx, "one"); return err },
		"ReadLedger": func() error {
			n := 0
			err := db.ReadLedger(ctx, "one", func(*runstate.Record) error { n++; return nil })
			if err == nil {
				assert.Equal(t, 5, n, "create, open, begin, complete, close: each once")
			}
			return err
		},
		"Export": func() error {
			var b bytes.Buffer
			err := db.Export(ctx, "one", &b)
			if err == nil {
				assert.Equal(t, 5, bytes.Count(b.Bytes(), []byte("\n")), "each line once")
			}
			return err
		},
	} {
		srv.Restart(t, 500*time.Millisecond)
		assert.NoError(t, read(), "%s through a restart", name)
	}
}
