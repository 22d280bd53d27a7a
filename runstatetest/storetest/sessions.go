package storetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runstate/runstate"
)

// begin begins stage on run and fails the test when it cannot.
func begin(t *testing.T, ctx context.Context, run *runstate.Run, stage string, inputs ...runstate.Input) *runstate.Stage {
	t.Helper()
	st, err := run.Begin(ctx, stage, inputs...)
	if err != nil {
		t.Fatalf("session %s: Begin %s: %v", run.Session(), stage, err)
	}
	return st
}

// wantErr fails the test unless err wraps want.
func wantErr(t *testing.T, err, want error, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v", what, err, want)
	}
}

// testBusy: a stage that a live session began is ErrBusy for every other
// session and for the holder itself, also after the holder appended other
// records; once the holder closed, it is interrupted and begun again.
func testBusy(t *testing.T, h Harness) {
	ctx := testContext(t)
	a := open(t, h)
	b := open(t, h)
	stA := begin(t, ctx, a, "x")

	_, err := b.Begin(ctx, "x")
	wantErr(t, err, runstate.ErrBusy, "another session's Begin of a stage a live session runs")
	called := false
	err = b.Do(ctx, "x", func(context.Context, *runstate.Stage) error { called = true; return nil })
	wantErr(t, err, runstate.ErrBusy, "another session's Do of a stage a live session runs")
	if called {
		t.Errorf("Do ran fn of a stage that a live session runs")
	}
	_, err = a.Begin(ctx, "x")
	wantErr(t, err, runstate.ErrBusy, "the holder's own second Begin")

	// The holder goes on appending; it stays alive for the others.
	if err := a.Skip(ctx, "other", "not needed"); err != nil {
		t.Fatalf("holder's Skip: %v", err)
	}
	if err := b.Skip(ctx, "another", "not needed"); err != nil {
		t.Fatalf("Skip: %v", err)
	}
	_, err = b.Begin(ctx, "x")
	wantErr(t, err, runstate.ErrBusy, "Begin after the holder appended more")
	c := open(t, h) // a session that opens while the holder runs
	_, err = c.Begin(ctx, "x")
	wantErr(t, err, runstate.ErrBusy, "Begin in a session opened while the holder runs")

	if err := stA.Complete(); err != nil {
		t.Fatalf("holder's Complete: %v", err)
	}
	_, err = b.Begin(ctx, "x")
	wantErr(t, err, runstate.ErrDone, "Begin of the stage the holder completed")

	// A session that closed is gone: what it left running is interrupted.
	begin(t, ctx, a, "y")
	closeRun(t, a)
	stB, err := b.Begin(ctx, "y")
	if err != nil {
		t.Fatalf("Begin of a stage whose session closed: %v (a closed session must count as gone)", err)
	}
	if stB.Attempt() != 2 {
		t.Errorf("stage y begun again as attempt %d, want 2", stB.Attempt())
	}
	if err := stB.Complete(); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	recs := records(t, h)
	if n := len(find(recs, "interrupted", "y")); n != 1 {
		t.Errorf("%d interrupted records for y after its session closed, want 1", n)
	}
	if n := len(find(recs, "begin", "x")); n != 1 {
		t.Errorf("stage x begun %d times, want once", n)
	}
}

// testInterruptedAfterCrash: a stage begun by a session that crashed is
// recorded as interrupted, naming that session, and is begun again as
// attempt 2 by a session that was already open and by one opened after;
// only one of them gets it.
func testInterruptedAfterCrash(t *testing.T, h Harness) {
	ctx := testContext(t)
	a := open(t, h)
	b := open(t, h) // open before the crash: it must learn of it later
	begin(t, ctx, a, "x")
	begin(t, ctx, a, "z")
	_, err := b.Begin(ctx, "x")
	wantErr(t, err, runstate.ErrBusy, "Begin while the holder is alive")
	dead := a.Session()
	h.Crash(t, a)
	crashedAt := len(h.Lines(t))

	stB, err := b.Begin(ctx, "x")
	if err != nil {
		t.Fatalf("Begin of a stage whose session crashed: %v (a crashed session must count as gone)", err)
	}
	if stB.Attempt() != 2 {
		t.Errorf("x begun again as attempt %d, want 2", stB.Attempt())
	}
	if !strings.Contains(stB.Reason(), "interrupted") {
		t.Errorf("x attempt 2's reason is %q, want it to say attempt 1 was interrupted", stB.Reason())
	}
	c := open(t, h) // a session opened after the crash
	_, err = c.Begin(ctx, "x")
	wantErr(t, err, runstate.ErrBusy, "Begin of the stage the live session took over")
	stC := begin(t, ctx, c, "z")
	if stC.Attempt() != 2 {
		t.Errorf("z begun again as attempt %d, want 2", stC.Attempt())
	}
	if err := stB.Complete(); err != nil {
		t.Fatalf("Complete x: %v", err)
	}
	if err := stC.Complete(); err != nil {
		t.Fatalf("Complete z: %v", err)
	}

	recs := records(t, h)
	for _, stage := range []string{"x", "z"} {
		ints := find(recs, "interrupted", stage)
		if len(ints) != 1 {
			t.Errorf("%d interrupted records for %s, want 1", len(ints), stage)
			continue
		}
		if ints[0].Attempt != 1 || !strings.Contains(ints[0].Reason, dead) {
			t.Errorf("interrupted record for %s: attempt %d, reason %q; want attempt 1 and the crashed session %s named", stage, ints[0].Attempt, ints[0].Reason, dead)
		}
		begins := find(recs, "begin", stage)
		if len(begins) != 2 || begins[1].Seq < ints[0].Seq {
			t.Errorf("%s: %d begin records, want 2, the second after the interrupted record", stage, len(begins))
		}
	}
	for _, rec := range recs {
		if rec.Session == dead && rec.Seq > int64(crashedAt) {
			t.Errorf("a %s record (seq %d) of the crashed session, written after its crash", rec.Ev, rec.Seq)
		}
	}
	if n := len(countEv(recs, "complete")); n != 2 {
		t.Errorf("%d attempts complete, want 2", n)
	}
}

// testStaleInput: an input that changes while its stage runs makes
// Complete return ErrStale and record no complete; the stage is then
// redone, once, and its evidence holds in the next session.
func testStaleInput(t *testing.T, h Harness) {
	ctx := testContext(t)
	in := filepath.Join(t.TempDir(), "input.txt")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(in, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("v1")
	a := open(t, h)
	st := begin(t, ctx, a, "build", runstate.File(in))
	write("v2") // while the stage runs
	wantErr(t, st.Complete(), runstate.ErrStale, "Complete after its input changed")

	recs := records(t, h)
	if n := len(find(recs, "complete", "build")); n != 0 {
		t.Errorf("%d complete records for a stage whose input changed while it ran, want 0", n)
	}
	if n := len(find(recs, "invalidate", "build")); n != 1 {
		t.Errorf("%d invalidate records for the stale attempt, want 1", n)
	}

	calls := 0
	build := func(context.Context, *runstate.Stage) error { calls++; return nil }
	if err := a.Do(ctx, "build", build, runstate.File(in)); err != nil {
		t.Fatalf("Do after ErrStale: %v", err)
	}
	if err := a.Do(ctx, "build", build, runstate.File(in)); err != nil {
		t.Fatalf("Do with the evidence holding: %v", err)
	}
	if calls != 1 {
		t.Errorf("fn ran %d times after the stale attempt, want 1", calls)
	}
	b := open(t, h)
	if err := b.Do(ctx, "build", build, runstate.File(in)); err != nil {
		t.Fatalf("Do in the next session: %v", err)
	}
	if calls != 1 {
		t.Errorf("the next session redid a stage whose evidence holds (fn ran %d times)", calls)
	}
	write("v3")
	if err := b.Do(ctx, "build", build, runstate.File(in)); err != nil {
		t.Fatalf("Do after the input changed: %v", err)
	}
	if calls != 2 {
		t.Errorf("fn ran %d times after the input changed, want 2", calls)
	}
	recs = records(t, h)
	if n := len(find(recs, "complete", "build")); n != 2 {
		t.Errorf("%d complete records, want 2", n)
	}
}
