package cli

import (
	"context"
	"sync"
	"time"
)

// lockWait is a context for the library's calls that wait for the ledger
// lock and also run a command (Run.Effect): it ends timeout after it was
// made or last resumed, but not while paused, so that -timeout bounds each
// wait for the lock and not the command's run. A zero timeout never ends.
// Safe for concurrent use.
type lockWait struct {
	timeout time.Duration
	done    chan struct{}
	mu      sync.Mutex
	timer   *time.Timer
	err     error
}

func newLockWait(timeout time.Duration) *lockWait {
	w := &lockWait{timeout: timeout, done: make(chan struct{})}
	if timeout > 0 {
		w.timer = time.AfterFunc(timeout, w.expire)
	}
	return w
}

func (w *lockWait) expire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = context.DeadlineExceeded
		close(w.done)
	}
}

// pause stops the clock, while a command runs.
func (w *lockWait) pause() {
	if w.timer != nil {
		w.timer.Stop()
	}
}

// resume starts the clock again, from timeout.
func (w *lockWait) resume() {
	if w.timer != nil {
		w.timer.Reset(w.timeout)
	}
}

// stop releases the timer.
func (w *lockWait) stop() { w.pause() }

func (w *lockWait) Deadline() (time.Time, bool) { return time.Time{}, false }
func (w *lockWait) Done() <-chan struct{}       { return w.done }
func (w *lockWait) Value(any) any               { return nil }

func (w *lockWait) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// lockCtx bounds a call that waits for the ledger lock (Begin, Plan,
// Skip) by timeout; zero: no bound.
func lockCtx(timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(context.Background(), timeout)
	}
	return context.Background(), func() {}
}
