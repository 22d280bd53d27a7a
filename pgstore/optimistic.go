package pgstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/runstate/runstate"
)

// Optimistic batches (runstate.Optimist): when the session's position is
// still the run's head as this store last saw it (its own last commit, or
// a Lock that found no other session's records), a batch skips Lock's
// round trip: BEGIN, appendSQL (the head's compare-and-set, the self-fence
// under the row lock it takes, the records, outputs and small blobs) and
// COMMIT go in one pipeline. A failed compare-and-set aborts the
// transaction with nothing written, and Sync or Confirm return
// runstate.ErrConflict; the committer then decides the batch again under
// Lock. The store bets only after Locks in a row have found no other
// session's records: one at first; after a lost bet 4, then 4 times as
// many for each further one, and twice as many for each Lock that finds
// another session's records (up to 256); half as many after each bet won.
// Where several processes take turns on one run a bet would lose most of
// the time, and a lost one costs more than a Lock: a ROLLBACK, and the
// Run's read of the records up to its position (runstate's rollBack).

// optimism is what the store knows of the run's head. Safe for concurrent
// use.
type optimism struct {
	mu     sync.Mutex
	known  bool
	head   runstate.Position // the head as last seen
	lastAt time.Time         // its last record's time
	offset time.Duration     // the database's clock minus the local one, at the last Lock
	quiet  int               // Locks in a row that found no other session's records
	need   int               // quiet Locks needed before a bet (0: 1)
	locks  int               // Locks taken (tests)
	eager  bool              // bet whenever the head is known (tests: racing bets)
	bets   int               // optimistic batches made (tests)
	lost   int               // of which conflicts (tests)
}

// locked notes a Lock's head and clock.
func (o *optimism) locked(head runstate.Position, lastAt *time.Time, dbNow time.Time, others bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.known, o.head = true, head
	o.lastAt = time.Time{}
	if lastAt != nil {
		o.lastAt = *lastAt
	}
	o.offset = time.Until(dbNow)
	o.locks++
	if others {
		o.quiet = 0
		o.need = min(max(2*o.need, 4), 256)
	} else {
		o.quiet++
	}
}

// committed notes a committed batch (won, if it was a bet): the head is
// its last record.
func (o *optimism) committed(to runstate.Position, at time.Time, bet bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.known, o.head, o.lastAt = true, to, at
	if bet {
		o.need /= 2
	}
}

// conflict notes a lost bet.
func (o *optimism) conflict() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.quiet = 0
	o.need = min(max(4*o.need, 4), 256)
	o.lost++
}

// LockOptimistic returns an optimistic batch when from is the head as this
// store last saw it, no other session appended lately and the session
// holds its lock; it takes no lock and no connection (the commit does).
func (s *store) LockOptimistic(from runstate.Position) (runstate.OptimisticBatch, bool) {
	s.mu.Lock()
	ses, runID := s.ses, s.runID
	s.mu.Unlock()
	if ses == nil || runID == "" {
		return nil, false
	}
	ses.mu.Lock()
	held := ses.conn != nil && ses.lost == nil
	ses.mu.Unlock()
	if !held {
		return nil, false // Lock waits for a re-held lock, or reports the loss
	}
	o := &s.opt
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.known || (o.quiet < max(o.need, 1) && !o.eager) || o.head.Seq != from.Seq || o.head.Hash != from.Hash {
		return nil, false
	}
	o.bets++
	// The database's clock as last seen, never before the head's record
	// (stored to the microsecond).
	now := time.Now().Add(o.offset).UTC()
	if min := o.lastAt.Truncate(time.Microsecond).Add(2 * time.Microsecond); now.Before(min) {
		now = min.UTC()
	}
	return &batch{s: s, ses: ses, runID: runID, head: from, now: now, opt: true}, true
}

// bet refuses to commit an optimistic batch that only the lock can prove
// right: one that asked Alive about another session, or appended nothing
// (its decisions could rest on an old head).
func (b *batch) bet() error {
	switch {
	case !b.opt:
		return nil
	case b.needLock:
		return fmt.Errorf("%w: run %s: the batch asked whether another session lives", runstate.ErrConflict, b.s.name)
	case len(b.rows.seq) == 0:
		return fmt.Errorf("%w: run %s: the batch appended nothing", runstate.ErrConflict, b.s.name)
	}
	return nil
}

// Confirm commits an optimistic batch with synchronous_commit off (a
// batch of begins): visible when it returns, durable with the next
// synchronous commit. ErrConflict: nothing was written.
func (b *batch) Confirm(ctx context.Context) error {
	if b.done || b.synced {
		return nil
	}
	if err := b.bet(); err != nil {
		return err
	}
	err := b.commit(ctx, true)
	if err == nil {
		b.synced = true
	} else {
		b.failed = true
	}
	return err
}

var _ runstate.Optimist = (*store)(nil)

// fenceKey is appendSQL's self-fence: the session's lock key in an
// optimistic batch; none (NULL) under Lock, which probed it already.
func (b *batch) fenceKey() *int64 {
	if !b.opt {
		return nil
	}
	return &b.ses.key
}
