package pgstore

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A working directory serves one run: a second run opened there (another
// id) is refused with runstate.ErrMismatch, naming the run the directory
// belongs to (from its logs/run.json) and what to do; the directory still
// names that run, which opens there again, and the refused Open leaves no
// session open.
func TestOpenRefusesAWorkDirOfAnotherRun(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	a, err := db.Open(ctx, "a", dir, &runstate.Options{Request: "run a"})
	require.NoError(t, err)
	idA := a.ID()
	require.NoError(t, a.Close())

	for _, open := range []func() (*runstate.Run, error){
		func() (*runstate.Run, error) { return db.Open(ctx, "b", dir, &runstate.Options{Request: "run b"}) },
		func() (*runstate.Run, error) {
			return runstate.OpenStore(db.Store("b"), dir, &runstate.Options{Request: "run b"})
		},
	} {
		b, err := open()
		if b != nil {
			_ = b.Close()
		}
		require.Error(t, err)
		assert.ErrorIs(t, err, runstate.ErrMismatch)
		assert.Contains(t, err.Error(), `names run "a" (id `+idA+`) at `+db.Address("a"))
		assert.Contains(t, err.Error(), "give each run a working directory of its own")
	}

	data, err := os.ReadFile(filepath.Join(dir, "logs", "run.json"))
	require.NoError(t, err)
	var rj runJSON
	require.NoError(t, json.Unmarshal(data, &rj))
	assert.Equal(t, idA, rj.ID, "the directory still names run a")
	assert.Zero(t, sessionRows(t, db), "the refused Opens left no session open")

	a, err = db.Open(ctx, "a", dir, &runstate.Options{Request: "run a"})
	require.NoError(t, err, "run a opens in its own directory again")
	require.NoError(t, a.Close())
}

// DB.Open refuses a working directory whose logs/run.json names another
// run by name before it opens the run: nothing is recorded of the
// refused one, not even its row in runs.
func TestOpenRefusesAWorkDirOfAnotherRunBeforeRecording(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	a, err := db.Open(ctx, "a", dir, &runstate.Options{Request: "run a"})
	require.NoError(t, err)
	require.NoError(t, a.Close())

	b, err := db.Open(ctx, "b", dir, &runstate.Options{Request: "run b"})
	if b != nil {
		_ = b.Close()
	}
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), `names run "a"`)
	assert.Contains(t, err.Error(), `this run is "b" in schema `+db.schema)
	var runs int
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT count(*) FROM {s}.runs WHERE name = 'b'`)).Scan(&runs))
	assert.Zero(t, runs, "the refused run was not created")
}
