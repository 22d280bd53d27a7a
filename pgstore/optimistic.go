package pgstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
)

// Optimistic batches (runstate.Optimist): when the session's position is
// still the run's head as this store last saw it (its own last commit, or
// a Lock that found no other session's records), a batch skips Lock's
// round trip. Its commit is one pipeline: BEGIN; betSQL, which locks the
// head row NOWAIT only if it is still at the bet's position and probes
// the session's own lock under that row lock (the self-fence Lock
// probes); then the same statements as a locked batch's commit
// (commitBatch: blobs, appendSQL, projections, [SET LOCAL
// synchronous_commit = off], COMMIT). A head that moved, a head row
// another session's batch holds, or a session whose own lock was
// takeable, each fails betSQL and so the transaction, with nothing
// written: Sync or Confirm return runstate.ErrConflict (or
// ErrSessionLost for a session proven gone), and the committer decides the
// batch again under Lock. The locked path's statements are untouched.
//
// The store bets only after Locks in a row have found no other
// session's records: two at first (Open's and the first batch's: where
// several processes open one run together, the first batch after Open
// finds the others' records, and a bet there would be lost); after a lost
// bet 4, then 4 times as many for each further one, and twice as many for
// each Lock that finds another session's records (up to 256); half as
// many after each bet won.
// Where several processes take turns on one run a bet would lose most of
// the time, and a lost one costs more than a Lock: a ROLLBACK, and the
// Run's read of the records up to its position (runstate's rollBack).

// minQuiet is the fewest quiet Locks in a row before a bet (a variable
// for tests, which set it to 0 to make a session bet whenever it knows
// the head).
var minQuiet = 2

// optimism is what the store knows of the run's head. Safe for concurrent
// use.
type optimism struct {
	mu     sync.Mutex
	known  bool
	head   runstate.Position // the head as last seen
	lastAt time.Time         // its last record's time
	offset time.Duration     // the database's clock minus the local one, at the last Lock
	quiet  int               // Locks in a row that found no other session's records
	need   int               // quiet Locks needed before a bet (at least minQuiet)
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
	if !o.known || (o.quiet < max(o.need, minQuiet) && !o.eager) || o.head.Seq != from.Seq || o.head.Hash != from.Hash {
		return nil, false
	}
	o.bets++
	// The database's clock as last seen, never before the head's record
	// (stored to the microsecond).
	now := time.Now().Add(o.offset).UTC()
	if min := o.lastAt.Truncate(time.Microsecond).Add(2 * time.Microsecond); now.Before(min) {
		now = min.UTC()
	}
	return betBatch{&batch{s: s, ses: ses, runID: runID, head: from, now: now, opt: true}}, true
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

// betBatch is the runstate.OptimisticBatch of LockOptimistic. Confirm is
// its own, not *batch's: the committer Confirms every batch that has it
// before it releases the batch's callers, and a locked batch of begins
// must release them first and COMMIT at Unlock, while they go on (the
// Confirm on every locked batch cost 4 processes on one run about 20% of
// their throughput and doubled their p99).
type betBatch struct{ *batch }

// Confirm commits an optimistic batch with synchronous_commit off (a
// batch of begins): visible when it returns, durable with the next
// synchronous commit. ErrConflict: nothing was written.
func (b betBatch) Confirm(ctx context.Context) error {
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

// betSQL is an optimistic batch's first statement after BEGIN: it locks
// the head row only if the row is still at the bet's position ($2, $3),
// without waiting for another session's batch (NOWAIT: 55P03), and then,
// under that row lock, probes the session's own lock ($4): takeable means
// the session is gone. No row (the head moved) divides by zero (22012);
// a takeable own lock takes the square root of -1 (2201F). Both failing
// expressions depend on the row and on a volatile function, so that the
// planner cannot fold them into an error at plan time.
const betSQL = `SELECT 1 / count(*)::int, sqrt(min(CASE WHEN pg_try_advisory_xact_lock_shared($4) THEN -1 ELSE 1 END))
FROM (SELECT FROM {s}.runs WHERE id = $1 AND last_seq = $2 AND last_hash = $3 FOR NO KEY UPDATE NOWAIT) h`

// betBatch makes an optimistic batch's commit round trip of pb (a locked
// batch's, commitBatch): BEGIN and betSQL before it when it appends
// records; BEGIN alone before a batch of projections only (the handoff
// timer's flushes: newest seq wins, no proof of the head needed). It takes
// the batch's connection from the pool. A nil batch: nothing to send
// (nothing due), or err.
func (b *batch) betBatch(ctx context.Context, pb *pgx.Batch) (*pgx.Batch, error) {
	n := len(b.rows.seq)
	if n == 0 && len(b.inline) == 0 && !hasPublish(pb) {
		return nil, nil // an optimistic batch with nothing to write: no transaction
	}
	if b.conn == nil {
		conn, err := b.s.db.pool.Acquire(ctx)
		if err != nil {
			b.s.blobs.putBack(b.inline)
			return nil, fmt.Errorf("%w: %w", runstate.ErrConflict, b.s.db.connectError(err)) // nothing was sent: Lock decides
		}
		b.conn = conn
	}
	head := []*pgx.QueuedQuery{{SQL: "BEGIN"}}
	if n > 0 {
		hash, _ := hex.DecodeString(b.head.Hash)
		head = append(head, &pgx.QueuedQuery{SQL: b.s.db.sql(betSQL), Arguments: []any{b.runID, b.head.Seq, hash, b.ses.key}})
	}
	pb.QueuedQueries = append(head, pb.QueuedQueries...)
	return pb, nil
}

// hasPublish reports whether pb carries more than SET LOCAL and COMMIT.
func hasPublish(pb *pgx.Batch) bool {
	for _, q := range pb.QueuedQueries {
		if q.SQL != "COMMIT" && q.SQL != "SET LOCAL synchronous_commit = off" {
			return true
		}
	}
	return false
}

// lostBet is the error of an optimistic batch whose betSQL failed with
// code: runstate.ErrConflict (the head moved or is held), or, for a
// session whose own lock was takeable, ErrSessionLost when the session is
// lost and ErrConflict while its lock is being taken again (Lock waits for
// that).
func (b *batch) lostBet(code string) error {
	b.s.opt.conflict()
	switch code {
	case "55P03":
		return fmt.Errorf("%w: run %s: another session's batch holds the head row", runstate.ErrConflict, b.s.name)
	case "2201F":
		if err := b.ses.fenced(); !errors.Is(err, errRehold) {
			return err
		}
		return fmt.Errorf("%w: run %s: the session's lock is being taken again", runstate.ErrConflict, b.s.name)
	}
	return fmt.Errorf("%w: run %s: another session appended after record %d", runstate.ErrConflict, b.s.name, b.head.Seq)
}
