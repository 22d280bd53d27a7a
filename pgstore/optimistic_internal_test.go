package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/runstate/runstate/runstatetest/storetest"
	"github.com/stretchr/testify/require"
)

// openOptimist opens a session on run in a work dir of its own and
// returns its store too, whose bets it counts.
func openOptimist(t testing.TB, db *DB, run string) (*runstate.Run, *store) {
	t.Helper()
	s := db.Store(run).(*store)
	r, err := runstate.OpenStore(s, t.TempDir(), &runstate.Options{Request: "optimistic"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r, s
}

func (o *optimism) lockCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.locks
}

func (o *optimism) counts() (bets, lost int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bets, o.lost
}

// wins is the bets that committed records.
func (o *optimism) wins() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.won
}

func stageOf(t *testing.T, r *runstate.Run, name string) runstate.StageStatus {
	t.Helper()
	st, err := r.Status()
	require.NoError(t, err)
	for _, s := range st.Stages {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no stage %s in the status", name)
	return runstate.StageStatus{}
}

type lineFields struct {
	Seq     int64  `json:"seq"`
	Prev    string `json:"prev"`
	Ev      string `json:"ev"`
	Stage   string `json:"stage"`
	Attempt int    `json:"attempt"`
}

// checkChain reads the run's records and checks seq 1..n without a gap,
// each prev the hash of the line before, and at most one complete (and
// exactly one begin for it) per stage attempt. It returns the records.
func checkChain(t *testing.T, db *DB, run string) []lineFields {
	t.Helper()
	lines := storetest.ReadLines(t, db.Store(run))
	recs := make([]lineFields, len(lines))
	prev := ""
	type attempt struct {
		stage string
		n     int
	}
	begins, completes := map[attempt]int{}, map[attempt]int{}
	for i, l := range lines {
		require.NoError(t, json.Unmarshal(l, &recs[i]), "line %d", i+1)
		r := recs[i]
		require.Equal(t, int64(i+1), r.Seq, "seq of line %d", i+1)
		require.Equal(t, prev, r.Prev, "prev of record %d", r.Seq)
		h := sha256.Sum256(l)
		prev = hex.EncodeToString(h[:])
		switch r.Ev {
		case "begin":
			begins[attempt{r.Stage, r.Attempt}]++
		case "complete":
			completes[attempt{r.Stage, r.Attempt}]++
		}
	}
	for a, n := range completes {
		require.Equal(t, 1, n, "complete records of %s attempt %d", a.stage, a.n)
		require.Equal(t, 1, begins[a], "begin records of %s attempt %d", a.stage, a.n)
	}
	return recs
}

// raceDos runs workers goroutines on each of runs, each doing ops Dos of
// the stages do names (session i, worker w, op k), with do's functions. A
// Do that returns ErrBusy (another session runs the stage) is tried again
// a millisecond later; any other error fails the test. It reports whether
// every Do returned nil.
func raceDos(t *testing.T, ctx context.Context, runs []*runstate.Run, workers, ops int,
	do func(i, w, k int) (string, func(context.Context, *runstate.Stage) error)) bool {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(runs)*workers)
	for i, r := range runs {
		for w := range workers {
			wg.Go(func() {
				for k := range ops {
					name, fn := do(i, w, k)
					err := r.Do(ctx, name, fn)
					for errors.Is(err, runstate.ErrBusy) {
						time.Sleep(time.Millisecond)
						err = r.Do(ctx, name, fn)
					}
					if err != nil {
						errs <- fmt.Errorf("session %d: do %s: %w", i, name, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return !t.Failed()
}

// A session whose position is still the head bets: its Do is two round
// trips, no Lock; when another session appended meanwhile the bet is lost
// (the head's compare-and-set fails), nothing of it is written, and the
// batch is decided again under the lock, after the other's records.
func TestOptimisticConflictIsDecidedAgainUnderTheLock(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	a, as := openOptimist(t, db, "bet")
	b, _ := openOptimist(t, db, "bet")
	do := func(r *runstate.Run, name string) {
		t.Helper()
		require.NoError(t, r.Do(ctx, name, func(context.Context, *runstate.Stage) error { return nil }))
	}
	// b's open records are news to a: a1's bet is lost (unless a batch
	// of a's learnt of them first); a then locks until its Locks find b
	// quiet, and bets again, and wins. untilBetting makes Dos on a until
	// one's two batches bet and win.
	do(a, "a1")
	n := 0
	untilBetting := func() {
		t.Helper()
		for k := 0; k < 300; k++ {
			b0, l0 := as.opt.counts()
			n++
			do(a, fmt.Sprintf("quiet-%d", n))
			if b1, l1 := as.opt.counts(); b1 == b0+2 && l1 == l0 {
				return
			}
		}
		t.Fatal("a does not bet again (both batches of a Do) once b is quiet")
	}
	untilBetting()

	// b appends; a does not know: its next bet is on an old head. (A
	// batch of a's in between, such as the handoff's timer's, may learn
	// of b's records first: then a's Do does not bet, and the pair is
	// tried again.)
	var order []string
	for k := 0; k < 10; k++ {
		if k > 0 {
			untilBetting()
		}
		bn, an := fmt.Sprintf("b%d", k), fmt.Sprintf("a%d", k)
		do(b, bn)
		_, l0 := as.opt.counts()
		do(a, an)
		if _, l := as.opt.counts(); l == l0+1 {
			order = []string{bn, an}
			break
		}
	}
	require.NotNil(t, order, "a's bet on a head b moved is lost")

	recs := checkChain(t, db, "bet")
	var completes []string
	for _, r := range recs {
		if r.Ev == "complete" {
			completes = append(completes, r.Stage)
		}
	}
	require.Equal(t, order, completes[len(completes)-2:], "a's stage is complete after b's, decided again on the head")
	require.Equal(t, runstate.StateComplete, stageOf(t, a, order[0]).State, "a caught up with b's records when it locked")
	require.Equal(t, runstate.StateComplete, stageOf(t, a, order[1]).State)
}

// A session alone on its run takes no Lock once it knows the head: not
// for its Dos, nor for the handoff timer's flushes between them (which
// decide nothing, so need no proof of the head), and a Do is two
// transactions of one round trip each.
func TestOptimisticLoneSessionTakesNoLock(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	a, as := openOptimist(t, db, "alone")
	require.NoError(t, a.Do(ctx, "first", func(context.Context, *runstate.Stage) error { return nil }))
	locks0 := as.opt.lockCount()
	bets0, _ := as.opt.counts()
	for k := range 5 {
		require.NoError(t, a.Do(ctx, fmt.Sprintf("s%d", k), func(_ context.Context, st *runstate.Stage) error {
			return st.WriteFile(fmt.Sprintf("out-%d.txt", k), []byte("output"))
		}))
		time.Sleep(120 * time.Millisecond) // past the handoff's lag: its timer flushes
	}
	bets, lost := as.opt.counts()
	require.Equal(t, locks0, as.opt.lockCount(), "Locks after the first Do")
	require.Zero(t, lost)
	require.GreaterOrEqual(t, bets-bets0, 10, "each Do's begin and complete bet")
	checkChain(t, db, "alone")
}

// A bet whose decision asks whether another session lives is decided again
// under the lock, where Alive can prove the other gone: a stage a crashed
// session held is interrupted and begun again, never ErrBusy.
func TestOptimisticAliveForcesTheLock(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	a, as := openOptimist(t, db, "alive")
	b, _ := openOptimist(t, db, "alive")
	_, err := b.Begin(ctx, "held")
	require.NoError(t, err)
	// a catches up (its bet on the old head is lost, then a Lock finds
	// b's begin), then bets again on a head it knows.
	require.NoError(t, a.Do(ctx, "a1", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, a.Do(ctx, "a2", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, a.Do(ctx, "a3", func(context.Context, *runstate.Stage) error { return nil }))
	runstatetest.Crash(b)
	as.opt.mu.Lock()
	as.opt.eager = true // a bets on the head it knows, though b appended lately
	as.opt.mu.Unlock()
	bets0, _ := as.opt.counts()
	require.NoError(t, a.Do(ctx, "held", func(context.Context, *runstate.Stage) error { return nil }),
		"b crashed: its stage is begun again, not ErrBusy")
	bets, _ := as.opt.counts()
	require.Greater(t, bets, bets0, "a bet on the head it knew")
	held := stageOf(t, a, "held")
	require.Equal(t, runstate.StateComplete, held.State)
	require.Equal(t, 2, held.Attempt)
	recs := checkChain(t, db, "alive")
	interrupted := 0
	for _, r := range recs {
		if r.Ev == "interrupted" && r.Stage == "held" {
			interrupted++
		}
	}
	require.Equal(t, 1, interrupted)
}

// Two sessions (as on two machines), three goroutines each, race Dos on
// their own stages and on shared ones: bets are won and lost, and the run
// stays one gapless chain, with one begin and at most one complete per
// attempt, each shared stage's function run once.
func TestOptimisticRacingSessionsKeepTheChain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := newTestDB(t)
	const sessions, workers, ops, shared = 2, 3, 20, 8
	runs := make([]*runstate.Run, sessions)
	stores := make([]*store, sessions)
	for i := range runs {
		runs[i], stores[i] = openOptimist(t, db, "race")
		stores[i].opt.mu.Lock()
		stores[i].opt.eager = true // bet whenever the head is known: bets race
		stores[i].opt.mu.Unlock()
	}
	var calls [shared]atomic.Int32
	if !raceDos(t, ctx, runs, workers, ops, func(i, w, k int) (string, func(context.Context, *runstate.Stage) error) {
		if k%3 == 0 {
			n := (k/3 + i + w) % shared
			return fmt.Sprintf("shared-%d", n), func(context.Context, *runstate.Stage) error { calls[n].Add(1); return nil }
		}
		return fmt.Sprintf("s%d-w%d-%d", i, w, k), func(context.Context, *runstate.Stage) error { return nil }
	}) {
		return
	}
	for n := range shared {
		require.Equal(t, int32(1), calls[n].Load(), "shared-%d's function runs", n)
	}
	recs := checkChain(t, db, "race")
	completes := 0
	for _, r := range recs {
		if r.Ev == "complete" {
			completes++
		}
	}
	// Each worker's own stages, and every shared stage once.
	own := sessions * workers * (ops - (ops+2)/3)
	require.Equal(t, own+shared, completes)
	var bets, lost int
	for _, s := range stores {
		b, l := s.opt.counts()
		bets, lost = bets+b, lost+l
	}
	t.Logf("bets %d, lost %d", bets, lost)
	require.Positive(t, bets)
	require.Positive(t, lost, "racing bets lose some")
	for _, r := range runs {
		require.NoError(t, r.Close())
	}
}

// A bet on a head row that another session's batch holds (here a
// transaction that locked it and waits) does not wait for it: the bet is
// lost at once (NOWAIT), the batch goes to the committer's queue again and
// is handed to a goroutine that waits for the lock, and the caller gives
// up when its context ends, as without a bet.
func TestOptimisticBetOnAHeldHeadWaitsNoLongerThanItsContext(t *testing.T) {
	db := newTestDB(t)
	a, as := openOptimist(t, db, "held")
	require.NoError(t, a.Do(context.Background(), "first", func(context.Context, *runstate.Stage) error { return nil }))
	bets0, lost0 := as.opt.counts()

	conn, err := db.pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(context.Background(), "BEGIN")
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), db.sql(`SELECT 1 FROM {s}.runs WHERE name = 'held' FOR NO KEY UPDATE`))
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(3 * time.Second) // the old way waited for this
		_, _ = conn.Exec(context.Background(), "COMMIT")
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = a.Do(ctx, "blocked", func(context.Context, *runstate.Stage) error { return nil })
	waited := time.Since(start)
	require.Error(t, err, "the head row is held")
	require.Less(t, waited, 2*time.Second, "the call gave up when its context ended (%v)", err)
	bets, lost := as.opt.counts()
	require.Equal(t, bets0+1, bets, "the begin bet")
	require.Equal(t, lost0+1, lost, "and lost at once")

	<-released
	require.NoError(t, a.Do(context.Background(), "after", func(context.Context, *runstate.Stage) error { return nil }))
	recs := checkChain(t, db, "held")
	for _, r := range recs {
		require.NotEqual(t, "blocked", r.Stage, "nothing of the call that gave up is recorded")
	}
}

// A bet probes the session's own lock under the head row lock it takes,
// as Lock does: a session whose lock connection died (its lock takeable,
// so another session may count it gone) commits nothing on a bet. Within
// lostAfter of its last good ping the bet is lost, the lock is taken
// again and the batch is decided again under Lock; past lostAfter the Do
// fails with ErrSessionLost and writes nothing.
func TestOptimisticBetProbesTheSessionsOwnLock(t *testing.T) {
	old := pingEvery
	pingEvery = time.Hour // no ping notices the cut: only the bet's probe can
	t.Cleanup(func() { pingEvery = old })
	ctx := context.Background()
	db := newTestDB(t)
	a, as := openOptimist(t, db, "fence")
	as.opt.mu.Lock()
	as.opt.eager = true
	as.opt.mu.Unlock()
	require.NoError(t, a.Do(ctx, "first", func(context.Context, *runstate.Stage) error { return nil }))

	// cut ends the session's lock connection on the server and waits until
	// its lock is free; the session does not know.
	cut := func() {
		t.Helper()
		as.ses.mu.Lock()
		pid := as.ses.conn.PgConn().PID()
		as.ses.mu.Unlock()
		var ok bool
		require.NoError(t, db.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok))
		require.True(t, ok)
		for k := 0; ; k++ {
			var n int
			require.NoError(t, db.pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", pid).Scan(&n))
			if n == 0 {
				return
			}
			require.Less(t, k, 500, "the lock of the cut connection is still held")
			time.Sleep(10 * time.Millisecond)
		}
	}

	cut()
	bets0, lost0 := as.opt.counts()
	require.NoError(t, a.Do(ctx, "rehold", func(context.Context, *runstate.Stage) error { return nil }))
	bets, lost := as.opt.counts()
	require.Greater(t, bets, bets0, "the begin bet")
	require.Equal(t, lost0+1, lost, "the bet found the session's lock free: lost, decided again once the lock was held again")
	require.Equal(t, runstate.StateComplete, stageOf(t, a, "rehold").State)

	cut()
	as.ses.mu.Lock()
	as.ses.lastOK = time.Now().Add(-2 * lostAfter) // the lock free for longer than lostAfter: the session is lost
	as.ses.mu.Unlock()
	bets0, _ = as.opt.counts()
	err := a.Do(ctx, "gone", func(context.Context, *runstate.Stage) error { return nil })
	require.ErrorIs(t, err, runstate.ErrSessionLost)
	bets, _ = as.opt.counts()
	require.Equal(t, bets0+1, bets, "the begin bet")
	for _, r := range checkChain(t, db, "fence") {
		require.NotEqual(t, "gone", r.Stage, "nothing of the lost session's bet is recorded")
	}
}

// A bet whose decision asked whether another session lives is never
// committed, though it appended records: only the row lock can prove the
// answer (Alive answers "alive" in a bet), so its Sync and Confirm return
// ErrConflict with nothing written, and the committer decides it again
// under Lock.
func TestOptimisticBetThatAskedAliveIsNotCommitted(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	a, as := openOptimist(t, db, "asked")
	require.NoError(t, a.Do(ctx, "first", func(context.Context, *runstate.Stage) error { return nil }))
	as.opt.mu.Lock()
	as.opt.eager = true
	head := as.opt.head
	as.opt.mu.Unlock()
	for _, confirm := range []bool{false, true} {
		ob, ok := as.LockOptimistic(head)
		require.True(t, ok, "a bet on the head the session knows")
		t.Cleanup(func() { _ = ob.Abort() }) // before the pool closes, also on failure
		require.True(t, ob.Alive(uuid.NewString()), "a bet answers alive for another session (the safe side)")
		line := []byte(fmt.Sprintf(`{"seq":%d,"ev":"note"}`, head.Seq+1))
		sum := sha256.Sum256(line)
		to := runstate.Position{Seq: head.Seq + 1, Hash: hex.EncodeToString(sum[:]), End: head.End + int64(len(line)) + 1, LastLen: int64(len(line)) + 1}
		require.NoError(t, ob.Append([]*runstate.Record{{Seq: to.Seq, Ev: "note", At: time.Now()}}, append(line, '\n'), to))
		if confirm {
			require.ErrorIs(t, ob.Confirm(ctx), runstate.ErrConflict)
		} else {
			require.ErrorIs(t, ob.Sync(ctx), runstate.ErrConflict)
		}
		require.NoError(t, ob.Abort())
	}
	require.Len(t, checkChain(t, db, "asked"), int(head.Seq), "nothing of the bets is recorded")
}

// Only LockOptimistic's batch is a runstate.OptimisticBatch: the committer
// Confirms any batch that is one before it releases the batch's callers,
// and a Lock's or TryLock's batch of begins must release them first and
// commit at Unlock while they go on (with a Confirm on every locked batch,
// 4 processes on one run lost about 20% of their throughput and their
// p99 doubled: pgcompare, bets turned off).
func TestOnlyTheBetIsAnOptimisticBatch(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	a, as := openOptimist(t, db, "kinds")
	require.NoError(t, a.Do(ctx, "first", func(context.Context, *runstate.Stage) error { return nil }))
	as.opt.mu.Lock()
	head := as.opt.head
	as.opt.mu.Unlock()

	lb, err := as.Lock(ctx, head)
	require.NoError(t, err)
	_, isBet := lb.(runstate.OptimisticBatch)
	require.NoError(t, lb.Abort())
	require.False(t, isBet, "Lock's batch")
	for {
		tb, ok, err := as.TryLock(head)
		require.NoError(t, err)
		if !ok {
			time.Sleep(time.Millisecond) // the handoff timer's batch holds the row
			continue
		}
		_, isBet = tb.(runstate.OptimisticBatch)
		require.NoError(t, tb.Abort())
		require.False(t, isBet, "TryLock's batch")
		break
	}
	ob, ok := as.LockOptimistic(head)
	require.True(t, ok)
	require.NoError(t, ob.Abort())
}

// Sessions that open one run together (processes of a fleet) do not bet
// on their first batch after Open, which would find the others' records
// and lose (a ROLLBACK and a read of the run each, in every process); a
// session alone bets from its first Do's complete on.
func TestOptimisticFirstBatchAfterOpenDoesNotBet(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	a, as := openOptimist(t, db, "together")
	b, bs := openOptimist(t, db, "together")
	for i, r := range []*runstate.Run{a, b} {
		require.NoError(t, r.Do(ctx, fmt.Sprintf("first-%d", i), func(context.Context, *runstate.Stage) error { return nil }))
	}
	for i, s := range []*store{as, bs} {
		_, lost := s.opt.counts()
		require.Zero(t, lost, "session %d lost a bet", i)
	}

	c, cs := openOptimist(t, db, "alone")
	require.NoError(t, c.Do(ctx, "first", func(context.Context, *runstate.Stage) error { return nil }))
	_, lost := cs.opt.counts()
	// Of the batches with records, the begin's is locked, the complete's a
	// bet. (Not the count of bets: a flush of the projections, the
	// handoff timer's, may be one more, when it comes before the test
	// looks.)
	require.Equal(t, 1, cs.opt.wins(), "the first Do's complete bets, its begin does not")
	require.Zero(t, lost)
}

// Two sessions share a run, bets won and lost, locked batches and the
// outputs' blobs (the same bytes from both), where the connections'
// default_transaction_isolation is stricter than READ COMMITTED (here
// from the DSN; as well a server's, database's or role's setting): every
// Do returns nil, and the run is one gapless chain with one complete per
// stage. At REPEATABLE READ or SERIALIZABLE, a Lock that waited for the
// other session's batch failed with "could not serialize access due to
// concurrent update" before pgstore ran its transactions at READ
// COMMITTED.
func TestSessionsShareARunAtAnyDefaultIsolation(t *testing.T) {
	for _, iso := range []string{"repeatable read", "serializable"} {
		for _, eager := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/bets=%v", iso, eager), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				base := newTestDB(t)
				db := connectWith(t, base, serverSetting{"default_transaction_isolation", iso, iso})
				const sessions, workers, ops = 2, 3, 12
				var runs []*runstate.Run
				var stores []*store
				for range sessions {
					r, s := openOptimist(t, db, "iso")
					s.opt.mu.Lock()
					s.opt.eager = eager
					s.opt.mu.Unlock()
					runs, stores = append(runs, r), append(stores, s)
				}
				if !raceDos(t, ctx, runs, workers, ops, func(i, w, k int) (string, func(context.Context, *runstate.Stage) error) {
					name := fmt.Sprintf("s%d-w%d-%d", i, w, k)
					return name, func(_ context.Context, st *runstate.Stage) error {
						if k%3 == 0 {
							return st.WriteFile("out/"+name, []byte(fmt.Sprintf("the same bytes %d", k)))
						}
						return nil
					}
				}) {
					return
				}
				completes := 0
				for _, r := range checkChain(t, db, "iso") {
					if r.Ev == "complete" {
						completes++
					}
				}
				require.Equal(t, sessions*workers*ops, completes)
				locks := 0
				for _, s := range stores {
					locks += s.opt.lockCount()
				}
				require.Positive(t, locks, "the sessions took the run's lock")
			})
		}
	}
}

// A Do whose Lock waits for the head row longer than the server's
// lock_timeout or statement_timeout (set for the user, the database or,
// here, the DSN: production servers often set them) still waits as long
// as its context allows, as without them: the Lock's transaction lifts
// both, and the context bounds the wait.
func TestLockWaitsPastTheServersTimeouts(t *testing.T) {
	ctx := context.Background()
	base := newTestDB(t)
	db := connectWith(t, base, serverSetting{"lock_timeout", "100", "100ms"}, serverSetting{"statement_timeout", "200", "200ms"})
	a, _ := openOptimist(t, db, "timeouts")
	require.NoError(t, a.Do(ctx, "first", func(context.Context, *runstate.Stage) error { return nil }))

	conn, err := base.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, base.sql(`SELECT 1 FROM {s}.runs WHERE name = 'timeouts' FOR NO KEY UPDATE`))
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(600 * time.Millisecond) // longer than both timeouts
		_, _ = conn.Exec(ctx, "COMMIT")
	}()
	start := time.Now()
	err = a.Do(ctx, "waited", func(context.Context, *runstate.Stage) error { return nil })
	<-released
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond, "the Do waited for the head row")
	checkChain(t, base, "timeouts")
}
