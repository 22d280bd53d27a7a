// Package runstatetest helps test that a program built on runstate resumes
// correctly after its session ends abruptly.
//
// It offers three tools, from the cheapest to the most realistic:
//
//   - Crash abandons a *runstate.Run in process, the way a killed process
//     leaves it: locks released, no close record, nothing more written.
//     Open the directory again, in the same test, to resume.
//   - CrashAt arms a named crash point (after a stage's begin record, after
//     its complete record but before the projections, between the
//     projections, after an effect's intent, after its Do): the next
//     crossing crashes the run, and the call that crossed returns an error
//     wrapping ErrCrashed. CrashEverywhere crashes a pipeline at every
//     crossing of every point in turn and checks each resumed run.
//   - Child re-runs the test binary as a child process that runs a
//     registered pipeline (see Register and Main), kills it with SIGKILL at
//     a crash point or after a delay, and restarts it until it finishes;
//     Storm does that with several processes on one run at once.
//
// Examine and CheckResumed then check what must hold after a resumption:
// the ledger verifies, no completed stage whose evidence held was redone,
// no confirmed effect was repeated, no temp file was left behind, and the
// artifacts are byte for byte those of an uninterrupted run.
//
// A crash point that nothing armed costs package runstate one atomic load.
//
// # A run in memory
//
// MemStore keeps a run in memory instead of a run directory's ledger: a
// runstate.Store for unit tests. Each MemStore.Open starts a session on
// its run, so that several Runs in one test share it as processes share a
// directory (one writer lock, catch-up, ErrBusy, interrupted after Crash),
// and MemStore.Crash is a power loss: it drops every line not yet made
// durable and kills every session. Package runstatetest/storetest is the
// conformance suite that the memory store, the file store and the
// PostgreSQL store (module pgstore) pass.
package runstatetest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/testhook"
)

// ErrCrashed is wrapped by the error a call returns when it crossed a
// crash point armed with CrashAt: the run was crashed there.
var ErrCrashed = testhook.ErrCrashed

// Crash abandons run the way a killed process would: the ledger and its
// lock are released, the session's lock is released but its file is left
// behind (so the session looks dead to the next Open), and nothing more is
// written: no close record, no projection. Every later call on run returns
// runstate.ErrClosed (but Close, which returns nil, and Dir, ID and
// Session). What the ledger holds is what a killed process would
// have left: every record appended so far.
//
// Call it when no call on run is in flight (a call in flight may still
// finish the write it is in); to crash in the middle of a call, use
// CrashAt. Safe to call more than once.
func Crash(run *runstate.Run) { testhook.Crash(run) }

// Point is a named place in runstate where a session can be ended.
type Point int

// The crash points.
const (
	// AfterBegin: a stage's begin record is appended; its work has not
	// started. At.Name matches the stage.
	AfterBegin = Point(testhook.AfterBegin)
	// AfterComplete: a stage's complete record is appended and fsync'd,
	// and neither logs/next-steps.txt nor manifest.json reflects it yet.
	// At.Name matches the stage.
	AfterComplete = Point(testhook.AfterComplete)
	// BetweenProjections: an append batch landed and logs/next-steps.txt
	// reflects it, manifest.json does not. Every append crosses it. At.Name
	// matches the stage or effect key of the batch's last record.
	BetweenProjections = Point(testhook.BetweenProjections)
	// AfterIntent: an effect's intent record is durable and its Do has not
	// been called. At.Name matches the effect key.
	AfterIntent = Point(testhook.AfterIntent)
	// AfterDo: an effect's Do returned (the receiving system has it) and
	// its confirm record is not appended. At.Name matches the effect key.
	AfterDo = Point(testhook.AfterDo)
)

// Points lists every crash point.
var Points = []Point{AfterBegin, AfterComplete, BetweenProjections, AfterIntent, AfterDo}

// String returns the point's name: after-begin, after-complete,
// between-projections, after-intent or after-do.
func (p Point) String() string { return testhook.Point(p).String() }

// ParsePoint returns the point named s (as Point.String names it). Safe
// for concurrent use.
func ParsePoint(s string) (Point, error) {
	p, ok := testhook.ParsePoint(s)
	if !ok {
		return 0, fmt.Errorf("runstatetest: no crash point %q", s)
	}
	return Point(p), nil
}

// At selects a crossing of a crash point.
type At struct {
	Point Point  // the crash point; the zero At selects none
	Name  string // the stage or effect key; "" matches any
	Skip  int    // matching crossings to let pass first
}

// String names the crossing: the point, the name and which crossing, as
// in "after-complete fetch (crossing 2)".
func (a At) String() string {
	s := a.Point.String()
	if a.Name != "" {
		s += " " + a.Name
	}
	if a.Skip > 0 {
		s += fmt.Sprintf(" (crossing %d)", a.Skip+1)
	}
	return s
}

// Trap is a crash point armed on a run by CrashAt or Watch. Its methods
// are safe for concurrent use.
type Trap struct {
	count  atomic.Int64
	fired  atomic.Bool
	disarm func()
}

// Fired reports whether the trap crashed its run.
func (tr *Trap) Fired() bool { return tr.fired.Load() }

// Crossings returns how many matching crossings the trap saw while armed
// (for CrashAt, up to and including the one that fired).
func (tr *Trap) Crossings() int { return int(tr.count.Load()) }

// Disarm removes the trap. A trap set by CrashAt disarms itself when it
// fires. Safe to call more than once.
func (tr *Trap) Disarm() { tr.disarm() }

// CrashAt arms a crash point on run: the crossing that at selects crashes
// run as Crash does, at that point, and the call that crossed returns an
// error wrapping ErrCrashed. The trap fires once, then disarms itself.
// Safe for concurrent use.
func CrashAt(run *runstate.Run, at At) *Trap {
	if run == nil {
		panic("runstatetest: CrashAt needs a run")
	}
	tr := &Trap{}
	tr.disarm = testhook.Arm(&testhook.Trigger{Run: run, Point: testhook.Point(at.Point), Name: at.Name, Skip: at.Skip, Count: &tr.count,
		Fire: func(r any, p testhook.Point, name string) error {
			tr.fired.Store(true)
			testhook.Crash(r)
			return fmt.Errorf("%w: %s", ErrCrashed, At{Point: Point(p), Name: name})
		}})
	return tr
}

// Watch counts the crossings of point p (by the stage or effect key name,
// or any when name is "") on run, without crashing it. Disarm it when done:
// while any trap is armed, every crossing takes a mutex. Safe for
// concurrent use.
func Watch(run *runstate.Run, p Point, name string) *Trap {
	if run == nil {
		panic("runstatetest: Watch needs a run")
	}
	tr := &Trap{}
	tr.disarm = testhook.Arm(&testhook.Trigger{Run: run, Point: testhook.Point(p), Name: name, Count: &tr.count})
	return tr
}

// Pipeline is the work of a program on a run: it does the run's stages and
// effects and returns nil when everything is done. For the checks to
// hold it must be deterministic (the same outputs every time) and resumable
// (called again on a resumed run, it carries on).
type Pipeline func(ctx context.Context, run *runstate.Run) error

// Summary is what CrashEverywhere did.
type Summary struct {
	Crossings map[Point]int // crossings of each point in the uninterrupted run
	Crashes   int           // crashes, one at each crossing
	Resumed   int           // resumed runs that passed every check
}

// CrashEverywhere checks that p resumes correctly from a crash at every
// crossing of every crash point. It runs p once uninterrupted, counting
// the crossings; then, for each crossing, in a fresh directory: it runs p,
// crashes the run at that crossing, opens the directory again and runs p
// until it returns nil, closes the run and checks it with CheckResumed
// against the uninterrupted one. opts are the Options for every Open.
// Every run is in a directory of t.TempDir. Failures are reported through
// t; the summary says what was tried. It runs one crash at a time; call it
// from parallel tests as you like.
func CrashEverywhere(t testing.TB, opts *runstate.Options, p Pipeline) Summary {
	t.Helper()
	ctx := context.Background()
	ref := t.TempDir()
	run, err := runstate.Open(ref, opts)
	if err != nil {
		t.Fatalf("runstatetest: open the reference run: %v", err)
	}
	watches := map[Point]*Trap{}
	for _, pt := range Points {
		watches[pt] = Watch(run, pt, "")
	}
	err = p(ctx, run)
	for _, w := range watches {
		w.Disarm()
	}
	if err != nil {
		t.Fatalf("runstatetest: the uninterrupted run failed: %v", err)
	}
	if err := run.Close(); err != nil {
		t.Fatalf("runstatetest: close the reference run: %v", err)
	}
	sum := Summary{Crossings: map[Point]int{}}
	for _, pt := range Points {
		sum.Crossings[pt] = watches[pt].Crossings()
	}
	for _, pt := range Points {
		for i := 0; i < sum.Crossings[pt]; i++ {
			at := At{Point: pt, Skip: i}
			if crashAndResume(t, opts, p, at, ref) {
				sum.Resumed++
			}
			sum.Crashes++
		}
	}
	return sum
}

// crashAndResume runs p in a fresh directory, crashes it at at, resumes it
// to the end and checks the result against ref.
func crashAndResume(t testing.TB, opts *runstate.Options, p Pipeline, at At, ref string) bool {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	run, err := runstate.Open(dir, opts)
	if err != nil {
		t.Errorf("runstatetest: crash %s: open: %v", at, err)
		return false
	}
	trap := CrashAt(run, at)
	err = p(ctx, run)
	trap.Disarm()
	if !trap.Fired() {
		t.Errorf("runstatetest: crash %s: the pipeline never got there (is it deterministic?); it returned %v", at, err)
		_ = run.Close()
		return false
	}
	if err == nil {
		t.Errorf("runstatetest: crash %s: the pipeline returned nil after its run crashed: does it drop errors?", at)
	}
	for tries := 1; ; tries++ {
		run, err = runstate.Open(dir, opts)
		if err != nil {
			t.Errorf("runstatetest: crash %s: reopen: %v", at, err)
			return false
		}
		err = p(ctx, run)
		if err == nil {
			break
		}
		Crash(run)
		if tries == 5 {
			t.Errorf("runstatetest: crash %s: the resumed pipeline failed %d times; last: %v", at, tries, err)
			return false
		}
	}
	if err := run.Close(); err != nil {
		t.Errorf("runstatetest: crash %s: close: %v", at, err)
		return false
	}
	f, err := Examine(dir, ref)
	if err != nil {
		t.Errorf("runstatetest: crash %s: %v", at, err)
		return false
	}
	if !f.OK() {
		t.Errorf("runstatetest: crash %s: resumed run differs from the uninterrupted one:\n%s", at, f)
		return false
	}
	return true
}
