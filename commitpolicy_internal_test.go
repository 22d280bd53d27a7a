package runstate

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is a batch policy clock (clock) that moves only when a test
// advances it: a timer armed on it fires in Advance, never on its own.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	armed  chan time.Duration // the d of each timer armed, in order
}

type fakeTimer struct {
	c    *fakeClock
	at   time.Time
	ch   chan time.Time // NewTimer's (buffered); nil for AfterFunc
	f    func()         // AfterFunc's
	done bool           // fired or stopped
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), armed: make(chan time.Duration, 64)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) (<-chan time.Time, stopper) {
	t := c.arm(d, nil)
	return t.ch, t
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) stopper { return c.arm(d, f) }

func (c *fakeClock) arm(d time.Duration, f func()) *fakeTimer {
	c.mu.Lock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	if f == nil {
		t.ch = make(chan time.Time, 1)
	}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	select {
	case c.armed <- d:
	default: // nobody looks: a test that does reads them as they come
	}
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	stopped := !t.done
	t.done = true
	return stopped
}

// Advance moves the clock on by d and fires the timers now due, in the
// caller's goroutine (an AfterFunc's f too: the caller holds no lock).
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	var due []*fakeTimer
	for _, t := range c.timers {
		if !t.done && !t.at.After(now) {
			t.done = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		if t.f != nil {
			t.f()
		} else {
			t.ch <- now
		}
	}
}

// nextArmed returns how long the next timer armed on c runs. A timer armed
// on the wall clock instead never shows here: the test fails after 10 s.
func (c *fakeClock) nextArmed(t *testing.T, what string) time.Duration {
	t.Helper()
	select {
	case d := <-c.armed:
		return d
	case <-time.After(10 * time.Second):
		t.Fatalf("%s armed no timer on the batch policy's clock in 10 s (a timer of the time package?)", what)
		return 0
	}
}

// TestGatherWaitsOnThePolicyClock drives gather's wait with a clock of its
// own: the wait for the goroutines' records ends when that clock has run
// one and a half fsyncs (a moving average of an hour here), not a
// nanosecond earlier, and at once when the record expected is queued.
func TestGatherWaitsOnThePolicyClock(t *testing.T) {
	r, begin, complete := queuedPair(t)
	fc := newFakeClock()
	gather := func() <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.c.mu.Lock()
			defer r.c.mu.Unlock()
			r.gatherBatch(nil)
		}()
		return done
	}
	returned := func(done <-chan struct{}) bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	wait := func(done <-chan struct{}) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("gather did not return in 10 s")
		}
	}

	r.c.mu.Lock()
	r.c.policy.clock = fc
	r.c.policy.syncTime, r.c.policy.stageTime = time.Hour, time.Millisecond
	r.c.queue = []*tx{complete, begin}
	r.c.mu.Unlock()
	done := gather()
	assert.Equal(t, 90*time.Minute, fc.nextArmed(t, "gather's wait"), "one and a half fsyncs")
	fc.Advance(90*time.Minute - time.Nanosecond)
	// Only the clock's timer (or a record queued) can end the wait, and
	// it is not due: gather is still waiting.
	assert.False(t, returned(done), "the wait ran out before its time on the policy's clock")
	fc.Advance(time.Nanosecond)
	wait(done)
	r.c.mu.Lock()
	assert.Equal(t, int64(1), r.c.policy.gatherLate.Load(), "the wait ran out")
	assert.Zero(t, r.c.policy.gathered.Load())
	assert.Equal(t, 8, r.c.policy.gatherOff, "gathering off for the next 8 batches")
	assert.Equal(t, []*tx{complete}, r.c.queue, "the begin written alone")

	// The record expected comes: the wait ends with the clock standing.
	r.c.policy.gatherOff = 0
	begin2 := &tx{fn: begin.fn, lazy: true, done: make(chan struct{})}
	complete2 := &tx{fn: complete.fn, sync: true, done: make(chan struct{})}
	r.c.queue = []*tx{complete, begin2}
	r.c.mu.Unlock()
	done = gather()
	assert.Equal(t, 90*time.Minute, fc.nextArmed(t, "gather's second wait"))
	r.c.mu.Lock()
	r.c.queue = append(r.c.queue, complete2)
	r.c.policy.arrived()
	r.c.mu.Unlock()
	wait(done)
	r.c.mu.Lock()
	assert.Equal(t, int64(1), r.c.policy.gathered.Load(), "every record expected came")
	assert.Equal(t, int64(1), r.c.policy.gatherLate.Load())
	assert.Equal(t, []*tx{complete, complete2}, r.c.queue)
	r.c.queue = nil
	r.c.mu.Unlock()
	fc.mu.Lock()
	for _, tm := range fc.timers {
		assert.True(t, tm.done, "gather stopped its timer")
	}
	fc.mu.Unlock()
}

// TestHandoffLagOnThePolicyClock: the handoff lags a begin until the
// batch policy's clock has run handoffLag, and then the lag timer
// republishes it; before that it does not, however long the stage runs.
func TestHandoffLagOnThePolicyClock(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "lag", ManifestInterval: -1})
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Plan(ctx, "lagging"))
	fc := newFakeClock()
	r.c.mu.Lock()
	require.Nil(t, r.c.lag.timer, "no lag timer armed by Open")
	r.c.policy.clock = fc
	r.c.mu.Unlock()

	st, err := r.Begin(ctx, "lagging")
	require.NoError(t, err)
	assert.Equal(t, handoffLag, fc.nextArmed(t, "the handoff's lag"))
	_, text := readHandoff(t, dir)
	assert.Contains(t, text, "next:     lagging (not started)")
	assert.NotContains(t, text, "running", "a begin alone does not republish the handoff")

	fc.Advance(handoffLag - time.Nanosecond)
	assert.Zero(t, r.c.lag.flushes.Load(), "not yet handoffLag on the policy's clock")
	fc.Advance(time.Nanosecond) // runs the timer's flush here
	assert.Equal(t, int64(1), r.c.lag.flushes.Load(), "the lag timer republished the handoff")
	seq, text := readHandoff(t, dir)
	assert.Equal(t, r.st.pos.seq, seq)
	assert.Contains(t, text, "next:     lagging (running, attempt 1)")
	require.NoError(t, st.Complete())
}
