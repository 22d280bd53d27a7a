package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of begins sent ahead while a session has the run alone
// (ahead.go, session.go).

// waitAlone waits until st's session has the run alone (its pinger tries
// every pingEvery), at most d.
func waitAlone(t testing.TB, st *store, d time.Duration) {
	t.Helper()
	_, ok := poll(d, 10*time.Millisecond, func() bool {
		alone, _ := st.ses.aloneEpoch()
		return alone
	})
	require.True(t, ok, "the session did not have the run alone within %v (it tries every %v)", d, pingEvery)
}

// openAlone opens name in db (openOptimist), waits until its session has
// the run alone and confirms its head there (a Do whose bet is awaited):
// its next batches of begins go ahead of their reply.
func openAlone(t testing.TB, db *DB, name string) (*store, *runstate.Run) {
	t.Helper()
	ctx := context.Background()
	run, st := openOptimist(t, db, name)
	require.NoError(t, doOutput(ctx, run, "warm"))
	waitAlone(t, st, pingEvery+5*time.Second)
	require.NoError(t, doOutput(ctx, run, "confirm"))
	return st, run
}

// sentAhead is how many batches st sent ahead.
func sentAhead(st *store) int {
	st.ahead.mu.Lock()
	defer st.ahead.mu.Unlock()
	return st.ahead.count
}

// doOutput is one Do of stage whose function writes a small output.
func doOutput(ctx context.Context, run *runstate.Run, stage string) error {
	return run.Do(ctx, stage, func(ctx context.Context, s *runstate.Stage) error {
		return s.WriteFile("out/"+stage+".txt", []byte("result of "+stage+"\n"))
	})
}

// A session alone on its run sends its begins ahead: once a bet awaited
// in the run alone proved its head, every one of 20 Do's begins goes
// without waiting for its reply. Every
// record is there, in order, and the ledger verifies: each stage begun
// and completed once.
func TestAloneSessionSendsBeginsAhead(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	st, run := openAlone(t, db, "alone")
	before := sentAhead(st)
	for i := range 20 {
		require.NoError(t, doOutput(ctx, run, fmt.Sprintf("s%d", i)))
	}
	sent := sentAhead(st) - before
	assert.Equal(t, 20, sent, "begins sent ahead of their reply, of 20 Do alone after the head was confirmed")
	require.NoError(t, run.Close())
	rep, err := db.Verify(ctx, "alone")
	require.NoError(t, err)
	assert.True(t, rep.OK(), "the ledger verifies: %+v", rep)
	recs := ledger(t, db, "alone")
	for i := range 20 {
		stage := fmt.Sprintf("s%d", i)
		assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(recs, stage), stage)
	}
}

// A session that opens while another has the run alone waits for it to
// let go, which it does once notified (well within its next ping, which
// would find the want lock held) and once it read back what it sent
// ahead: here the begin of a stage whose work still runs.
// The newcomer then finds that stage busy (the begin is there), the first
// session no longer has the run alone (and does not take it again while
// the other is open), and both go on appending; the ledger verifies.
func TestSessionOpeningWaitsForTheOneAloneToLetGo(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	startA := time.Now()
	timed, _ := openOptimist(t, db, "timed") // an Open with no other session: the yardstick
	openA := time.Since(startA)
	require.NoError(t, timed.Close())
	a, runA := openAlone(t, db, "shared")
	before := sentAhead(a)
	working, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- runA.Do(ctx, "held", func(ctx context.Context, s *runstate.Stage) error {
			close(working)
			<-release
			return s.WriteFile("out/held.txt", []byte("held\n"))
		})
	}()
	<-working
	assert.Equal(t, before+1, sentAhead(a), "held's begin went ahead of its reply")

	// Open right after a's ping, so that its next one, pingEvery later,
	// does not come first: then only the notification can let the run go.
	// (A bound on the Open's time, pingEvery/2, failed on a loaded machine.)
	lastPing := func() time.Time {
		a.ses.mu.Lock()
		defer a.ses.mu.Unlock()
		return a.ses.lastOK
	}
	pinged := lastPing()
	_, ok := poll(pingEvery+5*time.Second, time.Millisecond, func() bool { return lastPing().After(pinged) })
	require.True(t, ok, "no ping of the first session's within %v", pingEvery+5*time.Second)
	noted := a.ses.noted.Load()
	start := time.Now()
	runB, b := openOptimist(t, db, "shared")
	defer runB.Close()
	waited := time.Since(start)
	t.Logf("the second session's Open took %v while the first had the run alone (an Open alone: %v)", waited.Round(time.Microsecond), openA.Round(time.Microsecond))
	assert.Equal(t, noted+1, a.ses.noted.Load(), "the first session let the run go on the newcomer's notification, not at its next ping (%v)", pingEvery)
	alone, _ := a.ses.aloneEpoch()
	assert.False(t, alone, "the first session let the run go")
	_, err := runB.Begin(ctx, "held")
	require.ErrorIs(t, err, runstate.ErrBusy, "the begin sent ahead is there for the newcomer")

	close(release)
	require.NoError(t, <-done)
	require.NoError(t, doOutput(ctx, runB, "b1"))
	require.NoError(t, doOutput(ctx, runA, "a1"))
	time.Sleep(2 * pingEvery) // the pinger's tries: neither may have the run alone while both are open
	for _, s := range []*store{a, b} {
		alone, _ := s.ses.aloneEpoch()
		assert.False(t, alone, "a session has the run alone while another is open")
	}
	n := sentAhead(a)
	require.NoError(t, doOutput(ctx, runA, "a2"))
	assert.Equal(t, n, sentAhead(a), "nothing is sent ahead while another session is open")
	require.NoError(t, runB.Close())
	require.NoError(t, runA.Close())
	rep, err := db.Verify(ctx, "shared")
	require.NoError(t, err)
	assert.True(t, rep.OK(), "the ledger verifies: %+v", rep)
	recs := ledger(t, db, "shared")
	assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(recs, "held"))
}

// A begin sent ahead that does not land (here the run's head was moved
// behind the session's back, as an edit of the table would) is found
// when its reply is read, at the stage's Complete: the Complete fails
// with runstate.ErrSessionLost and records nothing, and the Run is
// read-only from then on (the session went on as if the begin were
// there). The records before it are intact.
func TestBeginSentAheadThatDidNotLandStopsTheSession(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	st, run := openAlone(t, db, "edited")
	before := sentAhead(st)
	_, err := db.pool.Exec(ctx, db.sql(`UPDATE {s}.runs SET last_seq = last_seq + 1 WHERE name = $1`), "edited")
	require.NoError(t, err)
	err = doOutput(ctx, run, "lost")
	assert.Equal(t, before+1, sentAhead(st), "lost's begin went ahead")
	require.ErrorIs(t, err, runstate.ErrSessionLost, "the Complete after a begin that did not land")
	assert.Contains(t, err.Error(), "sent ahead")
	err = doOutput(ctx, run, "after")
	require.Error(t, err)
	assert.True(t, errors.Is(err, runstate.ErrReadOnly) || errors.Is(err, runstate.ErrSessionLost), "the Run is read-only: %v", err)
	var n int
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT count(*) FROM {s}.records r JOIN {s}.runs u ON u.id = r.run_id
		WHERE u.name = $1 AND r.stage IN ('lost', 'after')`), "edited").Scan(&n))
	assert.Zero(t, n, "no record of the stages after the edit")
}

// A batch sent ahead waits for a head row that another transaction
// holds for a moment (as a session taking its lock again, or the check of
// a lost reply, does: resolve.go), and lands when it is let go: the begin
// went ahead, the Do returns nil, and the Run goes on. A bet on the
// pipeline that failed at once on the held row (NOWAIT, as until
// 2026-12-06) made the Run read-only here, its caller already let go.
func TestBatchSentAheadWaitsForAHeadRowHeldForAMoment(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	st, run := openAlone(t, db, "moment")
	before := sentAhead(st)

	conn, err := db.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, db.sql(`SELECT 1 FROM {s}.runs WHERE name = 'moment' FOR UPDATE`))
	require.NoError(t, err)
	const held = 300 * time.Millisecond
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(held)
		_, _ = conn.Exec(context.Background(), "COMMIT")
	}()
	start := time.Now()
	err = doOutput(ctx, run, "waited")
	<-released
	require.NoError(t, err, "the Do whose begin met the held row")
	assert.GreaterOrEqual(t, time.Since(start), held-50*time.Millisecond, "its batches waited for the row")
	assert.Equal(t, before+1, sentAhead(st), "its begin went ahead")
	require.NoError(t, doOutput(ctx, run, "after"), "the Run goes on")
	require.NoError(t, run.Close())
	recs := ledger(t, db, "moment")
	for _, stage := range []string{"waited", "after"} {
		assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(recs, stage), stage)
	}
	rep, err := db.Verify(ctx, "moment")
	require.NoError(t, err)
	assert.True(t, rep.OK(), "the ledger verifies: %+v", rep)
}

func init() { roles["aheadholder"] = aheadHolderRole }

// aheadReport is what an aheadholder reports while its stage's work runs
// ("holding"), or, with Gate, once the held stage's begin is written
// ("sent").
type aheadReport struct {
	Session    string
	SentBefore int  // batches sent ahead before the held stage's Do
	SentNow    int  // and once its work runs ("holding")
	Ahead      bool // "sent": the first batch written to the pipeline after "go", held's begin, went ahead of its reply
}

// aheadArgs are an aheadholder's: where its run is, and Gate: report
// "confirmed" once the head is confirmed in the run alone and wait for the
// parent's "go" before the held stage (after a Do that prepares the
// begin's statement on the pipeline), and report "sent" as the held
// stage's begin is written to the pipeline, instead of "holding".
type aheadArgs struct {
	runArgs
	Gate bool
}

// aheadHolderRole opens the run alone, waits until it has the run alone,
// confirms its head with a Do, then runs a Do of "held" whose function
// reports "holding" and blocks until the process is killed.
func aheadHolderRole(ctx context.Context, raw json.RawMessage, cio *childIO) error {
	var a aheadArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return err
	}
	db, err := Connect(ctx, a.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	st := db.Store(a.Run).(*store)
	run, err := runstate.OpenStore(st, a.Dir, &runstate.Options{Request: "ahead"})
	if err != nil {
		return err
	}
	if err := doOutput(ctx, run, "warm"); err != nil {
		return err
	}
	deadline := time.Now().Add(pingEvery + 10*time.Second)
	for alone, _ := st.ses.aloneEpoch(); !alone; alone, _ = st.ses.aloneEpoch() {
		if time.Now().After(deadline) {
			return errors.New("the session did not have the run alone")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := doOutput(ctx, run, "confirm"); err != nil {
		return err
	}
	if a.Gate {
		// A begin on the pipeline first, so that its statement is prepared
		// there (a Prepare is awaited: it would wait for the gate).
		if err := doOutput(ctx, run, "primed"); err != nil {
			return err
		}
		cio.send("confirmed", holding{Session: run.Session()})
		if cmd := cio.next(); cmd != "go" {
			return fmt.Errorf("aheadholder: %q instead of go", cmd)
		}
	}
	r := aheadReport{Session: run.Session(), SentBefore: sentAhead(st)}
	if a.Gate {
		// The parent holds the begin back (the records table's lock) until
		// this process is killed, and what follows the begin here may wait
		// for its reply meanwhile: the handoff timer's batch, handoffLag
		// after a batch of begins, reads the pipeline back under its mutex
		// (which sentAhead takes), and the Do's goroutine, leading the
		// commits, may be the one that runs it before its Begin returns.
		// So the report comes from the pipeline, as the begin is written.
		var once sync.Once
		st.ahead.mu.Lock()
		st.ahead.trace = func(e pipeEvent) { // under st.ahead.mu
			once.Do(func() {
				r.Ahead = e.lazy && !e.replied && e.records == 1
				cio.send("sent", r)
			})
		}
		st.ahead.mu.Unlock()
	}
	return run.Do(ctx, "held", func(ctx context.Context, s *runstate.Stage) error {
		if !a.Gate {
			r.SentNow = sentAhead(st)
			cio.send("holding", r)
		}
		select {} // until SIGKILL
	})
}

// A process that has its run alone sends a stage's begin ahead and is
// SIGKILLed while the stage's work runs, before any reply was read: the
// begin is in the database all the same (the kernel delivered what was
// written before the kill), so the restart policy counts the attempt: the
// next session finds the stage interrupted, naming the dead session, and
// begins attempt 2.
func TestBeginSentAheadSurvivesSIGKILL(t *testing.T) {
	dsn := withSchema(testDSN(t), newSchema(t))
	ch := startChild(t, "aheadholder", runArgs{DSN: dsn, Run: "run", Dir: t.TempDir()})
	var r aheadReport
	ch.expect("holding", 60*time.Second, &r)
	require.Equal(t, r.SentBefore+1, r.SentNow, "held's begin went ahead of its reply")
	require.NoError(t, ch.cmd.Process.Kill())
	ch.wait(10 * time.Second)

	db, err := Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	resumeHeld(t, db, r.Session)
}

// resumeHeld opens the run "run" in a new session and checks that the
// killed session's attempt of "held" counts: the new session begins
// attempt 2, and attempt 1 is recorded interrupted, naming the dead
// session, which left nothing after its begin.
func resumeHeld(t *testing.T, db *DB, session string) {
	t.Helper()
	run, err := db.Open(context.Background(), "run", t.TempDir(), &runstate.Options{Request: "ahead"})
	require.NoError(t, err)
	defer run.Close()
	st, _ := takeOver(t, run, "held", 5*time.Second, time.Millisecond)
	assert.Equal(t, 2, st.Attempt(), "the killed attempt counts")
	require.NoError(t, st.Complete())
	checkInterrupted(t, ledger(t, db, "run"), "held", holding{Session: session})
}

// The same, with the server made to run the begin only after it has freed
// the killed session's own lock: the test holds the records table's lock
// while the child sends the held stage's begin ahead (the begin's
// statement waits for it before its first step; the child reports as it
// writes the begin, "sent": aheadHolderRole), SIGKILLs the child,
// waits until the session's own lock is free (its lock connection's end
// is processed) and only then lets the begin's statement go. Meanwhile
// the session is alive to the others (Live): its pipeline's backend holds
// the session's pipeline key until it has run its input and ended. The
// begin lands, and counts: a begin sent ahead belongs to the moment it was
// written, when its process lived (its fence is the compare-and-set; the
// complete's statement keeps the probe of the session's lock).
func TestBeginSentAheadLandsWhenTheServerRunsItAfterTheKill(t *testing.T) {
	dsn := withSchema(testDSN(t), newSchema(t))
	ctx := context.Background()
	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	ch := startChild(t, "aheadholder", aheadArgs{runArgs: runArgs{DSN: dsn, Run: "run", Dir: t.TempDir()}, Gate: true})
	var h holding
	ch.expect("confirmed", 60*time.Second, &h)

	gate, err := db.pool.Begin(ctx)
	require.NoError(t, err)
	defer gate.Rollback(ctx)
	_, err = gate.Exec(ctx, db.sql("LOCK TABLE {s}.records IN ACCESS EXCLUSIVE MODE"))
	require.NoError(t, err)
	ch.tell("go")
	var r aheadReport
	ch.expect("sent", 60*time.Second, &r)
	require.True(t, r.Ahead, "held's begin went ahead of its reply")
	// The begin's statement is waiting for the table's lock. Its backend is
	// the child's pipeline's, found by name: another program on the server
	// (the other packages' tests, run in parallel) may have a backend whose
	// last statement, or the one it waits in, is a bet too.
	pipeApp := "runstate pipeline " + h.Session
	_, ok := poll(10*time.Second, 5*time.Millisecond, func() bool {
		var n int
		require.NoError(t, db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND application_name = $1 AND query LIKE '%pg_try_advisory_xact_lock_shared%'`, pipeApp).Scan(&n))
		return n == 1
	})
	require.True(t, ok, "the begin's statement waits for the run table's lock")
	ch.kill()
	key := lockKey(h.Session)
	_, ok = poll(10*time.Second, 5*time.Millisecond, func() bool {
		var n int
		require.NoError(t, db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid`, key).Scan(&n))
		return n == 0
	})
	require.True(t, ok, "the killed session's lock was freed")
	// Until the server has run what the process wrote to its pipeline, the
	// session is alive to the others: its pipeline's key is held.
	time.Sleep(100 * time.Millisecond)
	live, err := db.Store("run").(*store).Live(ctx, []string{h.Session})
	require.NoError(t, err)
	assert.True(t, live[h.Session], "the killed session is alive while its pipeline's backend has the begin to run")
	require.NoError(t, gate.Commit(ctx))
	// The begin's statement ends (committed or not) and its backend with it.
	_, ok = poll(10*time.Second, 5*time.Millisecond, func() bool {
		var n int
		require.NoError(t, db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, pipeApp).Scan(&n))
		return n == 0
	})
	require.True(t, ok, "the begin's backend ended")
	_, ok = poll(10*time.Second, 5*time.Millisecond, func() bool {
		live, err := db.Store("run").(*store).Live(ctx, []string{h.Session})
		require.NoError(t, err)
		return !live[h.Session]
	})
	require.True(t, ok, "the killed session is gone once its pipeline's backend ended")

	resumeHeld(t, db, r.Session)
}

// The pipeline's connection holds the session's pipeline key, which keeps
// the session alive to the others, while the session has the run alone;
// when the session is lost the connection is closed (lostAhead), and once
// its own lock is free too, the others find it gone. A clean Close lets
// the key go as well.
func TestPipelineKeyHeldWhileAloneAndLetGoWhenLost(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	key := func(st *store) int64 { return pipeKey(st.ses.id) }
	live := func(st *store, session string) bool {
		l, err := st.Live(ctx, []string{session})
		require.NoError(t, err)
		return l[session]
	}

	st, run := openAlone(t, db, "lost")
	require.NoError(t, doOutput(ctx, run, "ahead"))
	require.True(t, advisoryHeld(ctx, db, key(st)), "the pipeline's key is held while the session has the run alone")
	session := st.ses.id
	st.ses.mu.Lock()
	st.ses.lose(errors.New("a test loses it"))
	st.ses.mu.Unlock()
	_, ok := poll(5*time.Second, 5*time.Millisecond, func() bool { return !advisoryHeld(ctx, db, pipeKey(session)) })
	require.True(t, ok, "the lost session's pipeline key let go")
	_, ok = poll(5*time.Second, 5*time.Millisecond, func() bool { return !live(st, session) })
	require.True(t, ok, "the lost session gone to the others")
	require.ErrorIs(t, doOutput(ctx, run, "after"), runstate.ErrSessionLost)

	st2, run2 := openAlone(t, db, "clean")
	require.NoError(t, doOutput(ctx, run2, "ahead"))
	k2 := key(st2)
	require.True(t, advisoryHeld(ctx, db, k2))
	require.NoError(t, run2.Close())
	assert.False(t, advisoryHeld(ctx, db, k2), "a clean Close lets the pipeline's key go before it returns")
}
