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
	db, dir, idA := workDirOfRunA(t)
	ctx := context.Background()

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

	a, err := db.Open(ctx, "a", dir, &runstate.Options{Request: "run a"})
	require.NoError(t, err, "run a opens in its own directory again")
	require.NoError(t, a.Close())
}

// DB.Open refuses a working directory whose logs/run.json names another
// run by name before it opens the run: nothing is recorded of the
// refused one, not even its row in runs.
func TestOpenRefusesAWorkDirOfAnotherRunBeforeRecording(t *testing.T) {
	db, dir, _ := workDirOfRunA(t)
	ctx := context.Background()

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

// A working directory whose logs/run.json names this run's name with
// another id (the run was made again under its name, or the database
// lost it) is refused before the session records anything: no open or
// close record is added to the run, none is made for a run not yet in the
// database, and no session is left open. The same holds for a directory
// of another run opened through runstate.OpenStore(db.Store(name), ...),
// which skips DB.Open's check by name.
func TestOpenRefusesAWorkDirOfAnotherIDBeforeRecording(t *testing.T) {
	db, dir, idA := workDirOfRunA(t)
	ctx := context.Background()
	before := runRecords(t, db, "a")

	// Another incarnation of a: the directory names a by name, another id.
	path := filepath.Join(dir, "logs", "run.json")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var rj runJSON
	require.NoError(t, json.Unmarshal(data, &rj))
	rj.ID = "0190a0a0-0000-7000-8000-000000000001"
	data, err = json.Marshal(rj)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data, 0o644))

	refused := func(r *runstate.Run, err error) error {
		if r != nil {
			_ = r.Close()
		}
		return err
	}
	err = refused(db.Open(ctx, "a", dir, &runstate.Options{Request: "run a"}))
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), "this run's id is "+idA)
	assert.Equal(t, before, runRecords(t, db, "a"), "the refused Open recorded nothing in run a")

	// A run of that name not in the database (another schema's name for
	// it): nothing is created but the run's row.
	rj.Run, rj.ID, rj.Address = "c", "0190a0a0-0000-7000-8000-000000000002", db.Address("c")
	data, err = json.Marshal(rj)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	err = refused(db.Open(ctx, "c", dir, &runstate.Options{Request: "run c"}))
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), "not in the database yet")
	assert.Zero(t, runRecords(t, db, "c"), "the refused Open created no run c")

	// OpenStore(db.Store(...)) of another run's directory, by name.
	err = refused(runstate.OpenStore(db.Store("b"), dir, &runstate.Options{Request: "run b"}))
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), `this run is "b" in schema `+db.schema)
	assert.Zero(t, runRecords(t, db, "b"), "the refused OpenStore created no run b")
	assert.Zero(t, sessionRows(t, db), "the refused Opens left no session open")
}

// runRecords is how many records the run named name has.
func runRecords(t *testing.T, db *DB, name string) int {
	t.Helper()
	var n int
	require.NoError(t, db.pool.QueryRow(context.Background(), db.sql(`SELECT count(*) FROM {s}.records r JOIN {s}.runs u ON u.id = r.run_id WHERE u.name = $1`), name).Scan(&n))
	return n
}

// A run directory (a run kept in files: logs/ledger.jsonl) is no working
// directory for a run in the database: DB.Open and OpenStore refuse it
// with runstate.ErrMismatch before anything is recorded (DB.Open: not
// even the run's row), naming the
// ledger, and the directory's own views (next-steps.txt, manifest.json)
// are left as they were.
func TestOpenRefusesARunDirectory(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	f, err := runstate.Open(dir, &runstate.Options{Request: "a run in files", NoSync: true})
	require.NoError(t, err)
	require.NoError(t, f.Do(ctx, "inspect", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("notes.md", []byte("notes\n"))
	}))
	require.NoError(t, f.Close())
	views := func() [2][]byte {
		var v [2][]byte
		for i, name := range []string{"logs/next-steps.txt", "manifest.json"} {
			data, err := os.ReadFile(filepath.Join(dir, name))
			require.NoError(t, err)
			v[i] = data
		}
		return v
	}
	before := views()

	for i, open := range []func() (*runstate.Run, error){
		func() (*runstate.Run, error) { return db.Open(ctx, "d", dir, &runstate.Options{Request: "run d"}) },
		func() (*runstate.Run, error) {
			return runstate.OpenStore(db.Store("d"), dir, &runstate.Options{Request: "run d"})
		},
	} {
		r, err := open()
		if r != nil {
			_ = r.Close()
		}
		require.ErrorIs(t, err, runstate.ErrMismatch)
		assert.Contains(t, err.Error(), dir+" is a run directory")
		assert.Contains(t, err.Error(), filepath.Join(dir, "logs", "ledger.jsonl"))
		assert.Contains(t, err.Error(), "give that run a working directory of its own")
		if i == 0 {
			var runs int
			require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT count(*) FROM {s}.runs WHERE name = 'd'`)).Scan(&runs))
			assert.Zero(t, runs, "DB.Open refused before the run's row")
		}
	}
	assert.Equal(t, before, views(), "the run directory's views are unchanged")
	assert.NoFileExists(t, filepath.Join(dir, "logs", "run.json"))
	assert.Zero(t, runRecords(t, db, "d"), "run d has no records")
	assert.Zero(t, sessionRows(t, db), "the refused Opens left no session open")
}

// workDirOfRunA opens and closes run "a" (Request "run a") of a new
// schema in a new working directory, and returns them and a's id.
func workDirOfRunA(t *testing.T) (*DB, string, string) {
	t.Helper()
	db := newTestDB(t)
	dir := t.TempDir()
	a, err := db.Open(context.Background(), "a", dir, &runstate.Options{Request: "run a"})
	require.NoError(t, err)
	id := a.ID()
	require.NoError(t, a.Close())
	return db, dir, id
}

// CheckWorkDir refuses, without a server, the working directories DB.Open
// refuses before it opens a run, and lets a new or this run's directory
// through.
func TestCheckWorkDirWithoutAServer(t *testing.T) {
	fresh := t.TempDir()
	require.NoError(t, CheckWorkDir(fresh, "", "r"), "a new directory")
	require.NoError(t, CheckWorkDir(filepath.Join(fresh, "not-yet"), "", "r"), "a directory Open would make")

	mine := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(mine, "logs"), 0o755))
	rj, err := json.Marshal(runJSON{Store: "postgres", Address: "postgres://h/db?run=r", Schema: DefaultSchema, Run: "r", ID: "0190a0a0-0000-7000-8000-000000000001"})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(mine, "logs", "run.json"), rj, 0o644))
	require.NoError(t, CheckWorkDir(mine, "", "r"), "this run's directory")
	err = CheckWorkDir(mine, "", "other")
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), "or, if that run is done with, remove")
	require.ErrorIs(t, CheckWorkDir(mine, "elsewhere", "r"), runstate.ErrMismatch, "another schema")

	runDir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(runDir, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(runDir, "logs", "ledger.jsonl"), nil, 0o644))
	require.ErrorIs(t, CheckWorkDir(runDir, "", "r"), runstate.ErrMismatch, "a run directory")

	fileLogs := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(fileLogs, "logs"), nil, 0o644))
	err = CheckWorkDir(fileLogs, "", "r")
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "is a regular file, not a directory")

	require.ErrorIs(t, CheckWorkDir(fresh, "", " r"), runstate.ErrInvalid, "a bad run name")
}
