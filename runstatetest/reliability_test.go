package runstatetest_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate/runstatetest"
)

// figures are what TestReliabilityReport measured.
type figures struct {
	mu sync.Mutex

	pointKills   int // children killed at a crash point
	randomKills  int // children killed by the parent at a random moment
	stormKills   int // of several processes on one run, killed at random moments
	trials       int // interrupted runs resumed to the end
	resumedOK    int // of them, passing every check
	acked        int // records the pipelines were told are durable
	ackLost      int // of them, missing from the final ledger
	redone       int // completed stages begun again though their evidence held
	dupEffects   int // effects recorded again after their confirm
	resends      int // requests for an effect the receiving system already had
	misfiled     int // effects not filed exactly once
	unacked      int // interrupted: stages redone because their begin had no end
	corrupted    int // corruptions injected into the middle of a ledger
	detected     int // of them, reported by Verify and refused by Open, or restored from the journal
	restored     int // of those, in bytes logs/ledger.wal held whole: Open wrote them back
	moved        int // of those, in bytes the journal held but moving records after its last: refused
	tornInjected int // torn last lines injected
	tornCut      int // of them, cut by the next Open with nothing acknowledged lost

	powerLoss      int // power losses injected
	powerLossAcked int // records acknowledged before them
	powerLossLost  int // of them, lost
	powerLossOK    int // power losses after which Open was clean and the run resumed correctly
	// of them, sector by sector (faultfs.PowerLossSectors), and of those,
	// refused by Open for damage no durable copy covered
	powerLossSectors, powerLossRefused int
}

func (f *figures) add(fn func(f *figures)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// suite is the crash suite's shared setup.
type suite struct {
	t   *testing.T
	rv  *receiver
	ref string // the uninterrupted run
	fig *figures
	// pipeline is how long the uninterrupted child's pipeline took.
	pipeline time.Duration
	crossing map[runstatetest.Point]int
}

func (s *suite) child(dir string) runstatetest.Child {
	return runstatetest.Child{Pipeline: "suite", Dir: dir, Env: []string{s.rv.env(), envAcks + "=" + filepath.Join(dir, "..", filepath.Base(dir)+".acks")},
		Timeout: time.Minute}
}

func acksOf(dir string) string { return filepath.Join(dir, "..", filepath.Base(dir)+".acks") }

// check examines a finished run and adds it to the figures: killed is how
// many of its processes were killed, single whether one process ran at a
// time (then no request may be repeated).
func (s *suite) check(t *testing.T, dir string, killed int, single bool) {
	t.Helper()
	f := runstatetest.CheckResumed(t, dir, s.ref)
	acked, lost := lostAcks(t, dir, acksOf(dir))
	assert.Empty(t, lost, "acknowledged records lost")
	filed, resends := s.rv.deliveries(runID(t, dir))
	assert.Equal(t, 2, filed, "two effects filed")
	if single {
		assert.Zero(t, resends, "requests repeated for an effect already filed")
	}
	assert.Zero(t, f.Metrics.DuplicatedWork)
	assert.Zero(t, f.Metrics.EffectsDuplicated)
	s.fig.add(func(g *figures) {
		if killed > 0 {
			g.trials++
			if f.OK() && len(lost) == 0 && filed == 2 && (!single || resends == 0) {
				g.resumedOK++
			}
		}
		g.acked += acked
		g.ackLost += len(lost)
		g.redone += len(f.Redone) + f.Metrics.DuplicatedWork
		g.dupEffects += len(f.Repeated) + f.Metrics.EffectsDuplicated
		g.resends += resends
		if filed != 2 {
			g.misfiled++
		}
		g.unacked += f.Metrics.Interrupted
	})
}

// parallel runs fn(t, i) for i in [0, n) as parallel subtests of t
// (go test's -parallel bounds them, GOMAXPROCS by default) and waits.
func parallel(t *testing.T, n int, fn func(t *testing.T, i int)) {
	t.Run("group", func(t *testing.T) {
		for i := 0; i < n; i++ {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				fn(t, i)
			})
		}
	})
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestReliabilityReport is the crash suite. It kills child processes
// running a multi-stage pipeline with side effects at every crossing of
// every crash point, at random moments, and several at once on one run;
// drops every unsynced write in simulated power losses; injects
// corruption into ledgers; then prints the figures and asserts them.
//
//	go test -run TestReliabilityReport -v ./runstatetest
//
// RUNSTATETEST_KILLS sets the number of random kills (default 200).
func TestReliabilityReport(t *testing.T) {
	runstatetest.CheckLeaks(t)
	start := time.Now()
	s := &suite{t: t, rv: newReceiver(t), fig: &figures{}}
	s.ref = t.TempDir()
	o := s.child(s.ref).Run(runstatetest.Kill{})
	require.NoError(t, o.Err)
	require.True(t, o.Finished)
	s.pipeline, s.crossing = o.Elapsed, o.Crossings
	t.Logf("uninterrupted child: pipeline %s, crossings %v", o.Elapsed, o.Crossings)

	t.Run("crash-points", func(t *testing.T) { s.crashPoints(t) })
	t.Run("random-kills", func(t *testing.T) { s.randomKills(t, envInt("RUNSTATETEST_KILLS", 200)) })
	t.Run("storm", func(t *testing.T) { s.storm(t) })
	t.Run("power-loss", func(t *testing.T) { s.powerLoss(t) })
	t.Run("corruption", func(t *testing.T) { s.corruption(t) })

	f := s.fig
	kills := f.pointKills + f.randomKills + f.stormKills
	var b strings.Builder
	fmt.Fprintf(&b, "runstate reliability report (%s, %s)\n", time.Now().UTC().Format("2006-01-02"), time.Since(start).Round(time.Second))
	row := func(what string, v any) { fmt.Fprintf(&b, "  %-64s %v\n", what, v) }
	row("kill points tried (SIGKILL)", kills)
	row("  at a crash point (every crossing of every point)", f.pointKills)
	row("  at a random moment, one process", f.randomKills)
	row("  at a random moment, several processes on one run", f.stormKills)
	row("interrupted runs resumed to the end", f.trials)
	row("resumed correctly (verify, artifacts byte for byte, effects once)", fmt.Sprintf("%d / %d", f.resumedOK, f.trials))
	row("acknowledged records lost", fmt.Sprintf("%d of %d", f.ackLost, f.acked))
	row("completed stages redone", f.redone)
	row("duplicate effects (intent after confirm)", f.dupEffects)
	row("effects not filed exactly once by the receiving system", f.misfiled)
	row("requests repeated to the receiving system", f.resends)
	row("stage attempts interrupted and begun again", f.unacked)
	row("power losses (unsynced writes dropped or torn)", f.powerLoss)
	row("  acknowledged records lost", fmt.Sprintf("%d of %d", f.powerLossLost, f.powerLossAcked))
	row("  Open clean and resumed correctly", fmt.Sprintf("%d / %d", f.powerLossOK, f.powerLoss))
	row("  sector by sector (kept, lost, zeroed, garbled)", f.powerLossSectors)
	row("    refused: damage after every acknowledged record", f.powerLossRefused)
	row("injected corruptions detected / injected", fmt.Sprintf("%d / %d", f.detected, f.corrupted))
	row("  of them in bytes the journal held whole, restored by Open", f.restored)
	row("  refused: they moved records the journal does not hold (a hand edit)", f.moved)
	row("torn tails cut, nothing else lost / injected", fmt.Sprintf("%d / %d", f.tornCut, f.tornInjected))
	t.Log("\n" + b.String())

	assert.GreaterOrEqual(t, f.randomKills, envInt("RUNSTATETEST_KILLS", 200))
	assert.Positive(t, f.pointKills)
	assert.Positive(t, f.stormKills)
	assert.Equal(t, f.trials, f.resumedOK)
	assert.Zero(t, f.ackLost)
	assert.Positive(t, f.acked)
	assert.Zero(t, f.redone)
	assert.Zero(t, f.dupEffects)
	assert.Zero(t, f.misfiled)
	assert.Positive(t, f.powerLoss)
	assert.Equal(t, f.powerLoss, f.powerLossOK+f.powerLossRefused)
	assert.Zero(t, f.powerLossLost)
	assert.Positive(t, f.powerLossAcked)
	assert.Positive(t, f.corrupted)
	assert.Equal(t, f.corrupted, f.detected)
	assert.Positive(t, f.tornInjected)
	assert.Equal(t, f.tornInjected, f.tornCut)
}

// crashPoints kills a child at every crossing of every crash point.
func (s *suite) crashPoints(t *testing.T) {
	var ats []runstatetest.At
	for _, p := range runstatetest.Points {
		for i := 0; i < s.crossing[p]; i++ {
			ats = append(ats, runstatetest.At{Point: p, Skip: i})
		}
	}
	require.NotEmpty(t, ats)
	parallel(t, len(ats), func(t *testing.T, i int) {
		dir := t.TempDir()
		res := runstatetest.RunKilled(t, s.child(dir), runstatetest.Kill{At: ats[i]})
		assert.Equal(t, 1, res.Kills, "the child was killed at %s", ats[i])
		s.fig.add(func(f *figures) { f.pointKills += res.Kills })
		s.check(t, dir, res.Kills, true)
	})
}

// randomKills kills children at random moments of their pipeline, three
// times a run, until n kills landed. A kill is drawn uniformly from the
// first millisecond to the pipeline's length as the uninterrupted child
// measured it. The machine's load changes while the suite runs (that
// child may have shared the CPU with other packages' tests, the later ones
// may not), so a round where fewer than half the kills landed shrinks the
// span kills are drawn from by a third: kills keep landing however fast
// the children become.
func (s *suite) randomKills(t *testing.T, n int) {
	var mu sync.Mutex
	landed := 0
	span := s.pipeline
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	delay := func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return time.Duration(rng.Int64N(int64(span)+1)) + time.Millisecond
	}
	const perRun = 3
	for round := 0; ; round++ {
		mu.Lock()
		need := n - landed
		mu.Unlock()
		if need <= 0 {
			break
		}
		require.Less(t, round, 40, "kills keep missing the pipeline (drawn from the first %s)", span)
		runs := (need + perRun - 1) / perRun
		before := need
		parallel(t, runs, func(t *testing.T, _ int) {
			dir := t.TempDir()
			var kills []runstatetest.Kill
			for i := 0; i < perRun; i++ {
				kills = append(kills, runstatetest.Kill{After: delay()})
			}
			res := runstatetest.RunKilled(t, s.child(dir), kills...)
			mu.Lock()
			landed += res.Kills
			mu.Unlock()
			s.fig.add(func(f *figures) { f.randomKills += res.Kills })
			s.check(t, dir, res.Kills, true)
		})
		mu.Lock()
		if got := before - (n - landed); 2*got < runs*perRun {
			span -= span / 3
		}
		mu.Unlock()
	}
}

// storm runs three processes at once on one run, each killed at random
// moments up to three times before it may finish.
func (s *suite) storm(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, uint64(time.Now().UnixNano())))
	var mu sync.Mutex
	for trial := 0; trial < 6; trial++ {
		dir := t.TempDir()
		res := runstatetest.Storm(t, s.child(dir), 3, func(proc, attempt int) runstatetest.Kill {
			if attempt >= 3 {
				return runstatetest.Kill{}
			}
			mu.Lock()
			defer mu.Unlock()
			return runstatetest.Kill{After: time.Duration(rng.Int64N(int64(s.pipeline)+1)) + time.Millisecond}
		})
		s.fig.add(func(f *figures) { f.stormKills += res.Kills })
		s.check(t, dir, res.Kills, false)
	}
}
