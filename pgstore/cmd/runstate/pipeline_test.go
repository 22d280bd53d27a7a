package main

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
	"github.com/runstate/runstate/cli"
	"github.com/runstate/runstate/pgstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pipelineScript is a bash pipeline's command lines on the run at where
// (a run directory, or a working directory of a run in PostgreSQL, with
// at: "-at", ADDRESS on the first). sent is a file each send of the
// effect appends a line to. It returns each command's result.
func pipelineScript(t *testing.T, where, sent string, at ...string) []result {
	t.Helper()
	sh := func(script string) []string { return []string{"--", "sh", "-c", script} }
	lines := [][]string{
		append([]string{"plan", where, "-request", "ship the parser", "inspect", "build", "review", "notify", "docs"}, at...),
		append([]string{"exec", where, "inspect", "-out", filepath.Join(where, "notes.txt")}, sh(`echo "notes of inspect" > "$RUNSTATE_DIR/notes.txt"`)...),
		append([]string{"exec", where, "build", "-after", "inspect", "-out", filepath.Join(where, "build.txt")}, sh(`tr a-z A-Z < "$RUNSTATE_DIR/notes.txt" > "$RUNSTATE_DIR/build.txt"`)...),
		append([]string{"effect", where, "notify", "-payload", `{"to":"team"}`}, sh(`echo sent >> "`+sent+`"; echo '{"message":7}'`)...),
		{"skip", where, "docs", "-reason", "no user-facing change"},
		{"await", where, "review", "-reason", "read the diff", "-after", "build"},
	}
	var res []result
	for _, args := range lines {
		res = append(res, runIn(args...))
	}
	return res
}

// The pipeline commands (plan, exec, effect, skip, await) work on a run in
// PostgreSQL through a working directory: -at ADDRESS names the run the
// first time (with -request it creates the run, and the schema), the
// directory's logs/run.json after. The same command lines give the same
// exit statuses, the same status -json and the same records as on a run
// directory. A second working directory, another machine's, finds the
// first's -after outputs there byte for byte, skips what was done, gets
// the effect's receipt without sending it again, and a person's approve
// completes the review there.
func TestPipelineCommandsWorkOnAPostgreSQLRun(t *testing.T) {
	dsn := testDSN(t) // a schema that does not exist yet
	addr := address(dsn, "ship")
	dir := filepath.Join(t.TempDir(), "run")
	w1, w2 := filepath.Join(t.TempDir(), "w1"), filepath.Join(t.TempDir(), "w2")
	sentDir, sentPG := filepath.Join(t.TempDir(), "sent"), filepath.Join(t.TempDir(), "sent")

	onDir := pipelineScript(t, dir, sentDir)
	onPG := pipelineScript(t, w1, sentPG, "-at", addr)
	for i := range onDir {
		assert.Equal(t, onDir[i].code, onPG[i].code, "command %d: exit status (stderr %s)", i, onPG[i].err)
		assert.Equal(t, strings.ReplaceAll(onDir[i].out, " in "+dir+")", " in WHERE)"), reIn.ReplaceAllString(onPG[i].out, " in WHERE)"), "command %d: output", i)
	}
	assert.Equal(t, 122, onPG[5].code, "await: the review awaits a person")
	assert.Contains(t, onPG[0].out, "planned 5 stage(s): inspect, build, review, notify, docs (ledger seq ")
	assert.Contains(t, onPG[0].out, " in "+cli.Redact(addr)+")", "plan names the address")
	assert.Equal(t, "{\"message\":7}\n", onPG[3].out, "effect prints the receipt")
	for _, cmd := range [][]string{{"status", "-json"}, {"log", "-json"}} {
		assert.Equal(t, normal(t, runIn(append(cmd, dir)...).out), normal(t, runIn(append(cmd, addr)...).out), "%v", cmd)
	}
	assert.Equal(t, normal(t, runIn("status", "-json", dir).out), normal(t, runIn("status", "-json", w1).out), "status of the working directory reads the run")

	// ls of the directory that holds w1 names the run's address, without
	// reading it; ls of the address reads it: the run directory's line.
	lsOf := func(root string, code int) map[string]any {
		res := runIn("ls", "-json", root)
		assert.Equal(t, code, res.code, res.err)
		var runs []map[string]any
		require.NoError(t, json.Unmarshal([]byte(res.out), &runs), res.out)
		require.Len(t, runs, 1, res.out)
		return runs[0]
	}
	onWork := lsOf(filepath.Dir(w1), 0)
	assert.Equal(t, w1, onWork["dir"])
	assert.Equal(t, "elsewhere", onWork["state"])
	require.Contains(t, onWork["address"], "run=ship")
	onDirLs, onPGLs := lsOf(filepath.Dir(dir), 3), lsOf(onWork["address"].(string), 3)
	for _, k := range []string{"request", "done", "planned", "state", "seq"} {
		assert.Equal(t, onDirLs[k], onPGLs[k], "ls: %s", k)
	}
	assert.Equal(t, normal(t, mustJSON(t, onDirLs["blocker"])), normal(t, mustJSON(t, onPGLs["blocker"])), "ls: blocker")

	// The records are in the database, the files in w1: no ledger there.
	assert.NoFileExists(t, filepath.Join(w1, "logs", "ledger.jsonl"))
	assert.FileExists(t, filepath.Join(w1, "exec", "inspect.stdout"))
	db, err := pgstore.ConnectReadOnly(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	st, err := db.Inspect(context.Background(), "ship")
	require.NoError(t, err)
	assert.Equal(t, "ship the parser", st.Request)
	s, _ := st.Stage("build")
	assert.Equal(t, runstate.StateComplete, s.State)

	// Another machine: w2, named once with -at, by its logs/run.json after.
	res := runIn("exec", w2, "inspect", "-at", addr, "--", "sh", "-c", "echo ran >> "+filepath.Join(t.TempDir(), "never"))
	require.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.err, "runstate exec: inspect: skipped: ")
	res = runIn("exec", w2, "test", "-after", "build", "-out", filepath.Join(w2, "test.txt"), "--", "sh", "-c", `cat "$RUNSTATE_DIR/build.txt" > "$RUNSTATE_DIR/test.txt"`)
	require.Equal(t, 0, res.code, res.err)
	got, err := os.ReadFile(filepath.Join(w2, "test.txt"))
	require.NoError(t, err)
	assert.Equal(t, "NOTES OF INSPECT\n", string(got), "build's output, made in w1, is in w2 byte for byte")
	res = runIn("effect", w2, "notify", "-payload", `{"to":"team"}`, "--", "sh", "-c", `echo sent >> "`+sentPG+`"; echo '{"message":8}'`)
	require.Equal(t, 0, res.code, res.err)
	assert.Equal(t, "{\"message\":7}\n", res.out, "the stored receipt")
	sends, err := os.ReadFile(sentPG)
	require.NoError(t, err)
	assert.Equal(t, "sent\n", string(sends), "the effect was sent once, from w1")

	res = runIn("approve", w2, "review", "-by", "ann")
	require.Equal(t, 0, res.code, res.err)
	res = runIn("await", w2, "review", "-reason", "read the diff", "-after", "build")
	assert.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.err, "runstate await: review: approved")
	res = runIn("verify", addr)
	assert.Equal(t, 0, res.code, res.out+res.err)
}

// mustJSON is v as JSON.
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// runOne makes run "one" (Request "the first run") in a schema of the
// test's own, with its working directory w, and returns the schema's DSN
// and a DB on it, closed at the test's end.
func runOne(t *testing.T) (dsn string, db *pgstore.DB, w string) {
	t.Helper()
	dsn = testDSN(t)
	db, err := pgstore.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	w = filepath.Join(t.TempDir(), "w")
	r, err := db.Open(context.Background(), "one", w, &runstate.Options{Request: "the first run"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	return dsn, db, w
}

// reIn is the address in a pipeline command's "(ledger seq N in ADDRESS)".
var reIn = regexp.MustCompile(` in postgres://[^)\s]*\)`)

// The pipeline commands refuse, before anything is recorded, what would
// lose or mix records: a run that is not there without -request (nothing
// is made, not even the run's name), an address given as DIR, -at with a
// run directory, and a working directory of another run.
func TestPipelineCommandsOnPostgreSQLRefuseWhatIsNotTheirs(t *testing.T) {
	dsn, db, w := runOne(t)
	ctx := context.Background()

	res := runIn("exec", filepath.Join(t.TempDir(), "new"), "build", "-at", address(dsn, "missing"), "--", "true")
	assert.Equal(t, 2, res.code, res.err)
	assert.Contains(t, res.err, `holds no run "missing" in schema `)
	assert.Contains(t, res.err, "the runs in schema ")
	assert.Contains(t, res.err, ": one")
	assert.Contains(t, res.err, "give -request TEXT to create it")
	names, err := db.Runs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"one"}, names, "no run was made")

	res = runIn("plan", address(dsn, "one"), "a")
	assert.Equal(t, 2, res.code)
	assert.Contains(t, res.err, "is an address, not a directory: plan writes its files in DIR")
	assert.Contains(t, res.err, "with -at ")

	runDir := filepath.Join(t.TempDir(), "run")
	f, err := runstate.Open(runDir, &runstate.Options{Request: "a run in files", NoSync: true})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	res = runIn("plan", runDir, "a", "-at", address(dsn, "one"))
	assert.Equal(t, 2, res.code)
	assert.Contains(t, res.err, runDir+" is a run directory (its logs/ledger.jsonl holds a run's records)")

	res = runIn("plan", w, "a", "-at", address(dsn, "two"), "-request", "the second run")
	assert.Equal(t, 125, res.code, res.err)
	assert.Contains(t, res.err, "is the working directory of another run")
	names, err = db.Runs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"one"}, names, "no run was made")

	res = runIn("plan", w, "a", "-request", "another request")
	assert.Equal(t, 125, res.code, res.err)
	assert.Contains(t, res.err, "run identity mismatch")

	res = runIn("plan", w, "a")
	assert.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.out, "planned 1 stage(s): a (ledger seq ")
}

// The refusals that come before anything connects or is written (found
// in review): a working directory of another run, given -at another
// run's address in a schema that does not exist, refused before Connect
// would create it (and without -request, with the mismatch, not "give
// -request"); the same run on the same server under another host name,
// which is no refusal; a logs that is a symbolic link out of the directory
// or a file (nothing made outside, no
// run's row). A schema that is not there, and a run's row that an Open
// refused before its first record left, are "no run": exit 2, saying
// to give -request.
func TestPipelineCommandsOnPostgreSQLRefuseBeforeWriting(t *testing.T) {
	dsn, db, w := runOne(t)
	ctx := context.Background()
	pc := adminConn(t)
	schemaExists := func(name string) bool {
		var n int
		require.NoError(t, pc.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", name).Scan(&n))
		return n == 1
	}
	// A schema that does not exist: the test's own, with a suffix.
	freshSchema := db.Schema() + "_fresh"
	fresh := strings.Replace(dsn, "schema="+db.Schema(), "schema="+freshSchema, 1)
	require.NotEqual(t, dsn, fresh)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), os.Getenv("RUNSTATE_PG_DSN"))
		if err == nil {
			_, err = c.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{freshSchema}.Sanitize()+" CASCADE")
			c.Close(context.Background())
		}
		if err != nil {
			t.Errorf("drop schema %s: %v", freshSchema, err)
		}
	})

	for _, request := range []string{"the second run", ""} {
		res := runIn("plan", w, "a", "-at", address(fresh, "two"), "-request", request)
		assert.Equal(t, 125, res.code, res.err)
		assert.Contains(t, res.err, `is the working directory of another run`)
		assert.Contains(t, res.err, `names run "one"`)
		assert.Contains(t, res.err, "or, if that run is done with, remove "+filepath.Join(w, "logs", "run.json"))
		assert.NotContains(t, res.err, "give -request")
		assert.False(t, schemaExists(freshSchema), "no schema was made")
	}

	// The same server under another name is the same run (its id says
	// so).
	require.Contains(t, dsn, "@127.0.0.1:", "the test's server is on 127.0.0.1")
	res := runIn("plan", w, "a", "-at", strings.Replace(address(dsn, "one"), "@127.0.0.1:", "@localhost:", 1), "-request", "the first run")
	assert.Equal(t, 0, res.code, res.err)
	res = runIn("exec", filepath.Join(t.TempDir(), "n"), "a", "-at", address(fresh, "x"), "--", "true")
	assert.Equal(t, 2, res.code, res.err)
	assert.Contains(t, res.err, "to create the run there (and pgstore's tables in schema "+freshSchema+"), give -request TEXT")
	assert.False(t, schemaExists(freshSchema), "no schema was made")

	// A runs row without a record: an Open refused for want of a Request.
	_, err := runstate.OpenStore(db.Store("ghost"), t.TempDir(), &runstate.Options{})
	require.ErrorIs(t, err, runstate.ErrInvalid)
	res = runIn("exec", filepath.Join(t.TempDir(), "g"), "a", "-at", address(dsn, "ghost"), "--", "true")
	assert.Equal(t, 2, res.code, res.err)
	assert.Contains(t, res.err, `holds no run "ghost"`)
	assert.Contains(t, res.err, "give -request TEXT to create it")

	for _, kind := range []string{"link", "file"} {
		dir := filepath.Join(t.TempDir(), kind)
		require.NoError(t, os.Mkdir(dir, 0o755))
		outside := filepath.Join(t.TempDir(), "outside")
		require.NoError(t, os.Mkdir(outside, 0o755))
		if kind == "link" {
			require.NoError(t, os.Symlink(outside, filepath.Join(dir, "logs")))
		} else {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "logs"), nil, 0o644))
		}
		res = runIn("plan", dir, "a", "-at", address(dsn, "logs-"+kind), "-request", "r")
		assert.Equal(t, 2, res.code, res.err)
		res2 := runIn("plan", dir, "a", "-at", address(fresh, "logs-"+kind), "-request", "r")
		assert.Equal(t, 2, res2.code, res2.err)
		assert.False(t, schemaExists(freshSchema), "no schema was made for a directory that is refused")
		want := "is a regular file, not a directory"
		if kind == "link" {
			want = "is a symbolic link"
		}
		assert.Contains(t, res.err, want)
		assert.Contains(t, res2.err, want)
		entries, err := os.ReadDir(outside)
		require.NoError(t, err)
		assert.Empty(t, entries, "nothing made outside the working directory")
		var rows int
		require.NoError(t, pc.QueryRow(ctx, "SELECT count(*) FROM "+db.Schema()+".runs WHERE name = $1", "logs-"+kind).Scan(&rows))
		assert.Zero(t, rows, "no run's row")
	}
}

// adminConn is a connection to the tests' server (RUNSTATE_PG_DSN), closed
// at the test's end.
func adminConn(t *testing.T) *pgx.Conn {
	t.Helper()
	pc, err := pgx.Connect(context.Background(), os.Getenv("RUNSTATE_PG_DSN"))
	require.NoError(t, err)
	t.Cleanup(func() { pc.Close(context.Background()) })
	return pc
}

// withDB is dsn (a URL) with its database replaced by name.
func withDB(t *testing.T, dsn, name string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

// A working directory's run (its logs/run.json names it, with its id) is
// looked for at the address given: where it is not (another database, or
// its schema or run dropped), the command is refused with nothing
// written, not even a schema upgraded: without -request exit 2, saying
// to remove logs/run.json to make the run anew or to give its address;
// with -request exit 125 (it would make the run anew, with another id).
// An older schema is upgraded by -request when the directory's run is in
// it or the directory is new, and without -request the advice says so.
func TestPipelineCommandsOnPostgreSQLFindTheDirectorysRun(t *testing.T) {
	dsn, db, w := runOne(t)
	ctx := context.Background()
	pc := adminConn(t)
	otherDB := "t_other_" + strings.TrimPrefix(db.Schema(), "t_")
	_, err := pc.Exec(ctx, "CREATE DATABASE "+otherDB)
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), os.Getenv("RUNSTATE_PG_DSN"))
		if err == nil {
			_, err = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+otherDB+" WITH (FORCE)")
			c.Close(context.Background())
		}
		if err != nil {
			t.Errorf("drop database %s: %v", otherDB, err)
		}
	})
	oc, err := pgx.Connect(ctx, withDB(t, os.Getenv("RUNSTATE_PG_DSN"), otherDB))
	require.NoError(t, err)
	defer oc.Close(ctx)
	version := func(schema string) int {
		var v int
		err := oc.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+pgx.Identifier{schema}.Sanitize()+".schema_version").Scan(&v)
		if err != nil {
			return -1 // no schema
		}
		return v
	}
	other := withDB(t, address(dsn, "one"), otherDB) // same schema name, another database
	refused := func(code int, what string, args ...string) {
		t.Helper()
		res := runIn(args...)
		assert.Equal(t, code, res.code, "%v: %s", args, res.err)
		assert.Contains(t, res.err, what, args)
		assert.Contains(t, res.err, `names run "one" (id `, args)
		assert.Contains(t, res.err, "remove "+filepath.Join(w, "logs", "run.json"), args)
	}

	// No schema there.
	refused(2, "holds no schema "+db.Schema(), "exec", w, "a", "-at", other, "--", "true")
	refused(125, "-request would create the run anew here, with another id", "exec", w, "a", "-at", other, "-request", "the first run", "--", "true")
	assert.Equal(t, -1, version(db.Schema()), "no schema was made")

	// The schema there, not the run.
	odb, err := pgstore.Connect(ctx, withDB(t, dsn, otherDB))
	require.NoError(t, err)
	odb.Close()
	refused(2, `holds no run "one" in schema `, "exec", w, "a", "-at", other, "--", "true")
	refused(125, `holds no run "one" in schema `, "exec", w, "a", "-at", other, "-request", "the first run", "--", "true")
	odb, err = pgstore.ConnectReadOnly(ctx, withDB(t, dsn, otherDB))
	require.NoError(t, err)
	names, err := odb.Runs(ctx)
	odb.Close()
	require.NoError(t, err)
	assert.Empty(t, names, "no run was made there")

	// An older schema there (version 3: migration 0004 undone).
	_, err = oc.Exec(ctx, strings.ReplaceAll(`DROP INDEX {s}.outputs_inline;
		ALTER TABLE {s}.outputs DROP CONSTRAINT outputs_data_sum, DROP CONSTRAINT outputs_blob_fkey, DROP COLUMN blob, DROP COLUMN data;
		ALTER TABLE {s}.outputs ADD CONSTRAINT outputs_sha256_fkey FOREIGN KEY (sha256) REFERENCES {s}.blobs;
		DELETE FROM {s}.schema_version WHERE version = 4`, "{s}", pgx.Identifier{db.Schema()}.Sanitize()))
	require.NoError(t, err)
	require.Equal(t, 3, version(db.Schema()))
	refused(125, `holds no run "one" in schema `, "exec", w, "a", "-at", other, "-request", "the first run", "--", "true")
	assert.Equal(t, 3, version(db.Schema()), "not upgraded for a directory that is refused")
	res := runIn("exec", filepath.Join(t.TempDir(), "new"), "a", "-at", withDB(t, address(dsn, "new"), otherDB), "--", "true")
	assert.Equal(t, 125, res.code, res.err)
	assert.Contains(t, res.err, "a pipeline command upgrades it when given -request TEXT")
	assert.Equal(t, 3, version(db.Schema()))
	res = runIn("exec", filepath.Join(t.TempDir(), "new"), "a", "-at", withDB(t, address(dsn, "new"), otherDB), "-request", "a new run", "--", "true")
	assert.Equal(t, 0, res.code, res.err)
	assert.Equal(t, pgstore.SchemaVersion, version(db.Schema()), "upgraded by -request")

	// The run's schema dropped at the address the directory names.
	w2 := filepath.Join(t.TempDir(), "w2")
	gone := strings.Replace(dsn, "schema="+db.Schema(), "schema="+db.Schema()+"_gone", 1)
	res = runIn("plan", w2, "a", "-at", address(gone, "one"), "-request", "the first run")
	require.Equal(t, 0, res.code, res.err)
	_, err = pc.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{db.Schema() + "_gone"}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	res = runIn("exec", w2, "a", "--", "true")
	assert.Equal(t, 2, res.code, res.err)
	assert.Contains(t, res.err, "holds no schema "+db.Schema()+"_gone")
	assert.Contains(t, res.err, "if that run is gone, remove "+filepath.Join(w2, "logs", "run.json")+" and give -request TEXT to create it anew")
}

// waitFile waits up to a minute (a busy machine) for path to exist.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within a minute", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Two machines (working directories, each command a process of its own)
// share one run through the built command: while one's exec runs a
// stage, the other's is refused as busy (exit 121, its command not run),
// and once it completes the other skips it. An exec SIGKILLed in the
// middle of a stage leaves the attempt to the next session, which records
// it interrupted: the other machine's exec runs the stage again, saying
// why. One complete record per stage; the run verifies.
func TestPipelineCommandsShareARunAcrossMachines(t *testing.T) {
	dsn := testDSN(t)
	addr := address(dsn, "fleet")
	tmp := t.TempDir()
	w1, w2 := filepath.Join(tmp, "w1"), filepath.Join(tmp, "w2")
	never := filepath.Join(tmp, "never")
	res := runBin(t, "plan", "-at", addr, w1, "-request", "a fleet pipeline", "slow", "killed")
	require.Equal(t, 0, res.code, res.err)

	started, gate := filepath.Join(tmp, "started"), filepath.Join(tmp, "gate")
	m1 := exec.Command(bin, "exec", w1, "slow", "-out", filepath.Join(w1, "slow.txt"), "--", "sh", "-c",
		`touch "$1"; while [ ! -e "$2" ]; do sleep 0.02; done; echo slow > "$RUNSTATE_DIR/slow.txt"`, "sh", started, gate)
	var m1err strings.Builder
	m1.Stderr = &m1err
	require.NoError(t, m1.Start())
	waitFile(t, started)
	res = runBin(t, "exec", "-at", addr, w2, "slow", "--", "sh", "-c", `echo ran >> "$1"`, "sh", never)
	assert.Equal(t, 121, res.code, "busy: %s", res.err)
	assert.Contains(t, res.err, "running in a live session")
	require.NoError(t, os.WriteFile(gate, nil, 0o644))
	require.NoError(t, m1.Wait(), m1err.String())
	res = runBin(t, "exec", w2, "slow", "--", "sh", "-c", `echo ran >> "$1"`, "sh", never)
	require.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.err, "runstate exec: slow: skipped: ")
	assert.NoFileExists(t, never, "no command ran on w2")
	got, err := os.ReadFile(filepath.Join(w2, "slow.txt"))
	require.NoError(t, err, "slow's output, made on w1, is on w2")
	assert.Equal(t, "slow\n", string(got))

	// A stage that needs one running on the other machine waits for it
	// (-wait), then runs with its output, put in this machine's directory.
	started, gate = filepath.Join(tmp, "started3"), filepath.Join(tmp, "gate3")
	m1 = exec.Command(bin, "exec", w1, "fetch", "-out", filepath.Join(w1, "fetch.txt"), "--", "sh", "-c",
		`touch "$1"; while [ ! -e "$2" ]; do sleep 0.02; done; echo fetched > "$RUNSTATE_DIR/fetch.txt"`, "sh", started, gate)
	require.NoError(t, m1.Start())
	waitFile(t, started)
	buildErr := filepath.Join(tmp, "build.stderr")
	ef, err := os.Create(buildErr)
	require.NoError(t, err)
	defer ef.Close()
	var buildOut strings.Builder
	m2 := exec.Command(bin, "exec", w2, "build", "-after", "fetch", "-wait", "60s", "--", "sh", "-c", `cat "$RUNSTATE_DIR/fetch.txt"`)
	m2.Stdout, m2.Stderr = &buildOut, ef
	require.NoError(t, m2.Start())
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(buildErr)
		require.NoError(t, err)
		if strings.Contains(string(data), "build needs fetch, which is running") {
			break
		}
		require.True(t, time.Now().Before(deadline), "build did not say it waits: %s", data)
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, os.WriteFile(gate, nil, 0o644))
	require.NoError(t, m1.Wait())
	require.NoError(t, m2.Wait(), "build on w2")
	assert.Equal(t, "fetched\n", buildOut.String(), "fetch's output, made on w1, is in w2 when build runs")

	started = filepath.Join(tmp, "started2")
	m1 = exec.Command(bin, "exec", w1, "killed", "--", "sh", "-c", `touch "$1"; exec sleep 120`, "sh", started)
	require.NoError(t, m1.Start())
	waitFile(t, started)
	require.NoError(t, m1.Process.Signal(syscall.SIGKILL))
	_ = m1.Wait()
	killed := time.Now()
	// The killed session's advisory lock is free once the server has seen
	// its connection close: until then the stage is busy (121, nothing
	// recorded), and -wait tries again.
	res = runBin(t, "exec", w2, "killed", "-wait", "30s", "-out", filepath.Join(w2, "killed.txt"), "--", "sh", "-c", `echo again > "$RUNSTATE_DIR/killed.txt"`)
	require.Equal(t, 0, res.code, res.err)
	t.Logf("the stage ran again on w2 %v after the SIGKILL on w1", time.Since(killed).Round(time.Millisecond))
	assert.Contains(t, res.err, "runstate exec: killed: running (attempt 2): ")
	assert.Contains(t, res.err, "interrupted")

	db, err := pgstore.ConnectReadOnly(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	completes := map[string]int{}
	var interrupted int
	require.NoError(t, db.ReadLedger(context.Background(), "fleet", func(r *runstate.Record) error {
		switch r.Ev {
		case "complete":
			completes[r.Stage]++
		case "interrupted":
			interrupted++
		}
		return nil
	}))
	assert.Equal(t, map[string]int{"slow": 1, "fetch": 1, "build": 1, "killed": 1}, completes)
	assert.Equal(t, 1, interrupted, "the killed attempt")
	res = runIn("verify", addr)
	assert.Equal(t, 0, res.code, res.out+res.err)
}

// The read commands on a working directory read its own run only: a run
// at its address under its name with another id than its logs/run.json
// names (the run dropped and made again) is refused, naming both ids and
// the address to read it by; the file's own id reads the run. (The ids
// are the file's, edited: the same to the command as a run made anew.)
func TestReadCommandsOnAWorkingDirectoryReadItsOwnRunOnly(t *testing.T) {
	dsn, db, w := runOne(t)
	st, err := db.Inspect(context.Background(), "one")
	require.NoError(t, err)
	rj := filepath.Join(w, "logs", "run.json")
	data, err := os.ReadFile(rj)
	require.NoError(t, err)
	require.Contains(t, string(data), `"id": "`+st.ID+`"`)
	var named struct{ Address string }
	require.NoError(t, json.Unmarshal(data, &named))
	res := runIn("status", w)
	assert.Equal(t, 0, res.code, res.err)

	other := "01a2534f-e542-7cb0-a39b-4613af689c86"
	require.NoError(t, os.WriteFile(rj, []byte(strings.Replace(string(data), st.ID, other, 1)), 0o644))
	for _, cmd := range []string{"status", "log", "verify", "next", "metrics", "export"} {
		res := runIn(cmd, w)
		assert.Equal(t, 1, res.code, "%s: %s", cmd, res.err)
		assert.Empty(t, res.out, cmd)
		assert.Contains(t, res.err, rj+" names run id "+other+" at "+named.Address+" for the working directory "+w, cmd)
		assert.Contains(t, res.err, "the run of that name there is another one (id "+st.ID+")", cmd)
		assert.Contains(t, res.err, "give its address (runstate status '"+named.Address+"')", cmd)
	}
	res = runIn("status", address(dsn, "one"))
	assert.Equal(t, 0, res.code, "by its address the run is read: %s", res.err)
}

// A fleet's second machine without -at on its first command: the
// refusal says to give -at, not only -request (which would start a run
// in files beside the shared one), and nothing is made.
func TestExecOnANewDirectoryWithoutAtSaysToGiveIt(t *testing.T) {
	w := filepath.Join(t.TempDir(), "w")
	res := runIn("exec", w, "build", "--", "true")
	assert.Equal(t, 2, res.code, res.err)
	assert.Contains(t, res.err, "holds no run ("+filepath.Join(w, "logs", "ledger.jsonl")+"); give -request TEXT to create one; or, for a run kept elsewhere (PostgreSQL: made by another machine), give -at ADDRESS")
	_, err := os.Stat(w)
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing was made")
}
