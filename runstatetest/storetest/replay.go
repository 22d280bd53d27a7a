package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
)

// status returns run's Status after catching up with the other sessions.
func status(t *testing.T, ctx context.Context, run *runstate.Run) *runstate.Status {
	t.Helper()
	if err := run.Refresh(ctx); err != nil {
		t.Fatalf("session %s: Refresh: %v", run.Session(), err)
	}
	st, err := run.Status()
	if err != nil {
		t.Fatalf("session %s: Status: %v", run.Session(), err)
	}
	return st
}

// stageState returns the state of stage in st ("" when st has none).
func stageState(st *runstate.Status, stage string) string {
	s, _ := st.Stage(stage)
	return s.State
}

// testRoundTrips: what one session records with Plan, Do (with an
// output), Skip, Await, Approve and Invalidate, the next session reads
// back and acts on.
func testRoundTrips(t *testing.T, h Harness) {
	ctx := testContext(t)
	calls := map[string]int{}
	work := func(name string) func(context.Context, *runstate.Stage) error {
		return func(_ context.Context, st *runstate.Stage) error {
			calls[name]++
			return st.WriteFile("artifacts/"+name+".txt", []byte("made by "+name+"\n"))
		}
	}
	plan := []string{"a", "b", "c", "d"}
	afterA := runstate.After("a") // c's evidence: a's output

	a := open(t, h)
	if err := a.Plan(ctx, plan...); err != nil {
		t.Fatalf("Plan: %v", err)
	}
	if err := a.Do(ctx, "a", work("a")); err != nil {
		t.Fatalf("Do a: %v", err)
	}
	if err := a.Skip(ctx, "b", "docs-only change"); err != nil {
		t.Fatalf("Skip b: %v", err)
	}
	err := a.Do(ctx, "c", func(_ context.Context, st *runstate.Stage) error {
		calls["c"]++
		return st.Await("review the diff")
	}, afterA)
	wantErr(t, err, runstate.ErrNeedsPerson, "Do of a stage that awaits a review")
	closeRun(t, a)

	b := open(t, h)
	st := status(t, ctx, b)
	if !slices.Equal(st.Plan, plan) {
		t.Errorf("the next session's plan is %q, want %q", st.Plan, plan)
	}
	for stage, want := range map[string]string{"a": runstate.StateComplete, "b": runstate.StateSkipped, "c": runstate.StateAwaiting, "d": runstate.StatePending} {
		if got := stageState(st, stage); got != want {
			t.Errorf("in the next session stage %s is %q, want %q", stage, got, want)
		}
	}
	if sa, _ := st.Stage("a"); len(sa.Outputs) != 1 || sa.Outputs[0].Path != "artifacts/a.txt" {
		t.Errorf("stage a's outputs in the next session: %+v, want artifacts/a.txt", sa.Outputs)
	}
	if sb, _ := st.Stage("b"); sb.Reason != "docs-only change" {
		t.Errorf("stage b's skip reason is %q", sb.Reason)
	}
	if err := b.Plan(ctx, plan...); err != nil {
		t.Fatalf("Plan again: %v", err)
	}
	if err := b.Do(ctx, "a", work("a")); err != nil {
		t.Fatalf("Do a in the next session: %v", err)
	}
	if calls["a"] != 1 {
		t.Errorf("the next session redid stage a, complete with its output in place (fn ran %d times)", calls["a"])
	}
	_, err = b.Begin(ctx, "b")
	wantErr(t, err, runstate.ErrDone, "Begin of a skipped stage")
	_, err = b.Begin(ctx, "c", afterA)
	wantErr(t, err, runstate.ErrNeedsPerson, "Begin of a stage awaiting a review")
	if err := b.Approve(ctx, "c", "reviewer@example.com", "looks right"); err != nil {
		t.Fatalf("Approve c: %v", err)
	}
	_, err = b.Begin(ctx, "c", afterA)
	wantErr(t, err, runstate.ErrDone, "Begin of an approved review")
	if err := b.Invalidate(ctx, "a", "ticket was re-scoped"); err != nil {
		t.Fatalf("Invalidate a: %v", err)
	}
	if got := stageState(status(t, ctx, b), "a"); got != runstate.StatePending {
		t.Errorf("after Invalidate stage a is %q, want pending", got)
	}
	if err := b.Do(ctx, "a", work("a")); err != nil {
		t.Fatalf("Do a after Invalidate: %v", err)
	}
	if calls["a"] != 2 {
		t.Errorf("stage a ran %d times after Invalidate, want 2", calls["a"])
	}
	if err := b.Do(ctx, "d", work("d")); err != nil {
		t.Fatalf("Do d: %v", err)
	}
	closeRun(t, b)

	c := open(t, h)
	st = status(t, ctx, c)
	if st.Done != len(plan) || st.Remaining != 0 {
		t.Errorf("the last session finds %d stages done and %d remaining, want %d and 0", st.Done, st.Remaining, len(plan))
	}
	for _, stage := range plan {
		var inputs []runstate.Input
		if stage == "c" {
			inputs = append(inputs, afterA) // a was redone with the same output: c holds
		}
		if err := c.Do(ctx, stage, work(stage), inputs...); err != nil {
			t.Errorf("Do %s in the last session: %v", stage, err)
		}
	}
	if calls["a"] != 2 || calls["c"] != 1 || calls["d"] != 1 || calls["b"] != 0 {
		t.Errorf("work done per stage: %v, want a:2 c:1 d:1", calls)
	}

	recs := records(t, h)
	want := map[string]int{"plan": 1, "skip": 1, "await": 1, "approve": 1, "invalidate": 1}
	for ev, n := range want {
		got := 0
		for _, rec := range recs {
			if rec.Ev == ev {
				got++
			}
		}
		if got != n {
			t.Errorf("%d %s records, want %d", got, ev, n)
		}
	}
	if inv := find(recs, "invalidate", "a"); len(inv) != 1 || inv[0].Reason != "ticket was re-scoped" || inv[0].By == "" {
		t.Errorf("invalidate records of a: %+v, want one with the reason and who asked", inv)
	}
	if ap := find(recs, "approve", "c"); len(ap) != 1 || ap[0].By != "reviewer@example.com" || ap[0].Note != "looks right" {
		t.Errorf("approve records of c: %+v", ap)
	}
}

// comparable returns st as JSON without what depends on where and how it
// was read (the directory, the address the Actions name, a torn tail the
// reader skipped).
func comparable(t *testing.T, st *runstate.Status) string {
	t.Helper()
	c := *st
	c.Dir, c.Torn = "", 0
	// Where the run is: the Actions' commands name it as Address.
	c.Blockers = slices.Clone(c.Blockers)
	for i, b := range c.Blockers {
		if c.Address != "" {
			c.Blockers[i].Action = strings.ReplaceAll(b.Action, c.Address, "ADDRESS")
		}
	}
	c.Address = ""
	b, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// replay returns the Status of a full replay of lines: runstate.Inspect
// of a run directory that holds only them, so no snapshot.
func replay(t *testing.T, lines [][]byte) *runstate.Status {
	t.Helper()
	st, err := runstate.Inspect(exportRun(t, lines))
	if err != nil {
		t.Fatalf("replay the ledger's %d lines: %v", len(lines), err)
	}
	return st
}

// testSnapshotAndTail: a session opened on a run with history (a closed
// session, a crashed one, a live one appending) is at the state of a full
// replay of the ledger, and so is every live session after Refresh.
func testSnapshotAndTail(t *testing.T, h Harness) {
	ctx := testContext(t)
	rcv := newReceiver()
	noop := func(context.Context, *runstate.Stage) error { return nil }

	a := open(t, h)
	if err := a.Plan(ctx, "s1", "s2", "s3", "s4", "s5"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"s1", "s2"} {
		if err := a.Do(ctx, s, noop); err != nil {
			t.Fatalf("Do %s: %v", s, err)
		}
	}
	if _, err := a.Effect(ctx, "k1", rcv.effect(false)); err != nil {
		t.Fatal(err)
	}
	closeRun(t, a) // a snapshot for the next Open

	b := open(t, h)
	if err := b.Do(ctx, "s3", noop, runstate.After("s2")); err != nil {
		t.Fatalf("Do s3: %v", err)
	}
	begin(t, ctx, b, "s4") // left running
	if _, err := b.Effect(ctx, "k2", rcv.effect(false)); err != nil {
		t.Fatal(err)
	}
	if err := b.Invalidate(ctx, "s1", "redo it"); err != nil {
		t.Fatal(err)
	}
	h.Crash(t, b)

	d := open(t, h)
	if err := d.Do(ctx, "s5", noop); err != nil {
		t.Fatalf("Do s5: %v", err)
	}
	if err := d.Do(ctx, "s1", noop); err != nil {
		t.Fatalf("Do s1: %v", err)
	}

	c := open(t, h)
	cs, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	lines := h.Lines(t)
	full := replay(t, lines)
	if full.Seq != int64(len(lines)) {
		t.Errorf("the replay ends at seq %d, the ledger has %d lines", full.Seq, len(lines))
	}
	if got, want := comparable(t, cs), comparable(t, full); got != want {
		t.Errorf("the Status of a reopened run differs from a full replay of the ledger (snapshot + tail is not the ledger):\nreopened: %s\nreplayed: %s", got, want)
	}
	if got, want := comparable(t, status(t, ctx, d)), comparable(t, full); got != want {
		t.Errorf("the Status of a live session after Refresh differs from a full replay of the ledger:\nlive:     %s\nreplayed: %s", got, want)
	}
	if got := stageState(full, "s4"); got != runstate.StateInterrupted {
		t.Errorf("s4, left running by the crashed session, is %q, want interrupted", got)
	}
}

// testLedgerVerifies: a run with every kind of record exports to a run
// directory whose ledger passes runstate.Verify.
func testLedgerVerifies(t *testing.T, h Harness) {
	ctx := testContext(t)
	rcv := newReceiver()
	a := open(t, h)
	if err := a.Plan(ctx, "fetch", "build", "review", "deploy"); err != nil {
		t.Fatal(err)
	}
	if err := a.Do(ctx, "fetch", func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/fetch.txt", []byte("fetched\n"))
	}); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("compiler crashed")
	if err := a.Do(ctx, "build", func(context.Context, *runstate.Stage) error { return failed }, runstate.Value("flags", []string{"-O2"})); !errors.Is(err, failed) {
		t.Fatalf("Do of a failing stage returned %v", err)
	}
	if err := a.Do(ctx, "build", func(context.Context, *runstate.Stage) error { return nil }, runstate.Value("flags", []string{"-O2"}), runstate.After("fetch")); err != nil {
		t.Fatal(err)
	}
	if err := a.Do(ctx, "review", func(_ context.Context, st *runstate.Stage) error { return st.Await("check it") }); !errors.Is(err, runstate.ErrNeedsPerson) {
		t.Fatalf("Await returned %v", err)
	}
	if err := a.Approve(ctx, "review", "reviewer", "fine"); err != nil {
		t.Fatal(err)
	}
	if err := a.Skip(ctx, "deploy", "dry run"); err != nil {
		t.Fatal(err)
	}
	if err := a.Invalidate(ctx, "deploy", "not a dry run after all"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Effect(ctx, "ticket", rcv.effect(false)); err != nil {
		t.Fatal(err)
	}
	// An effect that fails with no Check is unconfirmed; a person resolves it.
	_, err := a.Effect(ctx, "mail", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, fmt.Errorf("connection reset")
	}})
	wantErr(t, err, runstate.ErrUnconfirmed, "Effect whose Do failed, without a Check")
	if err := a.Resolve(ctx, "mail", runstate.Resolution{Sent: false, By: "operator", Note: "bounced"}); err != nil {
		t.Fatal(err)
	}
	begin(t, ctx, a, "deploy")
	h.Crash(t, a)
	b := open(t, h)
	if err := b.Do(ctx, "deploy", func(context.Context, *runstate.Stage) error { return nil }); err != nil {
		t.Fatal(err)
	}
	closeRun(t, b)

	lines := h.Lines(t)
	dir := exportRun(t, lines)
	rep, err := runstate.Verify(dir)
	if err != nil {
		t.Fatalf("Verify the exported ledger: %v", err)
	}
	ledger := filepath.Join(dir, "logs", "ledger.jsonl")
	for _, p := range rep.Problems {
		// The export has no projections and no outputs; everything else
		// Verify finds is the ledger's.
		if p.File == ledger || p.Line != 0 {
			t.Errorf("Verify of the exported ledger: %s", p)
		}
	}
	if rep.Records != int64(len(lines)) {
		t.Errorf("Verify passed %d records of the %d lines", rep.Records, len(lines))
	}
	evs := map[string]bool{}
	for _, rec := range chain(t, lines) {
		evs[rec.Ev] = true
	}
	for _, ev := range []string{"create", "open", "close", "plan", "begin", "complete", "fail", "skip", "interrupted", "invalidate", "await", "approve", "intent", "confirm", "unconfirmed", "resolve"} {
		if !evs[ev] {
			t.Errorf("the workload wrote no %s record (the check would not cover it)", ev)
		}
	}
}

// testPowerLoss: after a power loss every acknowledged record is still in
// the ledger, byte for byte, the sessions that were open are gone, and
// the run opens and goes on.
func testPowerLoss(t *testing.T, h Harness) {
	pl := h.(PowerLosser)
	ctx := testContext(t)
	a := open(t, h)
	b := open(t, h)
	if err := a.Do(ctx, "s1", func(context.Context, *runstate.Stage) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Effect(ctx, "k1", newReceiver().effect(false)); err != nil {
		t.Fatal(err)
	}
	acked := h.Lines(t) // each ends in an acknowledged record
	begin(t, ctx, a, "s2")
	begin(t, ctx, b, "s3")
	before := len(h.Lines(t))
	pl.PowerLoss(t)

	for _, run := range []*runstate.Run{a, b} {
		if err := run.Skip(ctx, "after", "the power is gone"); err == nil {
			t.Errorf("session %s appended after the power loss", run.Session())
		}
	}
	after := h.Lines(t)
	t.Logf("the power loss kept %d of %d lines (%d acknowledged)", len(after), before, len(acked))
	if len(after) < len(acked) {
		t.Fatalf("after the power loss the ledger has %d lines, %d were acknowledged", len(after), len(acked))
	}
	for i := range acked {
		if !bytes.Equal(after[i], acked[i]) {
			t.Fatalf("after the power loss ledger line %d differs from the acknowledged one:\n%s\n%s", i+1, after[i], acked[i])
		}
	}
	chain(t, after)
	c := open(t, h)
	st := status(t, ctx, c)
	if got := stageState(st, "s1"); got != runstate.StateComplete {
		t.Errorf("s1 is %q after the power loss, want complete", got)
	}
	for _, s := range []string{"s2", "s3"} {
		stg, err := c.Begin(ctx, s)
		if err != nil {
			t.Fatalf("Begin %s after the power loss: %v (its session is gone)", s, err)
		}
		if err := stg.Complete(); err != nil {
			t.Fatal(err)
		}
	}
	for _, rec := range records(t, h) {
		if rec.Ev == "skip" && rec.Stage == "after" {
			t.Errorf("a record of a session killed by the power loss: seq %d", rec.Seq)
		}
	}
}

// testStoreReaders: the store-generic readers, on a Store that no session
// opened, read a consistent prefix while sessions append, and see what a
// full replay of the ledger sees while a session is open and after it
// closed.
func testStoreReaders(t *testing.T, h Harness) {
	r := h.(Reader)
	ctx := testContext(t)
	a := open(t, h)
	if err := a.Plan(ctx, "s1", "s2"); err != nil {
		t.Fatal(err)
	}

	// Readers while two sessions append: every read is a valid prefix.
	stop := make(chan struct{})
	readErr := make(chan error, 1)
	reads := 0
	go func() {
		defer close(readErr)
		for last := int64(0); ; reads++ {
			select {
			case <-stop:
				return
			default:
			}
			st, err := runstate.InspectStore(ctx, r.Store(t))
			if err == nil && st.Seq < last {
				err = fmt.Errorf("a read ended at seq %d after one that reached seq %d", st.Seq, last)
			}
			if err != nil {
				readErr <- err
				return
			}
			last = st.Seq
		}
	}()
	b := open(t, h)
	fanOut(t, []*runstate.Run{a, b}, 2, func(i, w int, run *runstate.Run) error {
		for j := range 5 {
			if err := run.Do(ctx, fmt.Sprintf("r%d-%d-%d", i, w, j), func(context.Context, *runstate.Stage) error { return nil }); err != nil {
				return err
			}
		}
		return nil
	})
	close(stop)
	if err := <-readErr; err != nil {
		t.Errorf("InspectStore while sessions append (read %d): %v", reads+1, err)
	}
	closeRun(t, b)

	if err := a.Do(ctx, "s1", func(context.Context, *runstate.Stage) error { return nil }); err != nil {
		t.Fatal(err)
	}
	begin(t, ctx, a, "s2")
	for round := range 2 {
		s := r.Store(t)
		got, lines := inspectStable(t, ctx, h, s)
		if g, w := comparable(t, got), comparable(t, replay(t, lines)); g != w {
			t.Errorf("round %d: InspectStore differs from a full replay of the lines:\nstore:    %s\nreplayed: %s", round, g, w)
		}
		rep, err := runstate.VerifyStore(ctx, s, t.TempDir())
		if err != nil {
			t.Fatalf("VerifyStore on %s: %v", s, err)
		}
		for _, p := range rep.Problems {
			if p.Line != 0 || p.File == s.String() {
				t.Errorf("round %d: VerifyStore: %s", round, p)
			}
		}
		if round == 0 {
			closeRun(t, a)
		}
	}
}

// inspectStable returns InspectStore's status of s and the ledger's lines
// as of the same moment: read between two reads of the lines that agree.
// A store whose records become visible after the call that wrote them
// returned (a begin, which needs no fsync, committed asynchronously) may
// show one more line to the second read; the read is then tried again.
func inspectStable(t *testing.T, ctx context.Context, h Harness, s runstate.Store) (*runstate.Status, [][]byte) {
	t.Helper()
	for try := 1; ; try++ {
		before := h.Lines(t)
		st, err := runstate.InspectStore(ctx, s)
		if err != nil {
			t.Fatalf("InspectStore on %s: %v", s, err)
		}
		after := h.Lines(t)
		if len(before) == len(after) {
			return st, after
		}
		if try == 50 {
			t.Fatalf("the ledger still grows (%d lines, then %d) with no call in flight", len(before), len(after))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
