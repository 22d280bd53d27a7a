package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
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

// bin is this command, built once by TestMain, for the tests that need a
// process of their own (log -follow stops on SIGINT).
var bin string

func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "runstate-pgcli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(tmp, "runstate")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(tmp)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

// testDSN is RUNSTATE_PG_DSN with a schema of the test's own (dropped at
// the end). Without a DSN the test is skipped, unless CI is set: then it
// fails.
func testDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("RUNSTATE_PG_DSN")
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set but RUNSTATE_PG_DSN is not: the PostgreSQL tests need a server (.ci/run starts one)")
		}
		t.Skip("RUNSTATE_PG_DSN is not set (e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)")
	}
	b := make([]byte, 6)
	rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "schema=" + schema
}

// address is the run address of run in the database dsn.
func address(dsn, run string) string { return dsn + "&run=" + run }

type result struct {
	out, err string
	code     int
}

// runIn runs the command in this process.
func runIn(args ...string) result {
	var out, errb bytes.Buffer
	code := cli.Run(args, &out, &errb, options())
	return result{out.String(), errb.String(), code}
}

// runBin runs the built command.
func runBin(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{out.String(), errb.String(), code}
}

var opts = runstate.Options{Request: "add tests for the billing parser", Revision: "3f2a1c9", Environment: map[string]string{"env": "staging"}}

// script is the same sequence of calls for both stores: two stages done
// with outputs, one awaiting a person, one effect unconfirmed.
func script(t *testing.T, r *runstate.Run) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, r.Plan(ctx, "inspect", "plan", "execute", "verify"))
	for _, s := range []struct {
		name   string
		inputs []runstate.Input
	}{{"inspect", nil}, {"plan", []runstate.Input{runstate.After("inspect")}}} {
		require.NoError(t, r.Do(ctx, s.name, func(ctx context.Context, st *runstate.Stage) error {
			return st.WriteFile("artifacts/"+s.name+".md", []byte("output of "+s.name+"\n"))
		}, s.inputs...))
	}
	_, err := r.Effect(ctx, "ticket:1", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, errors.New("tracker timed out")
	}})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	err = r.Do(ctx, "execute", func(context.Context, *runstate.Stage) error {
		return runstate.NeedsPerson(errors.New("the diff touches the public API"), "review the API change")
	}, runstate.After("plan"))
	require.Error(t, err)
}

// pair is one run made by script in a directory and in PostgreSQL.
type pair struct {
	dir, addr, work, dsn string
	db                   *pgstore.DB
}

func newPair(t *testing.T) *pair {
	t.Helper()
	return newPairIn(t, testDSN(t))
}

func newPairIn(t *testing.T, dsn string) *pair {
	t.Helper()
	ctx := context.Background()
	p := &pair{dir: filepath.Join(t.TempDir(), "billing"), work: filepath.Join(t.TempDir(), "work"), dsn: dsn}
	p.addr = address(p.dsn, "billing")
	o := opts
	r, err := runstate.Open(p.dir, &o)
	require.NoError(t, err)
	script(t, r)
	require.NoError(t, r.Close())

	p.db, err = pgstore.Connect(ctx, p.dsn)
	require.NoError(t, err)
	t.Cleanup(p.db.Close)
	o = opts
	r, err = p.db.Open(ctx, "billing", p.work, &o)
	require.NoError(t, err)
	script(t, r)
	require.NoError(t, r.Close())
	return p
}

var (
	reUUID = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	reTime = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	reHash = regexp.MustCompile(`[0-9a-f]{64}`)
)

// normal is a -json output with what differs between two runs of the same
// calls made equal: ids, times, hashes (the chain's, as the records hold
// times and ids), the address, the handoff's "look at" lines (where the
// store keeps the run), and the figures that depend on the bytes or the
// clock (ledger bytes, time to handoff).
func normal(t *testing.T, text string) string {
	t.Helper()
	text = reUUID.ReplaceAllString(text, "ID")
	text = reTime.ReplaceAllString(text, "TIME")
	text = reHash.ReplaceAllString(text, "HASH")
	text = reAddr.ReplaceAllString(text, "$1 ADDR")
	text = reLookAt.ReplaceAllString(text, "look at: WHERE")
	var out []string
	dec := json.NewDecoder(strings.NewReader(text))
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, text)
		b, err := json.MarshalIndent(scrub(v), "", "  ")
		require.NoError(t, err)
		out = append(out, string(b))
	}
	return strings.Join(out, "\n")
}

// scrub replaces the values of the keys that name a place or depend on
// byte counts and the clock.
func scrub(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			switch k {
			case "dir", "address", "bytes", "time_to_first_record_ns", "end", "offset", "pid", "host":
				v[k] = "X"
			default:
				v[k] = scrub(x)
			}
		}
	case []any:
		for i := range v {
			v[i] = scrub(v[i])
		}
	case string:
		return reShort.ReplaceAllString(v, "SESSION")
	}
	return v
}

// reAddr is the run's directory or address in the handoff's commands.
var reAddr = regexp.MustCompile(`(runstate (?:approve|resolve|invalidate|status|log|verify|next)) ('[^']*'|[^\s;'"\\]+)`)

// reLookAt is the handoff's last paragraph, which names where the store
// keeps the run (a directory's files; a database's commands), up to the end
// of the JSON string.
var reLookAt = regexp.MustCompile(`look at:(?:[^"\\]|\\.)*`)

// reShort is a session's short form in texts (the last 8 hex digits of
// its id), which the id regexp left.
var reShort = regexp.MustCompile(`\bsession [0-9a-f]{8}\b`)

func TestReadCommandsPrintTheDirectorysJSONForAPostgreSQLRun(t *testing.T) {
	p := newPair(t)
	for _, cmd := range [][]string{{"status", "-json"}, {"log", "-json"}, {"verify", "-json"}, {"next", "-json"}, {"metrics", "-json"}} {
		onDir := runIn(append(cmd, p.dir)...)
		onPG := runIn(append(cmd, p.addr)...)
		assert.Equal(t, onDir.code, onPG.code, "%v: exit status (stderr %s)", cmd, onPG.err)
		assert.Equal(t, normal(t, onDir.out), normal(t, onPG.out), "%v", cmd)
	}
	res := runIn("status", p.addr)
	assert.Equal(t, 3, res.code, res.err)
	assert.Contains(t, res.out, "execute (awaiting): review the API change")
	assert.Contains(t, res.out, "do: runstate approve ", "the advice names the address")
	assert.Contains(t, res.out, ".records, run billing", "the ledger line names the table")
}

func TestOperatorCommandsWriteThroughPostgreSQL(t *testing.T) {
	p := newPair(t)
	for _, addr := range []string{p.dir, p.addr} {
		res := runBin(t, "approve", addr, "execute", "-by", "alice", "-note", "intended")
		require.Equal(t, 0, res.code, res.err)
		assert.Contains(t, res.out, "approved stage execute (by alice): recorded at seq ")
		res = runBin(t, "resolve", addr, "ticket:1", "-sent", `{"issue":7}`, "-by", "bob")
		require.Equal(t, 0, res.code, res.err)
		res = runBin(t, "invalidate", addr, "plan", "-reason", "edited by hand")
		require.Equal(t, 0, res.code, res.err)
		res = runBin(t, "approve", addr, "plan", "-by", "alice")
		assert.Equal(t, 1, res.code)
		assert.Contains(t, res.err, "does not await a person")
	}
	st, err := p.db.Inspect(context.Background(), "billing")
	require.NoError(t, err)
	s, _ := st.Stage("plan")
	assert.Equal(t, runstate.StatePending, s.State, "invalidated")
	for _, cmd := range [][]string{{"status", "-json"}, {"log", "-json"}} {
		assert.Equal(t, normal(t, runIn(append(cmd, p.dir)...).out), normal(t, runIn(append(cmd, p.addr)...).out), "%v after the operator commands", cmd)
	}
}

func TestExportIsAValidLedger(t *testing.T) {
	p := newPair(t)
	res := runIn("export", p.addr)
	require.Equal(t, 0, res.code, res.err)
	st, err := p.db.Inspect(context.Background(), "billing")
	require.NoError(t, err)
	assert.Equal(t, int(st.Seq), strings.Count(res.out, "\n"))
	var log bytes.Buffer
	require.NoError(t, p.db.Export(context.Background(), "billing", &log))
	assert.Equal(t, log.String(), res.out, "the store's own export")

	dir := filepath.Join(t.TempDir(), "exported")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "ledger.jsonl"), []byte(res.out), 0o644))
	require.NoError(t, os.CopyFS(filepath.Join(dir, "artifacts"), os.DirFS(filepath.Join(p.work, "artifacts"))))
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	for _, pr := range rep.Problems {
		assert.NotContains(t, pr.File, "ledger.jsonl", "the exported ledger: %s", pr.What)
	}
	_, err = runstate.Repair(dir, nil) // the projections, from the ledger
	require.NoError(t, err)
	rep, err = runstate.Verify(dir)
	require.NoError(t, err)
	assert.Empty(t, rep.Problems)
	assert.Equal(t, st.Seq, rep.Records)
}

func TestLogFollowPrintsRecordsAnotherSessionAppends(t *testing.T) {
	p := newPair(t)
	st, err := p.db.Inspect(context.Background(), "billing")
	require.NoError(t, err)
	cmd := exec.Command(bin, "log", "-follow", "-since", fmt.Sprint(st.Seq), p.addr)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	errb := &syncBuffer{}
	cmd.Stderr = errb
	require.NoError(t, cmd.Start())
	lines := lineChan(out)
	time.Sleep(3 * pollEvery) // it has read the records so far

	o := opts
	r, err := p.db.Open(context.Background(), "billing", p.work, &o)
	require.NoError(t, err)
	require.NoError(t, r.Skip(context.Background(), "verify", "not needed"))
	require.NoError(t, r.Close())
	var got []string
	timeout := time.After(10 * time.Second)
	for len(got) < 3 {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the follower ended: %s", errb.String())
			got = append(got, l)
		case <-timeout:
			t.Fatalf("after 10 s the follower printed %q; stderr %s", got, errb.String())
		}
	}
	assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*  open `, st.Seq+1), got[0])
	assert.Regexp(t, `  skip\s+verify\s+not needed$`, got[1])
	assert.Regexp(t, `  close `, got[2])
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait(), "exit 0 on SIGINT; stderr %s", errb.String())
}

// syncBuffer is a bytes.Buffer that a process's output may fill while the
// test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestAddressErrorsSayWhatToDo(t *testing.T) {
	dsn := testDSN(t)
	res := runIn("status", address(dsn, "billing"))
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "no runstate schema", "a read command creates no schema: %s", res.err)
	res = runIn("ls", dsn)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "no runstate schema", "ls creates no schema either: %s", res.err)
	assert.NotContains(t, res.err, "no such run", "ls names no run")
	newPairIn(t, dsn) // a run named billing
	res = runIn("status", dsn)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "names no run: add ?run=NAME")

	res = runIn("status", "postgres://nobody:secret@127.0.0.1:1/none?sslmode=disable&connect_timeout=5&run=billing")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "cannot connect to 127.0.0.1:1")
	assert.NotContains(t, res.err, "secret")

	for _, cmd := range [][]string{{"status"}, {"log"}, {"verify"}, {"export"}, {"approve", "-by", "x"}} {
		args := append(cmd[:1:1], address(dsn, "typo"))
		if cmd[0] == "approve" {
			args = append(args, "execute", "-by", "x")
		}
		res = runIn(args...)
		assert.Equal(t, 1, res.code, "%v", cmd)
		assert.Contains(t, res.err, `no run "typo"`, "%v", cmd)
		assert.Contains(t, res.err, "the runs in schema t_", "%v: it names the runs there", cmd)
		assert.Contains(t, res.err, ": billing", "%v: it names the runs there", cmd)
	}
	db, err := pgstore.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Inspect(context.Background(), "typo")
	assert.Error(t, err, "approve of a run that does not exist created nothing")

	res = runIn("repair", address(dsn, "billing"))
	assert.Equal(t, 2, res.code)
	assert.Contains(t, res.err, "repair works on run directories only")
}

func TestSplitRun(t *testing.T) {
	dsn, run, err := splitRun("postgres://u@h:5432/db?sslmode=disable&run=billing%2D1&schema=s")
	require.NoError(t, err)
	assert.Equal(t, "postgres://u@h:5432/db?sslmode=disable&schema=s", dsn)
	assert.Equal(t, "billing-1", run)
	dsn, run, err = splitRun("postgres://u@h/db?run=b")
	require.NoError(t, err)
	assert.Equal(t, "postgres://u@h/db", dsn)
	assert.Equal(t, "b", run)
	_, _, err = splitRun("postgres://u@h/db?run=a&sslmode=disable&run=b")
	assert.ErrorContains(t, err, "names two runs: give run=NAME once")
	// The messages name the address without its password.
	_, _, err = splitRun("postgres://u:se/cret@h/db?sslmode=disable")
	assert.ErrorContains(t, err, "names no run")
	assert.NotContains(t, err.Error(), "cret")
	_, _, err = splitRun("postgres://u@h/db?password=secret&run=%zz")
	assert.ErrorContains(t, err, "the run parameter")
	assert.NotContains(t, err.Error(), "secret")
	_, _, err = splitRun("postgres://u:pw@h/db?run=")
	assert.ErrorContains(t, err, "postgres://u:xxxxx@h/db?run= names no run: add ?run=NAME")
	// The scheme in any case, as the command matches it: lower case for pgx.
	dsn, run, err = splitRun("PostgreSQL://u@h/db?run=b")
	require.NoError(t, err)
	assert.Equal(t, "postgresql://u@h/db", dsn)
	assert.Equal(t, "b", run)
}

// TestVerifyBlobsRehashesTheStoredOutputs: 'runstate verify -blobs ADDR'
// reads every output's bytes back from the database's blobs and fails on
// one that was altered there (plain verify cannot see it: the sizes
// hold); on a run directory -blobs changes nothing (its artifacts are
// rehashed always). A small output's bytes are in its outputs row, which
// plain verify rehashes: altered there (the row's check dropped), plain
// verify fails.
func TestVerifyBlobsRehashesTheStoredOutputs(t *testing.T) {
	p := newPair(t)
	ctx := context.Background()
	o := opts
	r, err := p.db.Open(ctx, "billing", p.work, &o)
	require.NoError(t, err)
	big := bytes.Repeat([]byte("a big output, kept in blobs\n"), 4096)
	require.NoError(t, r.Do(ctx, "big", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("out/big.txt", big)
	}))
	require.NoError(t, r.Close())
	res := runIn("verify", "-blobs", p.addr)
	require.Equal(t, 0, res.code, res.out+res.err)
	assert.Contains(t, res.out, "every output's stored bytes rehashed")
	res = runIn("verify", "-blobs", p.dir)
	assert.Equal(t, 0, res.code, res.out+res.err)

	conn, err := pgx.Connect(ctx, strings.TrimSuffix(p.dsn, "&schema="+p.db.Schema())) // pgx sends no schema parameter
	require.NoError(t, err)
	defer conn.Close(ctx)
	schema := pgx.Identifier{p.db.Schema()}.Sanitize()
	sum := sha256.Sum256(big)
	tag, err := conn.Exec(ctx, "UPDATE "+schema+`.blob_chunks SET data = overlay(data placing 'X'::bytea from 1 for 1) WHERE sha256 = $1`, sum[:])
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	res = runIn("verify", p.addr)
	assert.Equal(t, 0, res.code, "plain verify reads no blob's bytes: %s", res.out)
	res = runIn("verify", "-blobs", p.addr)
	assert.Equal(t, 1, res.code, res.out+res.err)
	assert.Contains(t, res.out, "output out/big.txt of stage big (record ")
	assert.Contains(t, res.out, "fix: no machine can restore this output from the database")
	assert.Contains(t, res.out, "FAILED: ")

	_, err = conn.Exec(ctx, "ALTER TABLE "+schema+".outputs DROP CONSTRAINT outputs_data_sum")
	require.NoError(t, err)
	tag, err = conn.Exec(ctx, "UPDATE "+schema+`.outputs SET data = overlay(data placing 'X'::bytea from 1 for 1) WHERE data = $1`, []byte("output of plan\n"))
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
	res = runIn("verify", p.addr)
	assert.Equal(t, 1, res.code, res.out+res.err)
	assert.Contains(t, res.out, "output artifacts/plan.md of stage plan (record ")
	assert.Contains(t, res.out, "the bytes in its outputs row are not the ones its sha256 and size name")
}

// TestLsListsTheRunsOfADatabase: ls on a database's address lists its
// runs as ls on a root lists run directories, with the same -json shape
// and the same figures for the same calls (each run under its address),
// what needs a person first, exit status 3 when a run is blocked; with
// run=NAME that run alone; a run that is not there a line of its own
// naming the runs that are (exit 1); a schema that is not there an error
// naming it.
func TestLsListsTheRunsOfADatabase(t *testing.T) {
	p := newPair(t) // billing: blocked (a review, an effect unconfirmed)
	ctx := context.Background()
	finished := func(r *runstate.Run, err error) {
		t.Helper()
		require.NoError(t, err)
		require.NoError(t, r.Plan(ctx, "read"))
		require.NoError(t, r.Do(ctx, "read", func(context.Context, *runstate.Stage) error { return nil }))
		require.NoError(t, r.Close())
	}
	o := runstate.Options{Request: "summarize the logs"}
	finished(runstate.Open(filepath.Join(filepath.Dir(p.dir), "logs"), &o))
	o = runstate.Options{Request: "summarize the logs"}
	finished(p.db.Open(ctx, "logs", t.TempDir(), &o))

	var lastAt = map[string]time.Time{}
	for _, name := range []string{"billing", "logs"} {
		require.NoError(t, p.db.ReadLedger(ctx, name, func(r *runstate.Record) error {
			lastAt[name] = r.At
			return nil
		}))
	}

	ls := func(args ...string) (result, []map[string]any) {
		t.Helper()
		r := runIn(append([]string{"ls", "-json"}, args...)...)
		var v []map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.out), &v), "%s\n%s", r.out, r.err)
		return r, v
	}
	dirs, dirRuns := ls(filepath.Dir(p.dir))
	pg, pgRuns := ls(p.dsn)
	assert.Equal(t, 3, dirs.code, dirs.err)
	assert.Equal(t, 3, pg.code, pg.err)
	require.Len(t, pgRuns, 2, pg.out)
	require.Len(t, dirRuns, 2, dirs.out)
	for i, name := range []string{"billing", "logs"} { // blocked first
		assert.Equal(t, p.db.Address(name), pgRuns[i]["dir"])
		lastRecord, _ := pgRuns[i]["last_record"].(string)
		at, err := time.Parse(time.RFC3339Nano, lastRecord)
		require.NoError(t, err)
		assert.True(t, at.Equal(lastAt[name]), "%s: last_record %v, the last record's time %v", name, at, lastAt[name])
		assert.GreaterOrEqual(t, pgRuns[i]["age_seconds"].(float64), 0.0)
		if b, ok := dirRuns[i]["blocker"].(map[string]any); ok { // the action names the run's address
			b["action"] = strings.Replace(b["action"].(string), dirRuns[i]["dir"].(string), "'"+p.db.Address(name)+"'", 1)
		}
		for _, k := range []string{"dir", "id", "last_record", "age_seconds"} {
			delete(pgRuns[i], k)
			delete(dirRuns[i], k)
		}
		assert.Equal(t, dirRuns[i], pgRuns[i], name)
	}
	assert.Equal(t, "blocked", pgRuns[0]["state"])
	assert.Equal(t, "finished", pgRuns[1]["state"])

	text := runIn("ls", p.dsn)
	assert.Equal(t, 3, text.code, text.err)
	lines := strings.Split(strings.TrimSpace(text.out), "\n")
	require.Len(t, lines, 3, text.out)
	assert.Regexp(t, `^DIR\s+REQUEST`, lines[0])
	assert.Regexp(t, `^`+regexp.QuoteMeta(p.db.Address("billing"))+`\s+add tests for the billing parser\s+2/4\s+blocked\s+`, lines[1])
	assert.Regexp(t, `^`+regexp.QuoteMeta(p.db.Address("logs"))+`\s+summarize the logs\s+1/1\s+finished\s+-\s+\d+s ago$`, lines[2])

	// A live session's stage: running, found by the session's lock, on the
	// connection the listed runs share.
	o = runstate.Options{Request: "a stage in progress"}
	live, err := p.db.Open(ctx, "live", t.TempDir(), &o)
	require.NoError(t, err)
	_, err = live.Begin(ctx, "crawl")
	require.NoError(t, err)
	_, liveRuns := ls(p.dsn)
	require.Len(t, liveRuns, 3)
	assert.Equal(t, p.db.Address("live"), liveRuns[1]["dir"], "blocked, then running, then finished")
	assert.Equal(t, "running", liveRuns[1]["state"])
	require.NoError(t, live.Close())
	_, liveRuns = ls(address(p.dsn, "live"))
	require.Len(t, liveRuns, 1)
	assert.Equal(t, "stopped", liveRuns[0]["state"], "its session closed: the stage was interrupted")

	one, oneRuns := ls(address(p.dsn, "logs"))
	assert.Equal(t, 0, one.code, one.err)
	require.Len(t, oneRuns, 1)
	assert.Equal(t, "finished", oneRuns[0]["state"])

	gone, goneRuns := ls(address(p.dsn, "nope"))
	assert.Equal(t, 1, gone.code, gone.err)
	require.Len(t, goneRuns, 1)
	assert.Equal(t, "error", goneRuns[0]["state"])
	assert.Contains(t, goneRuns[0]["error"], "billing, live, logs")

	empty := testDSN(t) // a schema never made
	r := runIn("ls", empty)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.err, "schema")
	assert.Contains(t, r.err, strings.TrimPrefix(empty[strings.Index(empty, "schema="):], "schema="))
	assert.Equal(t, "DIR  REQUEST  DONE  STATE  FIRST BLOCKER  LAST RECORD\n", r.out)
}

// TestDamagedRecordsAdviceOnARun: the commands on a run whose record is
// damaged say "runstate:" and the address once, and the advice they give
// quotes the address for a shell (its & would end the command) and names
// no runstate repair, which takes run directories only.
func TestDamagedRecordsAdviceOnARun(t *testing.T) {
	p := newPair(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, strings.TrimSuffix(p.dsn, "&schema="+p.db.Schema())) // pgx sends no schema parameter
	require.NoError(t, err)
	defer conn.Close(ctx)
	schema := pgx.Identifier{p.db.Schema()}.Sanitize()
	tag, err := conn.Exec(ctx, `UPDATE `+schema+`.records SET line = overlay(line placing 'X'::bytea from 20 for 1)
		WHERE seq = 3 AND run_id = (SELECT id FROM `+schema+`.runs WHERE name = 'billing')`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	_, err = conn.Exec(ctx, `DELETE FROM `+schema+`.projections`) // readers replay every record
	require.NoError(t, err)

	for _, cmd := range []string{"status", "log", "export", "next"} {
		res := runIn(cmd, p.addr)
		assert.Equal(t, 1, res.code, "%s: %s", cmd, res.err)
		assert.True(t, strings.HasPrefix(res.err, "runstate: "+p.addr+": "), "%s: %s", cmd, res.err)
		assert.NotContains(t, res.err, ": runstate: ", "%s: runstate: once", cmd)
		assert.Equal(t, 1, strings.Count(res.err, "runstate verify 'postgres://"), "%s: the advice, quoted: %s", cmd, res.err)
		assert.NotContains(t, res.err, "runstate verify postgres", "%s: an unquoted address", cmd)
		assert.NotContains(t, res.err, "repair", "%s", cmd)
	}
}

// lineChan sends the lines r yields, and closes at its end.
// follow starts 'runstate log -follow ADDRESS', its connections named
// app (application_name), and returns the process, its standard error,
// next, which returns its next line within the time given (the test fails
// when none comes, or when it ended), and its lines, closed when it ends.
func follow(t *testing.T, dsn, app string) (*exec.Cmd, *syncBuffer, func(within time.Duration) string, <-chan string) {
	t.Helper()
	cmd := exec.Command(bin, "log", "-follow", address(dsn+"&application_name="+app, "one"))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	errb := &syncBuffer{}
	cmd.Stderr = errb
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := lineChan(out)
	next := func(within time.Duration) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the follower ended: %s", errb.String())
			return l
		case <-time.After(within):
			t.Fatalf("after %v the follower printed nothing more; stderr %s", within, errb.String())
		}
		return ""
	}
	return cmd, errb, next, lines
}

func lineChan(r io.Reader) <-chan string {
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return lines
}
