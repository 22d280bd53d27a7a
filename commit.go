package runstate

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// The committer: every record a Run appends goes through commitTx. A call
// queues a transaction (tx: a function that decides records on the state);
// one goroutine at a time leads: it takes the run's lock from the Store
// (Store.Lock: one Batch), applies what other sessions appended (Tail),
// runs each queued transaction's function on the state, encodes their
// records into one buffer and appends it (Append: one write), makes the
// batch durable once if any transaction asks (Sync: one fsync), publishes
// the projections (Publish), unlocks and wakes the others. Concurrent
// calls in one process thus share one write and one fsync (group commit).
// The batch policy (commitpolicy.go) decides when a leader waits a little
// for more transactions; the handoff's lag (handoff.go) when
// logs/next-steps.txt is rewritten.
//
// While a batch waits for its fsync the leader releases the state, so
// that readers (Status, Begin's look at a stage's outputs) go on; with a
// Batch that is a SideWriter (the file store, whose appends are visible at
// once) transactions that need no fsync (begins) are released before the
// fsync, and other goroutines' begins are written meanwhile (sideWrite).
//
// The lock order, outermost first; a goroutine never takes one while it
// holds one after it:
//
//  1. the run's lock (Store.Lock, logs/ledger.lock): held by the leader
//     for one batch, taken without c.mu or stMu held;
//  2. stMu: the state; the leader holds it for the batch but its Sync,
//     a side writer while it writes;
//  3. c.mu: the committer's queue and flags, held briefly (the leader
//     takes it under stMu to set syncing; commitTx holds it to queue a
//     transaction and starts a side write from there, which releases it
//     before taking stMu);
//  4. the notifier's own lock and the store's internal locks (the handoff
//     files'), leaves.
//
// OnRecord runs with none of them held (notifier.deliver).

// committer is the group commit's state, guarded by mu except where a
// comment says otherwise.
type committer struct {
	mu     sync.Mutex
	closed bool
	sticky error // first write error that makes the run read-only
	queue  []*tx
	// leading: a goroutine leads (lead, leadLater).
	leading bool
	// closeCalled: Close has begun; new transactions get ErrClosed (but
	// the close record's), and a second Close waits for closeDone.
	// batches counts the batches under way with the run's lock; Close
	// waits for them before it closes the store.
	closeCalled bool
	closeDone   chan struct{}
	batches     sync.WaitGroup
	// syncing: the leader waits for an fsync, holding the run's lock but
	// not stMu; sideWriting: a goroutine writes begins meanwhile
	// (sideWrite); the leader waits for sideWriters after the fsync.
	syncing     bool
	sideWriting bool
	sideWriters sync.WaitGroup
	// sideHeld: transactions a side writer wrote whose records the
	// handoff must show before they return (under stMu).
	sideHeld []*tx

	tail   tailer       // applies other sessions' records (batch.go), under stMu
	policy batchPolicy  // when to yield and gather (commitpolicy.go)
	lag    handoffTimer // the handoff's lag behind begins (handoff.go)

	// manifest: when manifest.json was last published; manifestCost: how
	// long that took (manifestInterval).
	manifest     time.Time
	manifestCost time.Duration
	skipped      int // Begin found a stage done
	deduped      int // Effect returned a stored receipt
	// conflict: the leader's optimistic batch found the run's head moved
	// (ErrConflict); apply set it, with the state rolled back, and
	// runLocked queues the batch again (under stMu); noBet: the next
	// batch is not optimistic (tryLock).
	conflict bool
	noBet    atomic.Bool
	// undo takes an optimistic batch's records back from the state when
	// its bet is lost (state_undo.go). Under stMu.
	undo undo
}

// tx is one unit of the group commit: fn decides, on the current state and
// under the ledger lock, which records to append (or fails without any).
type tx struct {
	fn   func(*state) ([]*Record, error)
	sync bool // the records acknowledge something: fsync before returning
	recs []*Record
	err  error
	done chan struct{}
	// released: done was closed early, once the records were written
	// (a transaction without sync, in a batch that waits for an fsync).
	released bool
	// lazy: the handoff need not show these records at once (a begin);
	// see handoffLag.
	lazy bool
	// flush: publish the handoff if it lags (the lag timer's transaction).
	flush bool
	// began: when the attempt this transaction ends began (commitEnd).
	began time.Time
	// ctx bounds the caller's wait (nil: Options.LockTimeout); claim
	// is txQueued until the leader takes the transaction (txClaimed) or
	// its caller gives up waiting (txWithdrawn): see await.
	ctx   context.Context
	claim atomic.Int32
	// last: Close's transaction, the close record: the batch that
	// writes it also rewrites the manifest and fdatasyncs the ledger.
	last bool
}

// decide runs the transaction's fn. A panic in it (a bug) becomes the
// transaction's error instead of unwinding through the leader, which
// would leave every waiting goroutine of the batch blocked for ever.
func (t *tx) decide(s *state) (recs []*Record, err error) {
	defer func() {
		if p := recover(); p != nil {
			recs, err = nil, fmt.Errorf("runstate: internal error deciding a record: %v\n%s", p, debug.Stack())
		}
	}()
	return t.fn(s)
}

// commit runs fn under the run's lock on the current state and appends the
// records it returns. Concurrent commits in one process are grouped: one
// leader takes the lock once, writes every queued transaction's records
// with one write and one fsync, and wakes the others.
func (r *Run) commit(sync bool, fn func(*state) ([]*Record, error)) ([]*Record, error) {
	return r.commitTx(&tx{fn: fn, sync: sync})
}

// commitCtx is commit for a call whose wait for the run's lock ctx bounds.
func (r *Run) commitCtx(ctx context.Context, sync bool, fn func(*state) ([]*Record, error)) ([]*Record, error) {
	return r.commitTx(&tx{fn: fn, sync: sync, ctx: ctx})
}

// commitEnd commits, with an fsync, the record that ends st's attempt
// (complete, fail, await), noting how long the attempt ran for the batch
// policy (gather).
func (r *Run) commitEnd(st *Stage, fn func(*state) ([]*Record, error)) ([]*Record, error) {
	return r.commitTx(&tx{fn: fn, sync: true, began: st.began})
}

func (r *Run) commitTx(t *tx) ([]*Record, error) {
	c := &r.c
	t.done = make(chan struct{})
	c.mu.Lock()
	if c.closed || (c.closeCalled && !t.last) {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if c.sticky != nil {
		err := c.sticky
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", ErrReadOnly, err)
	}
	c.queue = append(c.queue, t)
	if !t.began.IsZero() {
		c.policy.noteStage(c.policy.since(t.began))
	}
	if t.sync {
		c.policy.arrived() // wake a gathering leader
	}
	if c.leading && c.syncing && !t.sync && !c.sideWriting {
		r.sideWrite()
		c.mu.Unlock()
		return r.await(t)
	}
	if c.leading {
		c.mu.Unlock()
		return r.await(t)
	}
	c.leading = true
	if !r.lead(t) {
		// Another process holds the run's lock: a goroutine waits for it
		// and leads from there; this caller waits as long as its context
		// allows.
		c.mu.Unlock()
		return r.await(t)
	}
	c.leading = false
	c.mu.Unlock()
	r.notes.deliver()
	<-t.done
	return t.recs, t.err
}

// lead is the leader's loop: it takes batches from the queue until it is
// empty. When another session holds the run's lock (or the store cannot
// try it: TryLocker), it hands the batch and the leadership to a goroutine
// that waits for the lock (leadLater), so that no caller waits longer than
// its context allows, and returns false; c.leading stays set then. The
// caller holds c.mu, also on return.
func (r *Run) lead(own *tx) bool {
	c := &r.c
	for len(c.queue) > 0 {
		// The batch policy may yield once, so that the goroutines the last
		// batch woke join this one, and gather (commitpolicy.go).
		if c.policy.woke {
			r.cooperate(own)
		}
		batch := c.queue
		c.queue = nil
		c.mu.Unlock()
		b, locked, err := r.tryLock()
		if err == nil && !locked {
			go r.leadLater(batch)
			c.mu.Lock()
			return false
		}
		_ = r.runLocked(batch, b, err)
		c.mu.Lock()
		c.policy.woke = len(batch) > 1 || batch[0] != own
		if c.queue == nil {
			// Nothing came meanwhile: the next commitTx queues into the
			// batch's array instead of allocating one (runLocked is done
			// with it, and no transaction keeps it).
			clear(batch)
			c.queue = batch[:0]
		}
	}
	return true
}

// tryLock takes the run's lock if no other session holds it, or an
// optimistic batch where the store offers one (Optimist).
func (r *Run) tryLock() (Batch, bool, error) {
	o, opt := r.store.(Optimist)
	tl, ok := r.store.(TryLocker)
	if !ok && !opt {
		return nil, false, nil
	}
	r.stMu.RLock()
	from := r.st.position()
	r.stMu.RUnlock()
	if opt && !r.c.noBet.Swap(false) {
		if b, ok := o.LockOptimistic(from); ok {
			return b, true, nil
		}
	}
	if !ok {
		return nil, false, nil
	}
	return tl.TryLock(from)
}

// leadLater waits for the run's lock, which another session holds, runs
// batch and goes on leading. The store logs a long wait with the holder.
func (r *Run) leadLater(batch []*tx) {
	r.runBatch(batch)
	c := &r.c
	c.mu.Lock()
	c.policy.woke = len(batch) > 1
	if r.lead(nil) {
		c.leading = false
	}
	c.mu.Unlock()
	r.notes.deliver()
}

// runBatch waits for the run's lock as long as it takes, and runs batch.
func (r *Run) runBatch(batch []*tx) {
	r.stMu.RLock()
	from := r.st.position()
	r.stMu.RUnlock()
	b, err := r.store.Lock(context.Background(), from)
	_ = r.runLocked(batch, b, err)
}

// await waits for t's batch. A caller whose context ends (or, without
// one, whose Options.LockTimeout runs out) before the leader took t
// withdraws it and gets an error naming who holds the run's lock; once
// taken, t is written (or fails) within the batch, and await waits for
// that. The caller holds no lock.
func (r *Run) await(t *tx) ([]*Record, error) {
	var stop <-chan struct{}
	if t.ctx != nil {
		stop = t.ctx.Done()
	} else if r.opts.LockTimeout > 0 {
		timer := time.NewTimer(r.opts.LockTimeout)
		defer timer.Stop()
		select {
		case <-t.done:
			return t.recs, t.err
		case <-timer.C:
		}
		if t.claim.CompareAndSwap(txQueued, txWithdrawn) {
			return nil, r.lockWaitError(ErrLockTimeout, r.opts.LockTimeout)
		}
	}
	if stop != nil {
		start := time.Now()
		select {
		case <-t.done:
			return t.recs, t.err
		case <-stop:
		}
		if t.claim.CompareAndSwap(txQueued, txWithdrawn) {
			return nil, r.lockWaitError(ctxErr(t.ctx), time.Since(start))
		}
	}
	<-t.done
	return t.recs, t.err
}

// lockWaitError is the error of a call that gave up waiting for the run's
// lock after waited, for cause: the store names the holder where it can.
func (r *Run) lockWaitError(cause error, waited time.Duration) error {
	if s, ok := r.store.(interface {
		lockWaitError(error, time.Duration, bool) error
	}); ok {
		return s.lockWaitError(cause, waited, true)
	}
	return fmt.Errorf("runstate: gave up waiting for the lock of %s after %s: %w; another session holds it; nothing was recorded",
		r.store, waited.Round(time.Millisecond), cause)
}

// The states of tx.claim.
const (
	txQueued int32 = iota
	txClaimed
	txWithdrawn
)

// readOnlyCause is ErrReadOnly wrapping the write error that made the
// Run read-only, or nil. A batch that was under way then (its transactions
// queued before it) and fails to lock the run or to read its tail fails
// with it: its own error would follow from that write, and blame something
// else (records lost by the server, a broken chain), since the state it
// starts from holds the records that did not land (a store whose begins
// land at Unlock, after their callers were let go).
func (r *Run) readOnlyCause() error {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if r.c.sticky == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrReadOnly, r.c.sticky)
}

func (r *Run) setSticky(err error) {
	r.c.mu.Lock()
	if r.c.sticky == nil {
		r.c.sticky = err
	}
	r.c.mu.Unlock()
	r.att.stop(err) // a read-only Run stops its running stages (attempts.go)
}
