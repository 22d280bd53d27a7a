package pgstore

// The fault tests through the Run API (db.Open): what a user sees.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore/internal/pgproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holding is what a stageholder reports once it holds its stage: its
// session.
type holding struct {
	Session string
}

// runArgs say where a role's run is: the DSN with its schema, the run's
// name, the role's working directory.
type runArgs struct {
	DSN, Run, Dir string
}

func (a *runArgs) where() runArgs { return *a }

// openRun decodes a role's arguments from raw into args and opens the run
// they name: it connects to the DSN and opens the run in the directory.
// closeDB closes the connection pool (the run is the role's to close, or
// not, when it plays a killed process).
func openRun(ctx context.Context, raw json.RawMessage, args interface{ where() runArgs }) (run *runstate.Run, closeDB func(), err error) {
	if err := json.Unmarshal(raw, args); err != nil {
		return nil, nil, err
	}
	a := args.where()
	db, err := Connect(ctx, a.DSN)
	if err != nil {
		return nil, nil, err
	}
	run, err = db.Open(ctx, a.Run, a.Dir, &runstate.Options{Request: "pgfault"})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return run, db.Close, nil
}

// stageHolderArgs are the stageholder role's arguments.
type stageHolderArgs struct {
	runArgs
	Stage string
}

// stageResult is what a stageholder reports after "complete".
type stageResult struct {
	Err  string
	Lost bool // errors.Is(err, runstate.ErrSessionLost)
}

func init() { roles["stageholder"] = stageHolderRole }

// stageContext is what a stageholder reports after "context": whether
// its stage's context ended with ErrSessionLost (within 10 s of asking).
type stageContext struct {
	Lost  bool
	Cause string
}

// stageHolderRole opens the run, begins Stage and reports "holding" with
// its session once Begin returned; then "complete" completes the stage
// and reports the result, and "context" waits (at most 10 s) for the
// stage's context to end and reports why.
func stageHolderRole(ctx context.Context, raw json.RawMessage, cio *childIO) error {
	var a stageHolderArgs
	run, closeDB, err := openRun(ctx, raw, &a)
	if err != nil {
		return err
	}
	defer closeDB()
	st, err := run.Begin(ctx, a.Stage)
	if err != nil {
		return err
	}
	cio.send("holding", holding{Session: run.Session()})
	for {
		switch cio.next() {
		case "complete":
			err := st.Complete()
			r := stageResult{Lost: errors.Is(err, runstate.ErrSessionLost)}
			if err != nil {
				r.Err = err.Error()
			}
			cio.send("completed", r)
		case "context":
			var c stageContext
			select {
			case <-st.Context().Done():
				cause := context.Cause(st.Context())
				c = stageContext{Lost: errors.Is(cause, runstate.ErrSessionLost), Cause: cause.Error()}
			case <-time.After(10 * time.Second):
				c.Cause = "the stage's context did not end within 10 s"
			}
			cio.send("context", c)
		case "":
			return nil
		}
	}
}

// ledger reads the run's records.
func ledger(t *testing.T, db *DB, run string) []runstate.Record {
	t.Helper()
	var recs []runstate.Record
	require.NoError(t, db.ReadLedger(context.Background(), run, func(r *runstate.Record) error {
		recs = append(recs, *r)
		return nil
	}))
	return recs
}

// completesOf counts the complete records of stage, by attempt.
func completesOf(recs []runstate.Record, stage string) map[int]int {
	n := map[int]int{}
	for _, r := range recs {
		if r.Ev == "complete" && r.Stage == stage {
			n[r.Attempt]++
		}
	}
	return n
}

// takeOver begins stage in run, polling every step while another session
// holds it (ErrBusy), up to d; it returns the stage and how long that took.
func takeOver(t *testing.T, run *runstate.Run, stage string, d, step time.Duration) (*runstate.Stage, time.Duration) {
	t.Helper()
	var st *runstate.Stage
	var err error
	took, ok := poll(d, step, func() bool {
		st, err = run.Begin(context.Background(), stage)
		return !errors.Is(err, runstate.ErrBusy)
	})
	require.True(t, ok, "%s still busy after %v", stage, took)
	require.NoError(t, err)
	return st, took
}

// checkInterrupted asserts that stage's attempt 1, begun by session h,
// was recorded interrupted naming it, and that h wrote nothing after that
// begin, its last acknowledged record (Begin had returned).
func checkInterrupted(t *testing.T, recs []runstate.Record, stage string, h holding) {
	t.Helper()
	found := false
	var begin int64
	for _, r := range recs {
		if r.Ev == "begin" && r.Stage == stage && r.Attempt == 1 {
			assert.Equal(t, h.Session, r.Session, "attempt 1 of %s is the dead session's", stage)
			begin = r.Seq
		}
		if r.Ev == "interrupted" && r.Stage == stage && r.Attempt == 1 {
			found = true
			assert.Contains(t, r.Reason, h.Session, "the interrupted record names the dead session")
		}
	}
	assert.True(t, found, "no interrupted record for %s attempt 1", stage)
	for _, r := range recs {
		if r.Session == h.Session && r.Seq > begin {
			t.Errorf("a record of the dead session after its begin (seq %d): %+v", begin, r)
		}
	}
}

// A process holding a stage is SIGKILLed: the parent's Begin got ErrBusy
// while it lived; after the kill, Begin succeeds within 5 s (polled every
// millisecond) with attempt 2, the first recorded interrupted naming the
// dead session, which left nothing after its begin. Five rounds; the
// median is logged.
func TestRunKilledHolderInterruptedWithinBound(t *testing.T) {
	dsn := withSchema(testDSN(t), newSchema(t))
	ctx := context.Background()
	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	run, err := db.Open(ctx, "run", t.TempDir(), &runstate.Options{Request: "pgfault"})
	require.NoError(t, err)
	defer run.Close()
	var lat []time.Duration
	for round := range 5 {
		stage := fmt.Sprintf("held%d", round)
		ch := startChild(t, "stageholder", stageHolderArgs{runArgs{DSN: dsn, Run: "run", Dir: t.TempDir()}, stage})
		var h holding
		ch.expect("holding", 30*time.Second, &h)
		_, err := run.Begin(ctx, stage)
		require.ErrorIs(t, err, runstate.ErrBusy, "a stage a live process holds")
		require.NoError(t, ch.cmd.Process.Kill())
		st, took := takeOver(t, run, stage, 5*time.Second, time.Millisecond)
		lat = append(lat, took)
		assert.Equal(t, 2, st.Attempt())
		require.NoError(t, st.Complete())
		ch.wait(10 * time.Second)
		checkInterrupted(t, ledger(t, db, "run"), stage, h)
	}
	slices.Sort(lat)
	t.Logf("SIGKILL -> stage interrupted and begun again: median %v (min %v, max %v, %d rounds)", lat[len(lat)/2], lat[0], lat[len(lat)-1], len(lat))
}

// proxiedDB is a DB on a new schema whose every connection goes through a
// proxy (without TLS, which the proxy cannot read), both closed when the
// test ends, and the DSN of the same schema not through the proxy.
func proxiedDB(t *testing.T) (*pgproxy.Proxy, *DB, string) {
	t.Helper()
	u, err := url.Parse(withSchema(testDSN(t), newSchema(t)))
	require.NoError(t, err)
	p, err := pgproxy.New(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	direct := u.String()
	u.Host = p.Addr()
	db, err := Connect(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return p, db, direct
}

// A connection lost around the COMMIT of a Do's complete: cut before the
// COMMIT (not committed: the batch runs again) and after it (committed, the
// reply lost): Do returns nil either way, and the stage has exactly one
// complete.
func TestRunCommitCutDoReturnsNilAndRecordsOnce(t *testing.T) {
	for _, cut := range []pgproxy.Cut{pgproxy.BeforeCommit, pgproxy.AfterCommit} {
		t.Run(cut.String(), func(t *testing.T) {
			p, db, _ := proxiedDB(t)
			ctx := context.Background()
			dir := t.TempDir()
			run, err := db.Open(ctx, "run", dir, &runstate.Options{Request: "pgfault"})
			require.NoError(t, err)
			defer run.Close()
			require.NoError(t, run.Do(ctx, "warm", func(ctx context.Context, st *runstate.Stage) error { return nil }))

			a := p.Arm(pgproxy.Rule{Cut: cut, Match: []string{`"ev":"complete"`, `"stage":"cut"`}})
			err = run.Do(ctx, "cut", func(ctx context.Context, st *runstate.Stage) error { return nil })
			require.True(t, a.Wait(time.Second), "the proxy did not cut: %q", p.Log())
			require.NoError(t, err, "Do must return nil: the complete is re-run or found committed")
			assert.Equal(t, map[int]int{1: 1}, completesOf(ledger(t, db, "run"), "cut"))
			require.NoError(t, run.Do(ctx, "after", func(ctx context.Context, st *runstate.Stage) error { return nil }), "the run goes on")
			rep, err := db.Verify(ctx, "run")
			require.NoError(t, err)
			assert.True(t, rep.OK(), "%+v", rep.Problems)
		})
	}
}
