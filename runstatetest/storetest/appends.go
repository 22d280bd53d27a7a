package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runstate/runstate"
)

// untilNotBusy calls fn until it returns something other than ErrBusy
// (another session holds the stage or key), or ctx ends.
func untilNotBusy(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if !errors.Is(err, runstate.ErrBusy) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still busy when the test's time ran out: %w", err)
		case <-time.After(time.Millisecond):
		}
	}
}

// openAll opens n sessions through h at once, as n processes starting
// together would: exactly one of them creates the run.
func openAll(t *testing.T, h Harness, n int) []*runstate.Run {
	t.Helper()
	runs := make([]*runstate.Run, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i], errs[i] = h.Open(t, options())
		}()
	}
	wg.Wait()
	for i, run := range runs {
		if run != nil {
			t.Cleanup(func() { _ = run.Close() })
		}
		if errs[i] != nil {
			t.Fatalf("open session %d of %d racing to open the run: %v", i+1, n, errs[i])
		}
	}
	return runs
}

// fanOut runs fn on workers goroutines for each of runs at once, and
// reports the errors they return through t when all are done. It returns
// whether none failed.
func fanOut(t *testing.T, runs []*runstate.Run, workers int, fn func(i, w int, run *runstate.Run) error) bool {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(runs)*workers)
	for i, run := range runs {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := fn(i, w, run); err != nil {
					errs[i*workers+w] = fmt.Errorf("session %d worker %d: %w", i, w, err)
				}
			}()
		}
	}
	wg.Wait()
	ok := true
	for _, err := range errs {
		if err != nil {
			t.Error(err)
			ok = false
		}
	}
	return ok
}

// ack is a record that a call acknowledged (returned nil for).
type ack struct{ ev, name string }

// testConcurrentAppends: several sessions, several goroutines each, append
// at once. The ledger holds every acknowledged record once, with seq
// gapless and the hash chain intact, and every session catches up to the
// same state.
func testConcurrentAppends(t *testing.T, h Harness) {
	ctx := testContext(t)
	const sessions, workers, ops = 3, 4, 8
	runs := openAll(t, h, sessions)
	var (
		mu   sync.Mutex
		acks []ack
	)
	ok := fanOut(t, runs, workers, func(i, w int, run *runstate.Run) error {
		for j := range ops {
			name := fmt.Sprintf("s%d-w%d-%d", i, w, j)
			var err error
			var a ack
			switch j % 4 {
			case 0, 1:
				err = run.Do(ctx, name, func(context.Context, *runstate.Stage) error { return nil })
				a = ack{"complete", name}
			case 2:
				err = run.Skip(ctx, name, "not needed")
				a = ack{"skip", name}
			case 3:
				_, err = run.Effect(ctx, name, runstate.Effect{
					Do: func(context.Context, string) (json.RawMessage, error) {
						return json.RawMessage(`{"ok":true}`), nil
					},
				})
				a = ack{"confirm", name}
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", a.ev, name, err)
			}
			mu.Lock()
			acks = append(acks, a)
			mu.Unlock()
		}
		return nil
	})
	if !ok {
		return
	}

	lines := h.Lines(t)
	recs := chain(t, lines)
	wrong := 0
	for _, a := range acks {
		if n := len(find(recs, a.ev, a.name)); n != 1 {
			if wrong++; wrong <= 10 {
				t.Errorf("acknowledged %s of %s is in the ledger %d times, want once", a.ev, a.name, n)
			}
		}
	}
	if wrong > 10 {
		t.Errorf("... and %d more acknowledged records not in the ledger once", wrong-10)
	}
	if len(acks) != sessions*workers*ops {
		t.Errorf("%d calls acknowledged, want %d", len(acks), sessions*workers*ops)
	}
	// Every session catches up with what the others appended.
	for i, run := range runs {
		if err := run.Refresh(ctx); err != nil {
			t.Fatalf("session %d: Refresh: %v", i, err)
		}
		st, err := run.Status()
		if err != nil {
			t.Fatalf("session %d: Status: %v", i, err)
		}
		if st.Seq != int64(len(lines)) {
			t.Errorf("session %d after Refresh is at seq %d, the ledger ends at seq %d: it did not catch up", i, st.Seq, len(lines))
		}
		if done := st.Metrics.DuplicatedWork; done != 0 {
			t.Errorf("session %d: DuplicatedWork = %d, want 0", i, done)
		}
	}
	// Closing them all at once appends one close record each, in one
	// chain.
	var cwg sync.WaitGroup
	cerrs := make([]error, len(runs))
	for i, run := range runs {
		cwg.Add(1)
		go func() { defer cwg.Done(); cerrs[i] = run.Close() }()
	}
	cwg.Wait()
	for i, err := range cerrs {
		if err != nil {
			t.Errorf("session %d: Close: %v", i, err)
		}
	}
	recs = records(t, h)
	closes := 0
	for _, rec := range recs {
		if rec.Ev == "close" {
			closes++
		}
	}
	if closes != sessions {
		t.Errorf("%d close records after %d sessions closed", closes, sessions)
	}
}

// testOneCompletePerAttempt: sessions race Do on the same stages; each
// stage's fn runs once, with one begin and one complete in the ledger, and
// no attempt has two completes.
func testOneCompletePerAttempt(t *testing.T, h Harness) {
	ctx := testContext(t)
	const sessions, workers, stages = 3, 3, 6
	runs := openAll(t, h, sessions)
	var calls [stages]atomic.Int32
	fanOut(t, runs, workers, func(i, w int, run *runstate.Run) error {
		start := i*workers + w
		for k := range stages {
			s := (start + k) % stages
			name := fmt.Sprintf("shared-%d", s)
			err := untilNotBusy(ctx, func() error {
				return run.Do(ctx, name, func(context.Context, *runstate.Stage) error {
					calls[s].Add(1)
					time.Sleep(time.Millisecond) // let the others find it running
					return nil
				})
			})
			if err != nil {
				return fmt.Errorf("do %s: %w", name, err)
			}
		}
		return nil
	})
	for s := range stages {
		if n := calls[s].Load(); n != 1 {
			t.Errorf("stage shared-%d: fn ran %d times across %d sessions, want once", s, n, sessions)
		}
	}
	recs := records(t, h)
	begins, completes := countEv(recs, "begin"), countEv(recs, "complete")
	for k, n := range completes {
		if n > 1 {
			t.Errorf("stage %s attempt %d has %d complete records, want at most one", k.stage, k.attempt, n)
		}
		if begins[k] != 1 {
			t.Errorf("stage %s attempt %d is complete with %d begin records, want one", k.stage, k.attempt, begins[k])
		}
	}
	for s := range stages {
		name := fmt.Sprintf("shared-%d", s)
		if n := len(find(recs, "begin", name)); n != 1 {
			t.Errorf("stage %s was begun %d times, want once (all sessions were alive)", name, n)
		}
		if n := len(find(recs, "complete", name)); n != 1 {
			t.Errorf("stage %s has %d complete records, want one", name, n)
		}
	}
}
