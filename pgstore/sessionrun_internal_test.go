package pgstore

// Sessions through the Run API (db.Open), with the proxy of
// commitcut_internal_test.go between a Run and the server: a cut lock
// connection, a cut around the COMMIT of a lazy (begin) batch, an end
// record that could not be written. What the user sees: the errors, the
// stage's context, the records in the ledger, and that the run resumes in
// a new session.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore/internal/pgproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sessionOptions() *runstate.Options { return &runstate.Options{Request: "pgsession"} }

// openRunIn opens the fixture's run through db in dir, closed at the
// test's end (a second Close is a no-op).
func (f *cutFixture) openRunIn(t *testing.T, db *DB, dir string, opts *runstate.Options) *runstate.Run {
	t.Helper()
	r, err := db.Open(context.Background(), f.run, dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// isLockConn picks the session's lock connection among the proxy's.
func isLockConn(c pgproxy.Conn) bool { return c.Saw("pg_try_advisory_lock(") }

// stageEvents lists stage's records in ledger order: "ev attempt".
func stageEvents(recs []runstate.Record, stage string) []string {
	var evs []string
	for _, r := range recs {
		if r.Stage == stage {
			evs = append(evs, fmt.Sprintf("%s %d", r.Ev, r.Attempt))
		}
	}
	return evs
}

// sessionOf returns the session of stage's first record of event ev and
// attempt n, or "".
func sessionOf(recs []runstate.Record, stage, ev string, n int) string {
	for _, r := range recs {
		if r.Stage == stage && r.Ev == ev && r.Attempt == n {
			return r.Session
		}
	}
	return ""
}

// doResult is what a Do in a goroutine saw: its error, and the cause
// of its ctx's end and when it ended.
type doResult struct {
	err, cause error
	at         time.Time
}

// doUntilCancelled runs a Do of stage in run whose fn waits for its ctx
// (at most max); it returns the Stage once fn runs, and the result.
func doUntilCancelled(run *runstate.Run, stage string, max time.Duration) (*runstate.Stage, <-chan doResult) {
	running := make(chan *runstate.Stage, 1)
	res := make(chan doResult, 1)
	go func() {
		var r doResult
		r.err = run.Do(context.Background(), stage, func(ctx context.Context, st *runstate.Stage) error {
			running <- st
			select {
			case <-ctx.Done():
				r.at, r.cause = time.Now(), context.Cause(ctx)
				return r.cause
			case <-time.After(max):
				return errors.New("the stage's ctx was never cancelled")
			}
		})
		res <- r
		close(running)
	}()
	return <-running, res
}

// cutWhileRunning opens session A through the proxy (in dirA) and B
// directly, runs a Do of stage s in A that waits for its ctx, then makes
// the server unreachable for A's new connections and cuts A's lock
// connection (at cut), while A has no batch under way or due.
type cutRunning struct {
	f    *cutFixture
	dirA string
	a, b *runstate.Run
	stA  *runstate.Stage
	res  <-chan doResult
	cut  time.Time
}

func cutWhileRunning(t *testing.T) *cutRunning {
	t.Helper()
	c := &cutRunning{f: newCutFixture(t), dirA: t.TempDir()}
	c.a = c.f.openRunIn(t, c.f.db, c.dirA, sessionOptions())
	c.b = c.f.openRunIn(t, c.f.direct, t.TempDir(), sessionOptions())
	c.stA, c.res = doUntilCancelled(c.a, "s", time.Minute)
	require.NotNil(t, c.stA, "A's Do did not run its stage")
	// Past the handoff's lag (50 ms after a begin), so that no batch of
	// A's is due: A's pinger alone finds the cut.
	time.Sleep(300 * time.Millisecond)
	c.f.proxy.Refuse(true)
	c.cut = time.Now()
	require.Equal(t, 1, c.f.proxy.CutWhere(isLockConn), "A's lock connection")
	return c
}

// The lock connection of session A is cut while A runs a stage in Do, and
// A cannot reconnect; session B finds A gone and takes the stage over
// (interrupted, attempt 2). When A can reach the server again, its pinger
// finds the record naming it gone and gives up: the ctx of A's stage is
// cancelled with ErrSessionLost within pingEvery and a round trip, A's Run
// is read-only, attempt 2 completes once, and a new session of A resumes
// the run. (Before: A's stage ran on with a live ctx beside B's.)
func TestRunLockConnectionCutTakenOverCancelsTheStage(t *testing.T) {
	c := cutWhileRunning(t)
	f, a, b, dirA, stA, res, cut := c.f, c.a, c.b, c.dirA, c.stA, c.res, c.cut
	ctx := context.Background()
	stB, took := takeOver(t, b, "s", 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 2, stB.Attempt())
	back := time.Now()
	f.proxy.Refuse(false)
	var r doResult
	select {
	case r = <-res:
	case <-time.After(15 * time.Second):
		t.Fatal("A's stage ctx was not cancelled within 15 s of the server being reachable again")
	}
	lostIn := r.at.Sub(back)
	t.Logf("B took the stage over %v after the cut; A's stage ctx cancelled %v after A could reach the server again (%v after the cut)",
		took.Round(time.Millisecond), lostIn.Round(time.Millisecond), r.at.Sub(cut).Round(time.Millisecond))
	assert.ErrorIs(t, r.cause, runstate.ErrSessionLost)
	assert.ErrorIs(t, r.err, runstate.ErrSessionLost, "Do returns the cause")
	assert.Less(t, lostIn, pingEvery+3*time.Second, "bound: the next ping (pingEvery) and one re-hold round trip, with slack for a loaded machine")
	assert.ErrorIs(t, context.Cause(stA.Context()), runstate.ErrSessionLost)
	_, err := a.Begin(ctx, "t")
	assert.ErrorIs(t, err, runstate.ErrReadOnly)
	assert.ErrorIs(t, err, runstate.ErrSessionLost)

	require.NoError(t, stB.Complete())
	recs := ledger(t, f.direct, f.run)
	assert.Equal(t, []string{"begin 1", "interrupted 1", "begin 2", "complete 2"}, stageEvents(recs, "s"))
	assert.Equal(t, a.Session(), sessionOf(recs, "s", "begin", 1))
	assert.Equal(t, b.Session(), sessionOf(recs, "s", "complete", 2))
	for _, rec := range recs {
		if rec.Session == a.Session() && rec.Ev != "open" && rec.Ev != "create" {
			assert.Equal(t, "begin", rec.Ev, "A wrote nothing after its begin: %+v", rec)
		}
	}
	assert.ErrorIs(t, a.Close(), runstate.ErrReadOnly)

	// A new session in A's directory resumes the run.
	a2 := f.openRunIn(t, f.db, dirA, sessionOptions())
	require.NoError(t, a2.Do(ctx, "s", func(context.Context, *runstate.Stage) error {
		t.Error("s is done: Do must not run it again")
		return nil
	}))
	require.NoError(t, a2.Do(ctx, "t", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, a2.Close())
}

// The lock connection is cut and the server stays unreachable for the
// session (no takeover): the session is lost once it held no lock for
// lostAfter since its last good ping, and not before (a lock connection
// down for a moment must not stop a stage). Its stage's ctx is cancelled
// with ErrSessionLost then; another session can take the stage over at
// once (the lost session's lock is freed), and a new session of the lost
// one's directory resumes.
func TestRunLockConnectionUnreachableLosesTheSessionAfterLostAfter(t *testing.T) {
	c := cutWhileRunning(t)
	f, a, b, dirA, stA, res, cut := c.f, c.a, c.b, c.dirA, c.stA, c.res, c.cut
	ctx := context.Background()
	var r doResult
	select {
	case r = <-res:
	case <-time.After(lostAfter + 15*time.Second):
		t.Fatalf("A's stage ctx was not cancelled within lostAfter (%v) + 15 s of the cut", lostAfter)
	}
	lostIn := r.at.Sub(cut)
	t.Logf("lock connection cut, server unreachable: stage ctx cancelled after %v (lostAfter %v, pingEvery %v)",
		lostIn.Round(time.Millisecond), lostAfter, pingEvery)
	assert.ErrorIs(t, r.cause, runstate.ErrSessionLost)
	// The last good ping was at most pingEvery before the cut, and a
	// loaded machine may delay a tick by as much again.
	assert.GreaterOrEqual(t, lostIn, lostAfter-2*pingEvery, "lost before lostAfter since the last good ping")
	assert.Less(t, lostIn, lostAfter+pingEvery+3*time.Second, "bound: lostAfter + pingEvery + a failed reconnect")
	assert.ErrorIs(t, context.Cause(stA.Context()), runstate.ErrSessionLost)

	stB, took := takeOver(t, b, "s", 10*time.Second, 5*time.Millisecond)
	t.Logf("B took the stage over %v after A's stage ctx was cancelled", took.Round(time.Millisecond))
	require.NoError(t, stB.Complete())
	recs := ledger(t, f.direct, f.run)
	assert.Equal(t, []string{"begin 1", "interrupted 1", "begin 2", "complete 2"}, stageEvents(recs, "s"))
	assert.ErrorIs(t, a.Close(), runstate.ErrSessionLost)
	f.proxy.Refuse(false)
	a2 := f.openRunIn(t, f.db, dirA, sessionOptions())
	require.NoError(t, a2.Do(ctx, "t", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, a2.Close())
}

// The lock connection is cut while a stage runs and the server is
// reachable: the session takes its lock again, the stage's ctx stays live,
// and the stage completes, one begin and one complete; another session
// finds the stage busy throughout.
func TestRunLockConnectionCutReheldStageCompletes(t *testing.T) {
	f := newCutFixture(t)
	a := f.openRunIn(t, f.db, t.TempDir(), sessionOptions())
	cutDuringStage(t, f, a)
}

// The same after the session recorded an effect unconfirmed itself (its
// Do failed): a record that names the session as its writer, not as gone,
// does not keep it from taking its lock again. (It did: the session was
// lost, and the stage left running.)
func TestRunLockConnectionCutReheldAfterItsOwnUnconfirmedRecord(t *testing.T) {
	f := newCutFixture(t)
	a := f.openRunIn(t, f.db, t.TempDir(), sessionOptions())
	_, err := a.Effect(context.Background(), "ticket:1", runstate.Effect{
		Do: func(context.Context, string) (json.RawMessage, error) { return nil, errors.New("POST timed out") },
	})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	cutDuringStage(t, f, a)
}

// cutDuringStage cuts a's lock connection while a runs stage s, and checks
// that a takes its lock again and completes the stage.
func cutDuringStage(t *testing.T, f *cutFixture, a *runstate.Run) {
	t.Helper()
	ctx := context.Background()
	b := f.openRunIn(t, f.direct, t.TempDir(), sessionOptions())
	err := a.Do(ctx, "s", func(ctx context.Context, st *runstate.Stage) error {
		var old int
		for _, c := range f.proxy.Conns() {
			if isLockConn(c) {
				old = c.ID
			}
		}
		require.Equal(t, 1, f.proxy.CutWhere(isLockConn))
		waitFor(t, 10*time.Second, func() bool {
			for _, c := range f.proxy.Conns() {
				if isLockConn(c) && c.ID != old {
					return true
				}
			}
			return false
		}, "a new lock connection")
		// The proxy sees the new connection's pg_try_advisory_lock when
		// the session sends it, before the server runs it (and the old
		// backend may still hold the lock until the server sees the cut):
		// wait for the lock itself.
		waitFor(t, 10*time.Second, func() bool {
			live, err := f.direct.Store(f.run).Live(ctx, []string{a.Session()})
			require.NoError(t, err)
			return live[a.Session()]
		}, "the lock is held again")
		_, err := b.Begin(ctx, "s")
		assert.ErrorIs(t, err, runstate.ErrBusy, "the stage is A's while A holds its lock again")
		assert.NoError(t, ctx.Err(), "the stage's ctx is live: the session was not lost")
		return st.WriteFile("out.txt", []byte("done"))
	})
	require.NoError(t, err)
	recs := ledger(t, f.direct, f.run)
	assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(recs, "s"))
	require.NoError(t, a.Close())
}

// The COMMIT of a Begin's lazy batch (synchronous_commit off) is cut, before
// it reaches the server, after the server committed, or right after it was
// sent (a race): Begin returns the stage, the store resolves the outcome
// (re-run, or found committed), and
// the stage completes: exactly one begin and one complete, and the next
// session finds the stage done.
func TestRunLazyBeginCommitCut(t *testing.T) {
	for _, cut := range []pgproxy.Cut{pgproxy.BeforeCommit, pgproxy.AfterCommit, pgproxy.AfterCommitSent} {
		t.Run(cut.String(), func(t *testing.T) {
			f := newCutFixture(t)
			ctx := context.Background()
			dir := t.TempDir()
			a := f.openRunIn(t, f.db, dir, sessionOptions())
			armed := f.proxy.Arm(pgproxy.Rule{Cut: cut, Match: []string{`"ev":"begin"`, `"stage":"cut-me"`}})
			st, err := a.Begin(ctx, "cut-me")
			require.True(t, armed.Wait(5*time.Second), "the proxy did not cut: %q", f.proxy.Log())
			require.NoError(t, err)
			require.NoError(t, st.Context().Err())
			require.NoError(t, st.WriteFile("out.txt", []byte("x")))
			require.NoError(t, st.Complete())
			recs := ledger(t, f.direct, f.run)
			assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(recs, "cut-me"))
			require.NoError(t, a.Close())
			a2 := f.openRunIn(t, f.db, dir, sessionOptions())
			require.NoError(t, a2.Do(ctx, "cut-me", func(context.Context, *runstate.Stage) error {
				t.Error("cut-me is done: Do must not run it again")
				return nil
			}))
		})
	}
}

// The COMMIT of a Begin's lazy batch is cut before it reaches the server,
// and another session appends before this one can reach the server again:
// the batch cannot be re-run (the run moved), so the begin is not
// recorded. The Run turns read-only; Begin, whose batch it was, returns
// that error (a begin that another goroutine's batch carried would come
// back as a Stage whose context is already cancelled, cause ErrReadOnly):
// the ledger does not say the stage runs, so another session may begin it.
// A new session runs the stage, one begin and one complete. (Before: Begin
// returned a live Stage, and its work went on with a live context.)
func TestRunLazyBeginCommitCutNotRerunStopsTheStage(t *testing.T) {
	f := newCutFixture(t)
	ctx := context.Background()
	dir := t.TempDir()
	a := f.openRunIn(t, f.db, dir, sessionOptions())
	b := f.openRunIn(t, f.direct, t.TempDir(), sessionOptions())
	f.proxy.Refuse(false)
	armed := f.proxy.Arm(pgproxy.Rule{Cut: pgproxy.BeforeCommit, Match: []string{`"ev":"begin"`, `"stage":"cut-me"`}, Refuse: true})
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		select {
		case <-armed.Fired():
		case <-time.After(10 * time.Second):
			t.Error("the proxy did not cut the begin's batch")
			return
		}
		// The proxy refuses the commit check since the cut (Refuse).
		assert.NoError(t, b.Do(ctx, "other", func(context.Context, *runstate.Stage) error { return nil }))
		f.proxy.Refuse(false)
	}()
	st, err := a.Begin(ctx, "cut-me")
	<-moved
	if err == nil {
		select {
		case <-st.Context().Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the stage's context was not cancelled: its begin is not recorded")
		}
		assert.ErrorIs(t, context.Cause(st.Context()), runstate.ErrReadOnly)
		assert.ErrorIs(t, st.Complete(), runstate.ErrReadOnly)
	} else {
		assert.ErrorIs(t, err, runstate.ErrReadOnly)
		assert.Contains(t, err.Error(), "open the run again")
	}
	recs := ledger(t, f.direct, f.run)
	assert.Empty(t, stageEvents(recs, "cut-me"), "the begin was not recorded")
	assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(recs, "other"))
	assert.ErrorIs(t, a.Close(), runstate.ErrReadOnly)

	a2 := f.openRunIn(t, f.db, dir, sessionOptions())
	require.NoError(t, a2.Do(ctx, "cut-me", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, a2.Close())
	assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(ledger(t, f.direct, f.run), "cut-me"))
}

// A Do's Complete cannot take the run's head row within LockTimeout
// (another transaction holds it): Do fails, nothing recorded. The next Do
// of the stage in the same Run records attempt 1 as interrupted, naming
// why, and runs attempt 2. (Before: ErrBusy, "attempt 1 is running in this
// session", for every later Do of the stage.)
func TestRunDoAfterAnEndRecordThatCouldNotBeWrittenBeginsTheNextAttempt(t *testing.T) {
	f := newCutFixture(t)
	ctx := context.Background()
	opts := sessionOptions()
	// Short, as the holder below keeps the row until Do fails; not so short
	// that the Open's own batches miss it on a loaded machine (300 ms did:
	// "timed out waiting for the ledger lock" from Open, no holder yet).
	opts.LockTimeout = 2 * time.Second
	a := f.openRunIn(t, f.direct, t.TempDir(), opts)
	var id string
	require.NoError(t, f.direct.pool.QueryRow(ctx, f.direct.sql(`SELECT id::text FROM {s}.runs WHERE name = $1`), f.run).Scan(&id))
	holder, err := f.direct.pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	err = a.Do(ctx, "s", func(context.Context, *runstate.Stage) error {
		_, err := holder.Exec(ctx, f.direct.sql(`SELECT 1 FROM {s}.runs WHERE id = $1 FOR UPDATE`), id)
		return err
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, runstate.ErrLockTimeout)
	require.NoError(t, holder.Rollback(ctx))

	runs := 0
	require.NoError(t, a.Do(ctx, "s", func(_ context.Context, st *runstate.Stage) error {
		runs++
		assert.Equal(t, 2, st.Attempt())
		return nil
	}), "the next Do ends attempt 1 and runs attempt 2")
	assert.Equal(t, 1, runs)
	recs := ledger(t, f.direct, f.run)
	assert.Equal(t, []string{"begin 1", "interrupted 1", "begin 2", "complete 2"}, stageEvents(recs, "s"))
	for _, r := range recs {
		if r.Ev == "interrupted" {
			assert.Contains(t, r.Reason, "its end record could not be written in session "+a.Session())
		}
	}
	require.NoError(t, a.Close())
}
