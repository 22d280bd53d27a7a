package runstatetest_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

// TestMemStoreAdviceNamesTheRunMethod: a run in a memory store has no
// address that a runstate command could reach (its Address is ""), so
// what a person is told to do — in the errors of Begin (an awaiting or a
// fatal stage) and of a failed Effect, in the Status and InspectStore
// blocker Actions and in the handoff — is the Run method to call, not a
// 'runstate approve DIR' (or the working directory) that reaches nothing.
func TestMemStoreAdviceNamesTheRunMethod(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	dir := t.TempDir()
	r, err := m.Open(dir, &runstate.Options{Request: "advice"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	st, err := r.Begin(ctx, "review")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Await("read the diff"); !errors.Is(err, runstate.ErrNeedsPerson) {
		t.Fatalf("Await: %v", err)
	}
	if st, err = r.Begin(ctx, "deploy"); err != nil {
		t.Fatal(err)
	}
	if err := st.Fail(runstate.Fatal(errors.New("the schema is gone"))); err != nil {
		t.Fatal(err)
	}
	_, effect := r.Effect(ctx, "ticket", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, errors.New("timeout")
	}})
	_, awaiting := r.Begin(ctx, "review")
	_, fatal := r.Begin(ctx, "deploy")
	const where = " in the program that holds the run (no runstate command reads its store)"
	for _, c := range []struct {
		err  error
		is   error
		want string
	}{
		{awaiting, runstate.ErrNeedsPerson, `approve it with: call Run.Approve(ctx, "review", NAME, TEXT)` + where},
		{fatal, runstate.ErrFatal, `fix the cause, then: call Run.Invalidate(ctx, "deploy", TEXT)` + where},
		{effect, runstate.ErrUnconfirmed, `resolve it with: call Run.Resolve(ctx, "ticket", runstate.Resolution{Sent: true, Receipt: RECEIPT, By: NAME}) (or Sent: false)` + where},
	} {
		if !errors.Is(c.err, c.is) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("error %v: want %v and the advice %q", c.err, c.is, c.want)
		}
	}
	want := map[string]string{
		"review": `call Run.Approve(ctx, "review", NAME, TEXT)` + where,
		"deploy": `fix the cause, then: call Run.Invalidate(ctx, "deploy", TEXT)` + where,
		"ticket": `check the receiving system, then: call Run.Resolve(ctx, "ticket", runstate.Resolution{Sent: true, Receipt: RECEIPT, By: NAME}) (or Sent: false)` + where +
			"; a later Effect call for this key asks its Check again first, if it has one",
	}
	status, err := r.Status()
	if err != nil {
		t.Fatal(err)
	}
	inspected, err := runstate.InspectStore(ctx, m.Session())
	if err != nil {
		t.Fatal(err)
	}
	page, err := r.NextSteps()
	if err != nil {
		t.Fatal(err)
	}
	for what, st := range map[string]*runstate.Status{"Run.Status": status, "InspectStore": inspected} {
		if len(st.Blockers) != len(want) {
			t.Errorf("%s: %d blockers, want %d: %+v", what, len(st.Blockers), len(want), st.Blockers)
		}
		for _, b := range st.Blockers {
			if w := want[b.Stage+b.Key]; b.Action != w {
				t.Errorf("%s: the Action of %s%s is %q, want %q", what, b.Stage, b.Key, b.Action, w)
			}
			if !strings.Contains(page, "    do: "+b.Action+"\n") {
				t.Errorf("the handoff does not say %q:\n%s", b.Action, page)
			}
		}
	}
	for _, text := range []string{awaiting.Error(), fatal.Error(), effect.Error(), page} {
		if strings.Contains(text, "runstate approve") || strings.Contains(text, "runstate invalidate") ||
			strings.Contains(text, "runstate resolve") || strings.Contains(text, dir) {
			t.Errorf("names a command that cannot reach a memory store, or the working directory:\n%s", text)
		}
	}
}
