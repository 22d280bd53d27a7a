package runstatetest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

func TestMain(m *testing.M) {
	runstatetest.Register("suite", childPipeline)
	runstatetest.Register("fail", func(context.Context, string) error { return errors.New("boom") })
	runstatetest.Main(m)
}

func ledgerRecords(t testing.TB, dir string) []*runstate.Record {
	t.Helper()
	var recs []*runstate.Record
	require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error {
		recs = append(recs, r)
		return nil
	}))
	return recs
}

func nextStepsSeq(t testing.TB, dir string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(data), "as of ledger seq ")
	require.True(t, ok, "next-steps.txt names no seq:\n%s", data)
	seq, _, _ := strings.Cut(after, " ")
	return seq
}

func TestCrashLeavesASessionThatLooksDead(t *testing.T) {
	runstatetest.CheckLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	run, err := runstate.Open(dir, &runstate.Options{Request: "crash"})
	require.NoError(t, err)
	_, err = run.Begin(ctx, "build")
	require.NoError(t, err)
	session := run.Session()
	runstatetest.Crash(run)
	runstatetest.Crash(run) // twice is fine

	_, err = run.Begin(ctx, "other")
	assert.ErrorIs(t, err, runstate.ErrClosed)
	assert.NoError(t, run.Close(), "Close after a crash: nothing to do")
	recs := ledgerRecords(t, dir)
	last := recs[len(recs)-1]
	assert.Equal(t, "begin", last.Ev, "a crash writes no close record")
	assert.FileExists(t, filepath.Join(dir, "logs", "sessions", session+".lock"), "a killed process leaves its session lock file")

	// The next session finds the begun stage interrupted and may begin it.
	run, err = runstate.Open(dir, &runstate.Options{Request: "crash"})
	require.NoError(t, err)
	st, err := run.Status()
	require.NoError(t, err)
	s, _ := st.Stage("build")
	assert.Equal(t, runstate.StateInterrupted, s.State)
	stage, err := run.Begin(ctx, "build")
	require.NoError(t, err)
	require.NoError(t, stage.Complete())
	require.NoError(t, run.Close())
	assert.NoFileExists(t, filepath.Join(dir, "logs", "sessions", session+".lock"), "the next Open removes a dead session's lock file")
}

// closeCounter is a Store that counts its Close calls.
type closeCounter struct {
	runstate.Store
	closes atomic.Int32
}

func (c *closeCounter) Close(clean bool) error {
	c.closes.Add(1)
	return c.Store.Close(clean)
}

// TestCrashClosesTheStoreOnce: Store.Close is called once (Store says
// so), also when a crashed or closed Run is crashed again.
func TestCrashClosesTheStoreOnce(t *testing.T) {
	ctx := context.Background()
	opts := &runstate.Options{Request: "crash once"}
	for _, closeFirst := range []bool{false, true} {
		dir := t.TempDir()
		s := &closeCounter{Store: runstate.NewFileStore(dir, opts)}
		run, err := runstate.OpenStore(s, dir, opts)
		require.NoError(t, err)
		_, err = run.Begin(ctx, "build")
		require.NoError(t, err)
		if closeFirst {
			require.NoError(t, run.Close())
		}
		runstatetest.Crash(run)
		runstatetest.Crash(run)
		assert.NoError(t, run.Close())
		assert.Equal(t, int32(1), s.closes.Load(), "Store.Close calls (closed first: %v)", closeFirst)
	}
}

// crashOnce runs the suite pipeline in dir with the trap at, and checks
// that it crashed there.
func crashOnce(t *testing.T, dir string, rv *receiver, opts *runstate.Options, at runstatetest.At) {
	t.Helper()
	run, err := runstate.Open(dir, opts)
	require.NoError(t, err)
	trap := runstatetest.CrashAt(run, at)
	err = suitePipeline(newSender(rv.srv.URL), acker{}, 0)(context.Background(), run)
	require.ErrorIs(t, err, runstatetest.ErrCrashed)
	require.True(t, trap.Fired())
	assert.Equal(t, at.Skip+1, trap.Crossings())
	_, err = run.Status()
	require.ErrorIs(t, err, runstate.ErrClosed, "the crashed run is closed")
}

// resume runs the suite pipeline to the end in dir.
func resume(t *testing.T, dir string, rv *receiver, opts *runstate.Options) {
	t.Helper()
	run, err := runstate.Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, suitePipeline(newSender(rv.srv.URL), acker{}, 0)(context.Background(), run))
	require.NoError(t, run.Close())
}

func TestCrashPoints(t *testing.T) {
	runstatetest.CheckLeaks(t)
	rv := newReceiver(t)
	// A manifest written only on Open and Close, so that "between the
	// projections" is visible.
	opts := &runstate.Options{Request: suiteReq, ManifestInterval: time.Hour}
	ref := t.TempDir()
	resume(t, ref, rv, opts)

	t.Run("after-begin", func(t *testing.T) {
		dir := t.TempDir()
		crashOnce(t, dir, rv, opts, runstatetest.At{Point: runstatetest.AfterBegin, Name: "report"})
		recs := ledgerRecords(t, dir)
		last := recs[len(recs)-1]
		assert.Equal(t, "begin", last.Ev)
		assert.Equal(t, "report", last.Stage)
		assert.NoFileExists(t, filepath.Join(dir, "artifacts", "report.md"), "the stage's work never ran")
		resume(t, dir, rv, opts)
		f := runstatetest.CheckResumed(t, dir, ref)
		assert.Equal(t, 1, f.Metrics.Interrupted)
	})
	t.Run("after-complete", func(t *testing.T) {
		dir := t.TempDir()
		crashOnce(t, dir, rv, opts, runstatetest.At{Point: runstatetest.AfterComplete, Name: "part/2"})
		recs := ledgerRecords(t, dir)
		last := recs[len(recs)-1]
		assert.Equal(t, "complete", last.Ev)
		assert.Equal(t, "part/2", last.Stage)
		assert.NotEqual(t, last.Seq, nextStepsSeq(t, dir), "next-steps.txt is not written yet")
		// The next Open rebuilds the projections; the stage is not redone.
		run, err := runstate.Open(dir, opts)
		require.NoError(t, err)
		st, err := run.Status()
		require.NoError(t, err)
		assert.Equal(t, st.Seq, mustAtoi(t, nextStepsSeq(t, dir)), "Open rewrote next-steps.txt")
		s, _ := st.Stage("part/2")
		assert.Equal(t, runstate.StateComplete, s.State)
		require.NoError(t, run.Close())
		resume(t, dir, rv, opts)
		runstatetest.CheckResumed(t, dir, ref)
	})
	t.Run("between-projections", func(t *testing.T) {
		dir := t.TempDir()
		crashOnce(t, dir, rv, opts, runstatetest.At{Point: runstatetest.BetweenProjections, Name: "fetch", Skip: 1})
		recs := ledgerRecords(t, dir)
		last := recs[len(recs)-1]
		assert.Equal(t, "complete", last.Ev, "the second batch about fetch is its complete")
		assert.Equal(t, "fetch", last.Stage)
		assert.Equal(t, last.Seq, mustAtoi(t, nextStepsSeq(t, dir)), "next-steps.txt is current")
		rep, err := runstate.Verify(dir)
		require.NoError(t, err)
		assert.True(t, hasProblem(rep, "manifest.json"), "manifest.json is behind: %v", rep.Problems)
		resume(t, dir, rv, opts)
		runstatetest.CheckResumed(t, dir, ref)
	})
	t.Run("after-intent", func(t *testing.T) {
		dir := t.TempDir()
		crashOnce(t, dir, rv, opts, runstatetest.At{Point: runstatetest.AfterIntent, Name: "ticket"})
		recs := ledgerRecords(t, dir)
		last := recs[len(recs)-1]
		assert.Equal(t, "intent", last.Ev)
		id := runID(t, dir)
		filed, _ := rv.deliveries(id)
		assert.Equal(t, 0, filed, "Do was not called")
		resume(t, dir, rv, opts)
		runstatetest.CheckResumed(t, dir, ref)
		filed, resends := rv.deliveries(id)
		assert.Equal(t, 2, filed, "ticket and notify, once each")
		assert.Zero(t, resends)
	})
	t.Run("after-do", func(t *testing.T) {
		dir := t.TempDir()
		crashOnce(t, dir, rv, opts, runstatetest.At{Point: runstatetest.AfterDo, Name: "notify"})
		recs := ledgerRecords(t, dir)
		last := recs[len(recs)-1]
		assert.Equal(t, "intent", last.Ev, "the confirm is not written")
		id := runID(t, dir)
		filed, _ := rv.deliveries(id)
		assert.Equal(t, 2, filed, "the receiving system has it")
		resume(t, dir, rv, opts)
		runstatetest.CheckResumed(t, dir, ref)
		filed, resends := rv.deliveries(id)
		assert.Equal(t, 2, filed)
		assert.Zero(t, resends, "Check found it: not sent again")
		var confirms []string
		for _, r := range ledgerRecords(t, dir) {
			if r.Ev == "confirm" && r.Key == "notify" {
				confirms = append(confirms, r.Note)
			}
		}
		assert.Equal(t, []string{"confirmed by Check"}, confirms)
	})
}

func mustAtoi(t testing.TB, s string) int64 {
	t.Helper()
	var n int64
	for _, c := range s {
		require.True(t, c >= '0' && c <= '9', "not a number: %q", s)
		n = n*10 + int64(c-'0')
	}
	return n
}

func hasProblem(rep *runstate.Report, file string) bool {
	for _, p := range rep.Problems {
		if strings.HasSuffix(p.File, file) {
			return true
		}
	}
	return false
}

func runID(t testing.TB, dir string) string {
	t.Helper()
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	return st.ID
}

func TestCrashEverywhere(t *testing.T) {
	runstatetest.CheckLeaks(t)
	rv := newReceiver(t)
	sum := runstatetest.CrashEverywhere(t, suiteOptions(), suitePipeline(newSender(rv.srv.URL), acker{}, 0))
	t.Logf("crossings %v: %d crashes, %d resumed correctly", sum.Crossings, sum.Crashes, sum.Resumed)
	assert.Equal(t, len(suiteStages()), sum.Crossings[runstatetest.AfterBegin])
	assert.Equal(t, len(suiteStages()), sum.Crossings[runstatetest.AfterComplete])
	assert.Equal(t, 2, sum.Crossings[runstatetest.AfterIntent])
	assert.Equal(t, 2, sum.Crossings[runstatetest.AfterDo])
	assert.Greater(t, sum.Crossings[runstatetest.BetweenProjections], 2*len(suiteStages()))
	total := 0
	for _, n := range sum.Crossings {
		total += n
	}
	assert.Equal(t, total, sum.Crashes)
	assert.Equal(t, sum.Crashes, sum.Resumed)
	rv.mu.Lock()
	defer rv.mu.Unlock()
	assert.Len(t, rv.sends, 2*(sum.Crashes+1), "two effects filed per run")
	for k, n := range rv.sends {
		assert.Equal(t, 1, n, "effect %s sent %d times", k, n)
	}
}

func TestCrashAtNeedsARun(t *testing.T) {
	assert.Panics(t, func() { runstatetest.CrashAt(nil, runstatetest.At{Point: runstatetest.AfterBegin}) })
	p, err := runstatetest.ParsePoint("after-do")
	require.NoError(t, err)
	assert.Equal(t, runstatetest.AfterDo, p)
	_, err = runstatetest.ParsePoint("nowhere")
	assert.Error(t, err)
}

// TestCrashAtErrorNamesTheCrossing: the error of a call that crossed an
// armed point names the point, and the stage or key when the crossing has
// one, with no trailing space. A batch with no stage (Plan) read
// "... (simulated): between-projections ".
func TestCrashAtErrorNamesTheCrossing(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		want string
		call func(r *runstate.Run) error
	}{
		{"between-projections", func(r *runstate.Run) error { return r.Plan(ctx, "a", "b") }},
		{"after-begin a", func(r *runstate.Run) error { _, err := r.Begin(ctx, "a"); return err }},
	} {
		r, err := runstate.Open(t.TempDir(), &runstate.Options{Request: "crash message", NoSync: true})
		require.NoError(t, err)
		p, err := runstatetest.ParsePoint(strings.Fields(c.want)[0])
		require.NoError(t, err)
		runstatetest.CrashAt(r, runstatetest.At{Point: p})
		err = c.call(r)
		require.ErrorIs(t, err, runstatetest.ErrCrashed)
		assert.True(t, strings.HasSuffix(err.Error(), "(simulated): "+c.want), "%q", err.Error())
		require.NoError(t, r.Close())
	}
}
