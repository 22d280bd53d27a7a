package runstate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// One batch under the run's lock, as the committer's leader runs it
// (commit.go has the overview and the lock order): catch up (Tail), decide
// and append every transaction's records at once (writeBatch), make them
// durable (syncBatch, with side writes meanwhile), publish the projections.

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
		if cause := r.readOnlyCause(); cause != nil {
			fail(cause)
			return nil
		}
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
	if err := b.Tail(r.tailLine()); err != nil {
		err = corruptIn(r.store, err)
		if cause := r.readOnlyCause(); cause != nil {
			err = cause
		}
		r.cur = nil
		r.stMu.Unlock()
		_ = b.Abort()
		r.setSticky(err)
		fail(err)
		return nil
	}
	r.apply(batch, b)
	if c.conflict {
		// An optimistic batch lost its bet (ErrConflict): nothing was
		// written and the state is as before it; every transaction is
		// decided again, without a bet (tryLock).
		c.conflict = false
		c.noBet.Store(true)
		r.cur = nil
		r.stMu.Unlock()
		_ = b.Abort()
		var again []*tx
		for _, t := range batch {
			if t.claim.CompareAndSwap(txClaimed, txQueued) {
				t.err, t.recs = nil, nil
				again = append(again, t)
			}
		}
		// Back to the front of the queue, in a new array: the leader
		// (lead, after runNow too) takes them next, under TryLock, or
		// hands them to leadLater when another session holds the lock, so
		// that no caller waits longer than its context allows.
		c.mu.Lock()
		c.queue = append(again, c.queue...)
		c.mu.Unlock()
		return nil
	}
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

// tailer applies what other sessions appended (Batch.Tail) to the state.
// It is kept across batches, so that a batch with nothing to catch up
// allocates nothing for it (a replayer with its decoder, the store's name,
// a method value: 3 allocations and 350 bytes a batch). Guarded by stMu.
type tailer struct {
	p    replayer
	line func([]byte) error // p.line
}

// tailLine returns the function runLocked passes to Tail: it checks each
// line against the chain of r.st (the state reload may replace) and
// applies it. The caller holds stMu.
func (r *Run) tailLine() func([]byte) error {
	t := &r.c.tail
	if t.line == nil {
		t.p.path = r.store.String()
		t.p.apply = func(rec *Record, line []byte) error { return r.st.replay(rec, line) }
		t.line = t.p.line
	}
	t.p.c = &r.st.pos
	return t.line
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

// closing reports whether batch has Close's transaction (the close
// record), whose batch publishes the final projections.
func closing(batch []*tx) bool {
	for _, t := range batch {
		if t.last {
			return true
		}
	}
	return false
}

// onlyFlushes reports whether batch is the handoff lag timer's
// transactions alone, which decide nothing: an optimistic batch of them
// needs no Confirm (it publishes the handoff at Unlock, newest seq wins).
func onlyFlushes(batch []*tx) bool {
	for _, t := range batch {
		if !t.flush {
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
	// Room for each transaction's lines at once (a begin, or an end, is
	// rarely half as long again as the last line), instead of growing
	// from 64 bytes by doubling: one allocation for most batches.
	buf.Grow(len(batch) * int(max(r.st.lastLen+r.st.lastLen/2, 256)))
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
		if recs == nil {
			recs = trecs // a batch of one transaction: no copy
		} else {
			recs = append(slices.Clip(recs), trecs...) // never into trecs' spare capacity
		}
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
	start, startLen, mark := r.st.pos, r.st.lastLen, r.notes.mark()
	if _, bet := b.(OptimisticBatch); bet {
		// What writeBatch applies can be taken back if the bet is lost.
		st := r.st
		st.startUndo(&c.undo)
		defer st.stopUndo()
	}
	w := r.writeBatch(batch, b, false)
	// conflicted reports whether err is an optimistic batch's lost bet,
	// and then takes back what writeBatch applied (runLocked goes on):
	// in memory (undo), or else by reading the records up to start.
	conflicted := func(err error) bool {
		if !errors.Is(err, ErrConflict) {
			return false
		}
		if w.wrote {
			r.notes.cut(mark)
			undone := r.st.take(&c.undo) && r.st.pos == start && r.st.lastLen == startLen
			if !undone {
				if err := r.rollBack(start, startLen); err != nil {
					r.setSticky(err)
					for _, t := range w.ok {
						t.err, t.recs = err, nil
					}
					return true
				}
			}
		}
		c.conflict = true
		return true
	}
	if ob, ok := b.(OptimisticBatch); ok && !w.sync && !onlyFlushes(batch) {
		if err := ob.Confirm(context.Background()); err != nil {
			if conflicted(err) {
				return
			}
			r.setSticky(err)
			for _, t := range w.ok {
				t.err, t.recs = err, nil
			}
			r.notes.lost()
			return
		}
	}
	if !w.wrote {
		var d dues
		if w.flush && c.lag.behind && r.publishHandoff(b, &d) {
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
			if conflicted(err) {
				return
			}
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
	var d dues
	switch {
	case len(c.sideHeld) > 0 || closing(ok):
		r.writeNextSteps(b) // whatever the store's pace: see Pacer
	case w.publish || (w.flush && c.lag.behind):
		r.publishHandoff(b, &d)
	default:
		c.lag.behind = true
		r.flushHandoffLater()
	}
	if err := r.hitBatch(hookBetweenProjections, ok); err != nil {
		failAll(err)
		return
	}
	if (r.opts.ManifestInterval < 0 || time.Since(r.manifestAt()) >= r.manifestInterval()) && r.due(&d).manifest {
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
// outputs) may come in meanwhile too; they may see an optimistic batch's
// records that its Sync then finds in conflict (rolled back and decided
// again), as they may see records whose Sync fails. The caller holds stMu,
// and holds it again on return.
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
		err = corruptIn(r.store, err)
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

// errRolledBack stops rollBack's read at the position it rolls back to.
var errRolledBack = errors.New("runstate: read up to the rollback position")

// rollBack rebuilds the state as of start from the store's records (an
// optimistic batch that lost its bet, when the undo could not take its
// records back: other sessions' records may follow start in the store;
// Lock's Tail applies them next).
func (r *Run) rollBack(start chain, startLen int64) error {
	st := newState()
	p := replayer{path: r.store.String(), c: &st.pos, apply: st.replay}
	_, err := r.store.Read(context.Background(), Position{}, func(line []byte) error {
		if st.pos.seq >= start.seq {
			return errRolledBack
		}
		return p.line(line)
	})
	if errors.Is(err, errRolledBack) {
		err = nil
	}
	if err == nil && st.pos.seq < start.seq {
		// Records this session saw (and may have acted on) are gone: a
		// crash of the store lost its unflushed tail, as Lock finds it.
		return fmt.Errorf("%w: %s ends at record %d, but this session read up to %d: records it saw are gone (a crash of the store lost records not yet durable, or a restore from backup); open the run again",
			ErrSessionLost, r.store, st.pos.seq, start.seq)
	}
	if err == nil && st.pos != start {
		err = fmt.Errorf("the store's record %d is not the one this session read", start.seq)
	}
	if err != nil {
		return fmt.Errorf("runstate: roll back to record %d of %s after a conflict: %w", start.seq, r.store, corruptIn(r.store, err))
	}
	st.lastLen = startLen
	r.st = st
	return nil
}
