package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readView reads a file of a working directory's view.
func readView(t *testing.T, dir, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
	require.NoError(t, err, "the working directory has %s", rel)
	return string(data)
}

// manifestSeq is the seq and run id a manifest.json names.
func manifestSeq(t *testing.T, text string) (int64, string) {
	t.Helper()
	var m struct {
		ID  string `json:"id"`
		Seq int64  `json:"seq"`
	}
	require.NoError(t, json.Unmarshal([]byte(text), &m), text)
	return m.Seq, m.ID
}

// TestWorkDirHoldsTheMachinesView: a PostgreSQL run's working directory
// has logs/next-steps.txt, manifest.json and logs/run.json as a run
// directory has its projections: after Close they say what the database
// says (DB.NextSteps, DB.Inspect), name the run's address, and each
// machine's directory shows its own session's view.
func TestWorkDirHoldsTheMachinesView(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	opts := &runstate.Options{Request: "views"}
	addr := "'" + db.Address("r") + "'" // quoted for a shell: it has an &

	a, err := db.Open(ctx, "r", dirA, opts)
	require.NoError(t, err)
	require.NoError(t, a.Plan(ctx, "make", "use"))
	require.NoError(t, a.Do(ctx, "make", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("out/made.txt", []byte("made\n"))
	}))
	require.NoError(t, a.Close())
	nextA, err := db.NextSteps(ctx, "r")
	require.NoError(t, err)
	stA, err := db.Inspect(ctx, "r")
	require.NoError(t, err)

	handoffA := readView(t, dirA, "logs/next-steps.txt")
	assert.Equal(t, nextA, handoffA, "machine A's handoff is the database's as A left it")
	assert.Contains(t, handoffA, "runstate status "+addr)
	seq, id := manifestSeq(t, readView(t, dirA, "manifest.json"))
	assert.Equal(t, stA.Seq, seq, "manifest.json is as of A's last record")
	assert.Equal(t, stA.ID, id)

	var rj runJSON
	runFile := readView(t, dirA, "logs/run.json")
	require.NoError(t, json.Unmarshal([]byte(runFile), &rj))
	assert.Contains(t, runFile, `"address": "`+db.Address("r")+`"`, "the address as it is, for cat")
	assert.Equal(t, runJSON{Store: "postgres", Address: db.Address("r"), Schema: db.schema, Run: "r", ID: stA.ID}, rj)

	b, err := db.Open(ctx, "r", dirB, opts)
	require.NoError(t, err)
	require.NoError(t, b.Do(ctx, "use", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("out/used.txt", []byte("used\n"))
	}, runstate.After("make")))
	require.NoError(t, b.Close())
	nextB, err := db.NextSteps(ctx, "r")
	require.NoError(t, err)
	stB, err := db.Inspect(ctx, "r")
	require.NoError(t, err)
	require.Greater(t, stB.Seq, stA.Seq)

	assert.Equal(t, nextB, readView(t, dirB, "logs/next-steps.txt"), "machine B's handoff is the database's as B left it")
	seq, _ = manifestSeq(t, readView(t, dirB, "manifest.json"))
	assert.Equal(t, stB.Seq, seq)
	assert.Equal(t, handoffA, readView(t, dirA, "logs/next-steps.txt"), "machine A's directory keeps A's view")
	seq, _ = manifestSeq(t, readView(t, dirA, "manifest.json"))
	assert.Equal(t, stA.Seq, seq)
	tmp, err := os.ReadDir(filepath.Join(dirB, "logs", "tmp"))
	require.NoError(t, err)
	assert.Empty(t, tmp, "no temp file is left")
}

// TestWorkDirViewKeepsUpWhileRunning: while a session runs, its working
// directory's handoff follows its records within viewsEvery (the
// operator's cat logs/next-steps.txt), not only at Close.
func TestWorkDirViewKeepsUpWhileRunning(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	r, err := db.Open(ctx, "r", dir, &runstate.Options{Request: "views"})
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Plan(ctx, "one", "two"))
	require.NoError(t, r.Do(ctx, "one", func(context.Context, *runstate.Stage) error { return nil }))
	want, err := r.NextSteps()
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second) // viewsEvery, on a loaded machine
	var got string
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
		if got = string(data); got == want {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	assert.Equal(t, want, got, "the working directory's handoff is the session's")
	assert.Contains(t, got, "one complete")
}

// TestRunHandoffNamesTheDatabasesPlaces: the handoff a PostgreSQL run's
// session renders and publishes names the run by its address, and its
// "look at:" lines name the records table and the commands on the
// address, not a run directory's logs/ledger.jsonl nor the working
// directory; it is the text DB.NextSteps renders.
func TestRunHandoffNamesTheDatabasesPlaces(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	r, err := db.Open(ctx, "billing", dir, &runstate.Options{Request: "handoff"})
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Plan(ctx, "a"))
	text, err := r.NextSteps()
	require.NoError(t, err)
	addr := "'" + db.Address("billing") + "'" // quoted for a shell: it has an &
	look := text[strings.Index(text, "\nlook at:")+1:]
	assert.Equal(t, "look at:  table "+db.schema+".records, run billing (the source of truth, one ledger line a row; runstate export writes a logs/ledger.jsonl)\n"+
		"          logs/next-steps.txt, manifest.json in a machine's working directory: that session's view, as of the seq they name\n"+
		"          runstate status "+addr+"; runstate log "+addr+"\n", look)
	assert.NotContains(t, text, dir)
	fromDB, err := db.NextSteps(ctx, "billing")
	require.NoError(t, err)
	assert.Equal(t, fromDB, text)
}

// TestKilledViewWriteLeavesNoLitter: a temp file that a killed view write
// left in logs/tmp (older than a minute) is removed by the next Open in
// that directory; a fresh one, which may be another live session's write
// under way, is left alone.
func TestKilledViewWriteLeavesNoLitter(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	tmp := filepath.Join(dir, "logs", "tmp")
	require.NoError(t, os.MkdirAll(tmp, 0o755))
	old, fresh := filepath.Join(tmp, "view-0123456789abcdef"), filepath.Join(tmp, "view-fedcba9876543210")
	require.NoError(t, os.WriteFile(old, []byte("runstate handoff: ..."), 0o644))
	require.NoError(t, os.WriteFile(fresh, []byte("runstate handoff: ..."), 0o644))
	long := time.Now().Add(-2 * time.Minute)
	require.NoError(t, os.Chtimes(old, long, long))
	r, err := db.Open(ctx, "r", dir, &runstate.Options{Request: "litter"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	_, err = os.Stat(old)
	assert.ErrorIs(t, err, os.ErrNotExist, "the killed write's temp file is gone")
	_, err = os.Stat(fresh)
	assert.NoError(t, err, "a fresh temp file is left to its writer")
}

// TestSharedWorkDirKeepsTheNewestView: in a working directory that two
// sessions share, a session whose write comes late (its timer fired after
// the other's) does not put its older view over the other's newer one.
func TestSharedWorkDirKeepsTheNewestView(t *testing.T) {
	dir := t.TempDir()
	a, err := newViews(dir)
	require.NoError(t, err)
	b, err := newViews(dir)
	require.NoError(t, err)
	page := func(seq int64) []byte {
		return []byte(fmt.Sprintf("runstate handoff: run x, as of ledger seq %d (2026-12-01T17:00:00Z)\nrequest:  r\n", seq))
	}
	a.wrote = time.Now()                                             // A's timer waits viewsEvery
	a.keep(runstate.Position{Seq: 8}, []byte(`{"seq": 8}`), page(8)) // armed, not yet written
	b.keep(runstate.Position{Seq: 10}, []byte(`{"seq": 10}`), page(10))
	b.close(true) // B's view is written first
	a.close(true) // then A's, late
	assert.Equal(t, string(page(10)), readView(t, dir, "logs/next-steps.txt"), "B's newer handoff stays")
	assert.Equal(t, `{"seq": 10}`, readView(t, dir, "manifest.json"), "and its manifest")

	c, err := newViews(dir)
	require.NoError(t, err)
	c.keep(runstate.Position{Seq: 11}, nil, page(11))
	c.close(true)
	assert.Equal(t, string(page(11)), readView(t, dir, "logs/next-steps.txt"), "a newer view replaces it")
}

// TestOpenStoreWorkDirHasTheViews: a Run opened with
// runstate.OpenStore(db.Store(name), dir, opts) leaves the working
// directory DB.Open leaves: logs/next-steps.txt and manifest.json as the
// database has them after Close, and logs/run.json naming the run's
// address, which runstate.RunElsewhere (the command's and the file
// store's reader) finds.
func TestOpenStoreWorkDirHasTheViews(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	r, err := runstate.OpenStore(db.Store("r"), dir, &runstate.Options{Request: "views"})
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "make", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("out/made.txt", []byte("made\n"))
	}))
	id := r.ID()
	require.NoError(t, r.Close())
	next, err := db.NextSteps(ctx, "r")
	require.NoError(t, err)
	st, err := db.Inspect(ctx, "r")
	require.NoError(t, err)

	assert.Equal(t, next, readView(t, dir, "logs/next-steps.txt"), "the handoff is the database's as the session left it")
	seq, mid := manifestSeq(t, readView(t, dir, "manifest.json"))
	assert.Equal(t, st.Seq, seq, "manifest.json is as of the session's last record")
	assert.Equal(t, id, mid)
	var rj runJSON
	require.NoError(t, json.Unmarshal([]byte(readView(t, dir, "logs/run.json")), &rj))
	assert.Equal(t, runJSON{Store: "postgres", Address: db.Address("r"), Schema: db.schema, Run: "r", ID: id}, rj)
	addr, ok := runstate.RunElsewhere(dir)
	assert.True(t, ok, "the working directory names where the run is")
	assert.Equal(t, db.Address("r"), addr)
	_, err = runstate.Open(dir, &runstate.Options{Request: "views"})
	assert.ErrorIs(t, err, runstate.ErrMismatch, "runstate.Open refuses the working directory, as for DB.Open's")

	// Both ways give the same files, resumed in one directory.
	r, err = db.Open(ctx, "r", dir, nil)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	viaOpen, err := db.NextSteps(ctx, "r")
	require.NoError(t, err)
	assert.Equal(t, viaOpen, readView(t, dir, "logs/next-steps.txt"))
}

// TestOpenStoreRefusesAnotherRequestNamingTheRun: a run name that exists
// with another Request is refused with runstate.ErrMismatch, and the same
// error, through DB.Open and through runstate.OpenStore(db.Store(name),
// dir, opts): it names the run in the database and says to use another
// run, not the working directory ("use another directory"), which is not
// where the run is.
func TestOpenStoreRefusesAnotherRequestNamingTheRun(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "first"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	dir := t.TempDir()
	_, viaOpen := db.Open(ctx, "r", dir, &runstate.Options{Request: "second"})
	_, viaStore := runstate.OpenStore(db.Store("r"), dir, &runstate.Options{Request: "second"})
	for what, err := range map[string]error{"DB.Open": viaOpen, "OpenStore": viaStore} {
		require.ErrorIs(t, err, runstate.ErrMismatch, what)
		assert.Contains(t, err.Error(), `run "r" in schema `+db.schema, what)
		assert.Contains(t, err.Error(), `serves request "first", not "second": use another run for other work`, what)
		assert.NotContains(t, err.Error(), dir, what)
	}
	assert.Equal(t, viaOpen.Error(), viaStore.Error(), "both ways say the same")
	st, err := db.Inspect(ctx, "r")
	require.NoError(t, err)
	assert.Equal(t, "first", st.Request)
}

// TestBusySessionRendersTheHandoffAtItsPace: a session that completes
// stages faster than its projections are written renders the handoff
// about once per viewsEvery, not once per complete (runstate.Pacer);
// once it goes idle, with no batch after, the database's projections row
// and the working directory's logs/next-steps.txt both show its newest
// state; and a clean Close leaves the final state in both.
func TestBusySessionRendersTheHandoffAtItsPace(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	st := db.Store("r").(*store)
	r, err := runstate.OpenStore(st, dir, &runstate.Options{Request: "pace"})
	require.NoError(t, err)
	defer r.Close()
	gave := func() int {
		st.pub.mu.Lock()
		defer st.pub.mu.Unlock()
		return st.pub.gave
	}
	rowHandoff := func() string {
		var handoff string
		_ = db.pool.QueryRow(ctx, db.sql(`SELECT handoff FROM {s}.projections WHERE run_id = $1`), st.runID).Scan(&handoff)
		return handoff
	}

	const n = 100
	before, start := gave(), time.Now()
	for i := range n {
		require.NoError(t, r.Do(ctx, fmt.Sprintf("s%d", i), func(context.Context, *runstate.Stage) error { return nil }))
	}
	elapsed, renders := time.Since(start), gave()-before
	t.Logf("%d completes in %v: %d handoffs rendered", n, elapsed, renders)
	// One a viewsEvery for the views, and one or two a handoffEvery for
	// the database (it renders until the next commit takes one), however
	// slow the machine: each complete rendered one before.
	bound := int(elapsed/viewsEvery) + 2*int(elapsed/handoffEvery) + 4
	assert.LessOrEqual(t, renders, bound, "at most one handoff per viewsEvery (and per handoffEvery)")

	want, err := r.NextSteps()
	require.NoError(t, err)
	require.Contains(t, want, fmt.Sprintf("s%d complete", n-1))
	deadline := time.Now().Add(handoffEvery + 10*time.Second) // on a loaded machine
	for time.Now().Before(deadline) && (rowHandoff() != want || readView(t, dir, viewHandoff) != want) {
		time.Sleep(20 * time.Millisecond)
	}
	assert.Equal(t, want, rowHandoff(), "the database's handoff catches up with an idle session")
	assert.Equal(t, want, readView(t, dir, viewHandoff), "the working directory's handoff catches up with an idle session")

	require.NoError(t, r.Close())
	final, err := db.NextSteps(ctx, "r")
	require.NoError(t, err)
	assert.Equal(t, final, rowHandoff(), "a clean Close leaves the final handoff in the database")
	assert.Equal(t, final, readView(t, dir, viewHandoff), "and in the working directory")
}
