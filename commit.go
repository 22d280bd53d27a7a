package runstate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
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

	policy batchPolicy  // when to yield and gather (commitpolicy.go)
	lag    handoffTimer // the handoff's lag behind begins (handoff.go)

	// manifest: when manifest.json was last published; manifestCost: how
	// long that took (manifestInterval).
	manifest     time.Time
	manifestCost time.Duration
	skipped      int // Begin found a stage done
	deduped      int // Effect returned a stored receipt
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
	}
	return true
}

// tryLock takes the run's lock if no other session holds it.
func (r *Run) tryLock() (Batch, bool, error) {
	tl, ok := r.store.(TryLocker)
	if !ok {
		return nil, false, nil
	}
	r.stMu.RLock()
	from := r.st.position()
	r.stMu.RUnlock()
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

// runLocked runs batch once the run's lock is taken (b; lockErr nil) or
// could not be, and unlocks. It returns the error of the unlock (Open's
// first batch takes the session's liveness there).
func (r *Run) runLocked(batch []*tx, b Batch, lockErr error) error {
	c := &r.c
	fail := func(err error) {
		for _, t := range batch {
			t.err = err
			close(t.done)
		}
	}
	if lockErr != nil {
		if errors.Is(lockErr, ErrSessionLost) {
			r.setSticky(lockErr)
		}
		fail(lockErr)
		return nil
	}
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.batches.Add(1) // Close waits for it before closing the store
	}
	c.mu.Unlock()
	if closed {
		_ = b.Unlock()
		fail(ErrClosed) // its callers gave up waiting; the store is closed
		return nil
	}
	defer c.batches.Done()
	r.stMu.Lock()
	r.cur = b
	p := replayer{path: r.store.String(), c: &r.st.pos, apply: r.st.replay}
	if err := b.Tail(p.line); err != nil {
		r.cur = nil
		r.stMu.Unlock()
		_ = b.Abort()
		r.setSticky(err)
		fail(err)
		return nil
	}
	r.apply(batch, b)
	for _, t := range batch {
		if t.last && t.err == nil {
			r.writeManifest(b) // Close: the manifest as of the close record
		}
		if !t.released {
			close(t.done)
		}
	}
	// Side-written transactions held for the handoff: apply published it.
	for _, t := range c.sideHeld {
		close(t.done)
	}
	c.sideHeld = nil
	r.cur = nil
	r.stMu.Unlock()
	err := b.Unlock()
	if err != nil {
		r.setSticky(err)
	}
	return err
}

// onlyBegins reports whether recs are all begin records: the only ones
// the handoff may lag (handoffLag).
func onlyBegins(recs []*Record) bool {
	for _, rec := range recs {
		if rec.Ev != evBegin {
			return false
		}
	}
	return true
}

// written is what writeBatch appended.
type written struct {
	ok      []*tx // the transactions whose records (if any) are written
	sync    bool  // one of them asks for an fsync
	publish bool  // one of them appended a record the handoff must show at once
	flush   bool  // one of them is the handoff lag timer's
	wrote   bool  // there were records to write
}

// writeBatch runs each transaction's fn on the state, encodes the records
// into one buffer and appends it with one Append (AppendWhileSyncing for a
// side writer). On a failed append the state is reloaded and every
// transaction of the batch fails. The caller holds the run's lock (or is a
// side writer: see sideWrite) and stMu.
func (r *Run) writeBatch(batch []*tx, b Batch, side bool) written {
	var w written
	var buf bytes.Buffer
	var recs []*Record
	start := r.st.pos
	mark := r.notes.mark()
	startLen := r.st.lastLen
	now := b.Now()
	for _, t := range batch {
		if !t.claim.CompareAndSwap(txQueued, txClaimed) {
			continue // withdrawn: its caller gave up waiting (await)
		}
		w.flush = w.flush || t.flush
		trecs, err := t.decide(r.st)
		if err != nil {
			t.err = err
			continue
		}
		if err := r.encodeTx(&buf, trecs, now); err != nil {
			t.err = err // this transaction only: the others of the batch go on
			continue
		}
		t.recs = trecs
		recs = append(recs, trecs...)
		w.sync = w.sync || t.sync
		w.publish = w.publish || (len(trecs) > 0 && !(t.lazy && onlyBegins(trecs)))
		w.ok = append(w.ok, t)
	}
	if buf.Len() == 0 {
		return w
	}
	w.wrote = true
	var err error
	if side {
		err = b.(SideWriter).AppendWhileSyncing(recs, buf.Bytes(), r.st.position())
	} else {
		err = b.Append(recs, buf.Bytes(), r.st.position())
	}
	if err != nil {
		if we := (*WriteError)(nil); errors.As(err, &we) && we.Sticky {
			r.setSticky(err)
		}
		for _, t := range w.ok {
			t.err, t.recs = err, nil
		}
		r.notes.cut(mark)
		r.reload(start, startLen)
		return written{}
	}
	return w
}

// apply writes the batch (writeBatch) and, if any transaction asks, makes
// it durable once (Sync), then replaces the projections. The caller holds
// the run's lock and stMu. On a failed Sync the run turns read-only.
func (r *Run) apply(batch []*tx, b Batch) {
	c := &r.c
	w := r.writeBatch(batch, b, false)
	if !w.wrote {
		if w.flush && c.lag.behind {
			r.writeNextSteps(b)
			c.lag.flushes.Add(1)
		}
		return
	}
	ok := w.ok
	failAll := func(err error) {
		for _, t := range ok {
			if !t.released {
				t.err, t.recs = err, nil
			}
		}
	}
	if w.sync {
		var err error
		if r.opts.NoSync {
			err = b.Sync(context.Background()) // the store checks, and makes no fsync
		} else {
			err = r.syncBatch(b, ok)
		}
		if err != nil {
			r.setSticky(err)
			failAll(err)
			r.notes.lost()
			return
		}
	}
	if err := r.hitBatch(hookAfterComplete, ok); err != nil {
		failAll(err)
		return
	}
	if w.publish || len(c.sideHeld) > 0 || (w.flush && c.lag.behind) {
		r.writeNextSteps(b)
	} else {
		c.lag.behind = true
		r.flushHandoffLater()
	}
	if err := r.hitBatch(hookBetweenProjections, ok); err != nil {
		failAll(err)
		return
	}
	if r.opts.ManifestInterval < 0 || time.Since(r.manifestAt()) >= r.manifestInterval() {
		r.writeManifest(b)
	}
	r.notes.durable()
}

// syncBatch waits for b's Sync with the state released. Where appended
// records are visible at once (a SideWriter), a transaction that asked for
// no fsync (a begin) is done once its records are written: it goes on
// while the batch waits for the disk, and so may a side writer (see
// commitTx) with more begins: this process holds the run's lock until the
// fsync is done. Readers of the state (Status, Begin's look at a stage's
// outputs) may come in meanwhile too. The caller holds stMu, and holds it
// again on return.
func (r *Run) syncBatch(b Batch, ok []*tx) error {
	c := &r.c
	_, side := b.(SideWriter)
	if side {
		for _, t := range ok {
			if !t.sync && t.done != nil {
				t.released = true
				close(t.done)
			}
		}
	}
	c.mu.Lock()
	c.syncing = side
	c.mu.Unlock()
	r.stMu.Unlock()
	start := c.policy.now()
	err := b.Sync(context.Background())
	d := c.policy.since(start)
	c.mu.Lock()
	c.syncing = false
	c.policy.noteSync(d)
	c.mu.Unlock()
	c.sideWriters.Wait()
	r.stMu.Lock()
	return err
}

// sideWrite writes the queued transactions that need no fsync (begins)
// while the leader waits for an fsync: the leader holds the run's lock
// until then, and has released stMu, so a begin need not wait for a disk
// flush that it does not need. A transaction of begin records alone
// returns at once (the handoff may lag it: handoffLag); one with another
// record (an interrupted attempt) is held until the leader has published
// the handoff after its fsync. The leader's batch writes the manifest. The
// leader waits for side writers (sideWriters) before it takes stMu again
// and, later, unlocks. Only a batch that is a SideWriter lets it happen
// (syncBatch sets syncing). The caller holds c.mu, and holds it again when
// sideWrite returns.
func (r *Run) sideWrite() {
	c := &r.c
	c.sideWriting = true
	c.sideWriters.Add(1)
	defer func() {
		c.sideWriting = false
		c.sideWriters.Done()
	}()
	for c.syncing {
		var now []*tx
		rest := c.queue[:0:0]
		for _, t := range c.queue {
			if t.sync {
				rest = append(rest, t)
			} else {
				now = append(now, t)
			}
		}
		if len(now) == 0 {
			return
		}
		c.queue = rest
		c.mu.Unlock()
		r.stMu.Lock()
		var held []*tx
		if w := r.writeBatch(now, r.cur, true); w.wrote {
			c.lag.behind = true
			r.flushHandoffLater()
			// A record other than a begin (an interrupted one, say) must be
			// in the handoff when its call returns: the leader publishes
			// after its fsync and then lets those transactions go.
			for _, t := range w.ok {
				if len(t.recs) > 0 && !onlyBegins(t.recs) {
					held = append(held, t)
				}
			}
			c.sideHeld = append(c.sideHeld, held...)
		}
		r.stMu.Unlock()
		for _, t := range now {
			if !slices.Contains(held, t) {
				close(t.done)
			}
		}
		c.mu.Lock()
	}
}

// reload rebuilds the state from the store after an append that did not
// land: from the file store's snapshot and ledger, or by reading every
// record.
func (r *Run) reload(start chain, startLen int64) {
	var st *state
	var err error
	if s, ok := r.store.(interface{ reload() (*state, error) }); ok {
		st, err = s.reload()
	} else {
		st = newState()
		p := replayer{path: r.store.String(), c: &st.pos, apply: st.replay}
		_, err = r.store.Read(context.Background(), Position{}, p.line)
	}
	if err != nil || st.pos != start {
		if err == nil {
			err = fmt.Errorf("the store ends at seq %d, want %d", st.pos.seq, start.seq)
		}
		r.setSticky(fmt.Errorf("runstate: reload %s after a failed write: %w", r.store, err))
		return
	}
	st.lastLen = startLen
	r.st = st
}

func (r *Run) setSticky(err error) {
	r.c.mu.Lock()
	if r.c.sticky == nil {
		r.c.sticky = err
	}
	r.c.mu.Unlock()
}
