package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

// receiver is a fake receiving system: it counts the effects sent to it
// by idempotency key and answers Check from what it got.
type receiver struct {
	mu   sync.Mutex
	sent map[string]int // full key ("<run-id>:<key>") → Do calls
}

func newReceiver() *receiver { return &receiver{sent: map[string]int{}} }

// receipt is what the receiver answers for key.
func receipt(key string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"ticket": key})
	return b
}

// effect returns an Effect that sends to r; withCheck adds its Check.
func (r *receiver) effect(withCheck bool) runstate.Effect {
	e := runstate.Effect{
		Request: map[string]string{"title": "flaky test"},
		Do: func(_ context.Context, key string) (json.RawMessage, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.sent[key]++
			return receipt(key), nil
		},
	}
	if withCheck {
		e.Check = func(_ context.Context, key string) (json.RawMessage, bool, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return receipt(key), r.sent[key] > 0, nil
		}
	}
	return e
}

// calls returns how often Do was called for the short key (the part after
// the run id).
func (r *receiver) calls(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for full, c := range r.sent {
		if strings.HasSuffix(full, ":"+key) {
			n += c
		}
	}
	return n
}

// receiptErr says how got differs from the receipt the receiver gave for
// key on run, or returns nil.
func receiptErr(run *runstate.Run, key string, got json.RawMessage) error {
	want := receipt(run.ID() + ":" + key)
	var a, b any
	if json.Unmarshal(got, &a) != nil || json.Unmarshal(want, &b) != nil || fmt.Sprint(a) != fmt.Sprint(b) {
		return fmt.Errorf("effect %s: receipt %s, want %s", key, got, want)
	}
	return nil
}

// wantReceipt fails the test unless got is the receipt the receiver gave
// for key.
func wantReceipt(t *testing.T, run *runstate.Run, key string, got json.RawMessage) {
	t.Helper()
	if err := receiptErr(run, key, got); err != nil {
		t.Error(err)
	}
}

// testEffectOnce: an Effect's Do is called once per key: again in the same
// session, in another session that opened before the confirm, in sessions
// racing for the key, after the confirming session crashed, and after a
// crash between the intent and Do or between Do and the confirm (Check
// settles those).
func testEffectOnce(t *testing.T, h Harness) {
	ctx := testContext(t)
	rcv := newReceiver()
	a := open(t, h)
	b := open(t, h) // opened before a's confirm: must catch up to see it

	got, err := a.Effect(ctx, "k1", rcv.effect(false))
	if err != nil {
		t.Fatalf("Effect k1: %v", err)
	}
	wantReceipt(t, a, "k1", got)
	for _, run := range []*runstate.Run{a, b} {
		got, err := run.Effect(ctx, "k1", rcv.effect(false))
		if err != nil {
			t.Fatalf("session %s: Effect k1 again: %v", run.Session(), err)
		}
		wantReceipt(t, run, "k1", got)
	}

	// Sessions racing for the same keys.
	runs := []*runstate.Run{a, b, open(t, h)}
	keys := []string{"k2", "k3", "k4"}
	fanOut(t, runs, 2, func(i, w int, run *runstate.Run) error {
		for k := range keys {
			key := keys[(i+w+k)%len(keys)]
			var got json.RawMessage
			err := untilNotBusy(ctx, func() (err error) {
				got, err = run.Effect(ctx, key, rcv.effect(true))
				return err
			})
			if err != nil {
				return fmt.Errorf("effect %s: %w", key, err)
			}
			if err := receiptErr(run, key, got); err != nil {
				return err
			}
		}
		return nil
	})

	// The confirming session crashes; the next one finds the receipt.
	c := open(t, h)
	if _, err := c.Effect(ctx, "k5", rcv.effect(false)); err != nil {
		t.Fatalf("Effect k5: %v", err)
	}
	h.Crash(t, c)
	d := open(t, h)
	got, err = d.Effect(ctx, "k5", rcv.effect(false))
	if err != nil {
		t.Fatalf("Effect k5 after its session crashed: %v", err)
	}
	wantReceipt(t, d, "k5", got)

	// A crash after the intent, before Do: Check finds nothing, Do runs.
	e := open(t, h)
	trap := runstatetest.CrashAt(e, runstatetest.At{Point: runstatetest.AfterIntent, Name: "k6"})
	_, err = e.Effect(ctx, "k6", rcv.effect(true))
	trap.Disarm()
	if !trap.Fired() || !errors.Is(err, runstatetest.ErrCrashed) {
		t.Fatalf("Effect k6 with a crash after its intent returned %v (trap fired: %v)", err, trap.Fired())
	}
	// A crash after Do, before the confirm: Check finds it, Do does not run.
	f := open(t, h)
	trap = runstatetest.CrashAt(f, runstatetest.At{Point: runstatetest.AfterDo, Name: "k7"})
	_, err = f.Effect(ctx, "k7", rcv.effect(true))
	trap.Disarm()
	if !trap.Fired() || !errors.Is(err, runstatetest.ErrCrashed) {
		t.Fatalf("Effect k7 with a crash after its Do returned %v (trap fired: %v)", err, trap.Fired())
	}
	g := open(t, h)
	for _, key := range []string{"k6", "k7"} {
		got, err := g.Effect(ctx, key, rcv.effect(true))
		if err != nil {
			t.Fatalf("Effect %s after a crash mid-effect: %v", key, err)
		}
		wantReceipt(t, g, key, got)
		got, err = g.Effect(ctx, key, rcv.effect(true))
		if err != nil {
			t.Fatalf("Effect %s again: %v", key, err)
		}
		wantReceipt(t, g, key, got)
	}

	recs := records(t, h)
	for _, key := range []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7"} {
		if n := rcv.calls(key); n != 1 {
			t.Errorf("effect %s: Do called %d times, want once", key, n)
		}
		if n := len(find(recs, "confirm", key)); n != 1 {
			t.Errorf("effect %s: %d confirm records, want 1", key, n)
		}
	}
	if err := g.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := g.Status()
	if err != nil {
		t.Fatal(err)
	}
	if st.Metrics.EffectsDuplicated != 0 {
		t.Errorf("EffectsDuplicated = %d, want 0", st.Metrics.EffectsDuplicated)
	}
}
