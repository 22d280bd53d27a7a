package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
)

// Optimistic batches (runstate.Optimist): when the session's position is
// still the run's head as this store last saw it (its own last commit, or
// a Lock that found no other session's records), a batch skips Lock's
// round trip. Its commit is one pipelined round trip with no BEGIN and no
// COMMIT (betBatch): the small blobs it carries that none of its outputs
// holds in its row (a checkpoint's complete has none: its output's bytes
// are in its row, and the complete is one statement with the projections
// due), then ONE append statement (betForm), which locks the head row
// NOWAIT (on the pipeline, waiting: aheadForm), moves it only if it is
// still at the bet's position and probes the session's own lock under
// that row lock (the self-fence Lock probes) before the records and their
// outputs, and which sets synchronous_commit off for its transaction when
// the batch is lazy; then the projections.
// In the extended protocol, the statements up to the pipeline's Sync (pgx
// sends one, at the end of a Batch) are one implicit transaction,
// committed at the Sync; a statement that fails makes the server skip the
// rest and roll the transaction back there. A
// head that moved, a head row another session's batch holds, or a session
// whose own lock was takeable, each fails the append statement (22012,
// 55P03, 2201F) and so the transaction, with nothing written: Sync or
// Confirm return runstate.ErrConflict (or ErrSessionLost for a session
// proven gone), and the committer decides the batch again under Lock. A
// connection lost around the Sync leaves the outcome unknown as around a
// COMMIT, and is resolved the same way (resolve.go: settle, a re-run under
// the lock). The locked path's statements are untouched: its transaction
// spans round trips, from Lock's BEGIN to the commit's COMMIT.
//
// The store bets only after Locks in a row have found no other
// session's records: two at first (Open's and the first batch's: where
// several processes open one run together, the first batch after Open
// finds the others' records, and a bet there would be lost); after a lost
// bet 4, then 4 times as many for each further one, and twice as many for
// each Lock that finds another session's records (up to 256); half as
// many after each bet won.
// Where several processes take turns on one run a bet would lose most of
// the time, and a lost one costs more than a Lock: its round trip (the
// server rolled it back at the Sync: no ROLLBACK), and the Run's read of
// the records up to its position (runstate's rollBack).

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
	won    int               // of which committed records (tests)
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
		o.won++
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

// The bet forms of the three append statements (appendOneSQL,
// appendOneOutputSQL, appendSQL): the same writes, led by the head's
// compare-and-set, head, whose one-time filter (an InitPlan) first locks
// the head row without waiting for another session's batch (NOWAIT:
// 55P03); the UPDATE then moves the row only if it is still at the bet's
// position ($P, $H), and its RETURNING, evaluated for the row it moved,
// under that row lock, probes the session's own lock ($K): takeable means
// the session is gone (a NULL $K probes nothing: a batch of begins sent
// ahead, ahead.go). A takeable own lock takes the square root of -1
// (2201F); no row moved (the head moved) makes the last SELECT divide by
// zero (22012). Either fails the statement, and so its implicit
// transaction: nothing of it is committed. The records and outputs select
// FROM head, WHERE its fence is 1: they are inserted only after the
// head's row lock, move and fence (a data-modifying CTE that another
// reads runs first). The fence depends on the row and on a volatile
// function, so that the planner cannot fold it into an error at plan
// time. The statement ends with set_config('synchronous_commit', 'off',
// true) when $L (a lazy batch): local to the transaction, which the
// pipeline's Sync commits. (SET LOCAL would do too, the implicit
// transaction lasting to the Sync, but as a statement more, with a
// warning: outside a transaction block.) When not lazy, it sets
// synchronous_commit on for its transaction where the connection's is
// off, as syncOnSQL does for a locked batch.
//
// Until 2026-12-05 a first CTE locked the row and probed the lock (an
// aggregate over the locked row), and the UPDATE ran after it: the same
// row lock, fence and errors, and the same WAL, but a second scan of the
// row and an aggregate more. The server's time for the statement fell by
// about a quarter (pg_stat_statements, 800 sequential checkpoints: a
// begin's 91 -> 69 µs, a complete's 138 -> 99 µs).
var betForm = betForms(betHead)

// aheadForm is betForm on the pipeline (ahead.go), where the session has
// the run alone: the UPDATE takes the head's row lock itself, waiting for
// it as any UPDATE does, instead of an InitPlan taking it NOWAIT first.
// NOWAIT is for sessions that share the run, whose bets must not queue
// behind another session's batch held through its WAL flush. A session
// that has the run alone meets no such batch: only short transactions
// that wait for nothing this session holds lock the row meanwhile (a
// session taking its lock again, the check of a lost reply: resolve.go),
// and a batch sent ahead that failed on one (55P03) made the Run
// read-only, its callers already let go. The wait cannot close a
// deadlock: the statement is the first of its transaction to lock
// anything (a batch that stores blobs before it keeps betForm:
// queueWrites), and no holder of the row waits for the run's lock, which
// a session takes before the row (session.go). Without the InitPlan the
// statement scans the row once and writes no lock record to the WAL: the
// server's time for a begin fell from 85 to 61-67 µs and for a complete
// from 112 to 90-93 µs (pg_stat_statements, 4,200 sequential checkpoints,
// 2026-12-06).
var aheadForm = betForms(aheadHead)

// betForms makes the bet forms of the three append statements, led by
// head (betHead or aheadHead).
func betForms(head string) map[string]string {
	return map[string]string{
		appendOneSQL: betNumbered(head+`ins AS (
  INSERT INTO {s}.records (run_id, seq, line, hash, ev, stage, attempt, key, session, at)
  SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 FROM head WHERE head.fence = 1
)
`+betEnd, "$P", "$13", "$H", "$14", "$K", "$15", "$L", "$16", "$Q", "$2", "$W", "$4", "$E", "$11", "$N", "$12", "$T", "$10"),
		appendOneOutputSQL: betNumbered(head+`ins AS (
  INSERT INTO {s}.records (run_id, seq, line, hash, ev, stage, attempt, key, session, at)
  SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 FROM head WHERE head.fence = 1
), outs AS (
  INSERT INTO {s}.outputs (run_id, seq, path, sha256, size, data)
  SELECT $1, $2, o.path, o.sum, o.size, `+outputDataSQL+` FROM head, (VALUES ($15::text, $16::bytea, $17::bigint, $18::bytea)) o(path, sum, size, data)
  WHERE head.fence = 1
)
`+betEnd, "$P", "$13", "$H", "$14", "$K", "$19", "$L", "$20", "$Q", "$2", "$W", "$4", "$E", "$11", "$N", "$12", "$T", "$10"),
		appendSQL: betNumbered(head+`ins AS (
  INSERT INTO {s}.records (run_id, seq, line, hash, ev, stage, attempt, key, session, at)
  SELECT $1, u.* FROM head, unnest($2::bigint[], $3::bytea[], $4::bytea[], $5::text[], $6::text[], $7::int[], $8::text[], $9::uuid[], $10::timestamptz[]) u
  WHERE head.fence = 1
), outs AS (
  INSERT INTO {s}.outputs (run_id, seq, path, sha256, size, data)
  SELECT $1, o.seq, o.path, o.sum, o.size, `+outputDataSQL+` FROM head, unnest($11::bigint[], $12::text[], $13::bytea[], $14::bigint[], $22::bytea[]) o(seq, path, sum, size, data)
  WHERE head.fence = 1
)
`+betEnd, "$P", "$20", "$H", "$21", "$K", "$23", "$L", "$24", "$Q", "$15", "$W", "$16", "$E", "$17", "$N", "$18", "$T", "$19"),
	}
}

const (
	// betHead and aheadHead differ only in the InitPlan that takes the
	// head row NOWAIT (headWhere, headFence: their shared parts).
	betHead = headWhere + `    AND ctid = (SELECT ctid FROM {s}.runs WHERE id = $1 FOR NO KEY UPDATE NOWAIT)
` + headFence
	aheadHead = headWhere + headFence
	headWhere = `WITH head AS (
  UPDATE {s}.runs SET last_seq = $Q, last_hash = $W, last_end = $E, last_len = $N, last_at = $T
  WHERE id = $1 AND last_seq = $P AND last_hash = $H
`
	headFence = `  RETURNING sqrt(CASE WHEN pg_try_advisory_xact_lock_shared($K) THEN -1 ELSE 1 END) AS fence
), `
	betEnd = `SELECT 1 / (SELECT count(*)::int FROM head), CASE WHEN $L THEN set_config('synchronous_commit', 'off', true)
  WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'on', true) END`
)

// betNumbered puts the parameter numbers of one statement into the bet's
// parts.
func betNumbered(q string, oldnew ...string) string { return strings.NewReplacer(oldnew...).Replace(q) }

// betLazySQL makes an optimistic batch without records (projections, or
// blobs) commit with synchronous_commit off.
const betLazySQL = `SELECT set_config('synchronous_commit', 'off', true)`

// betBatch makes an optimistic batch's commit round trip: its writes
// (queueWrites: the small blobs, the append statement's bet form, the
// projections), with no BEGIN and no COMMIT: in the extended protocol the
// statements up to the pipeline's one Sync are one implicit transaction,
// committed at the Sync, or rolled back there when a statement failed
// (the server skips the rest). A batch of projections only (the handoff
// timer's flushes: newest seq wins, no proof of the head needed) has no
// bet statement, and betLazySQL when lazy. It takes the batch's
// connection from the pool. A nil batch: nothing to send (nothing due),
// or err.
func (b *batch) betBatch(ctx context.Context, lazy bool) (*pgx.Batch, error) {
	var pb pgx.Batch
	b.queueWrites(&pb, lazy, []any{b.ses.key, lazy}, betForm)
	if len(pb.QueuedQueries) == 0 {
		return nil, nil // an optimistic batch with nothing to write: no transaction
	}
	if len(b.rows.seq) == 0 && lazy {
		pb.Queue(betLazySQL)
	}
	if b.conn == nil {
		conn, err := b.s.db.pool.Acquire(ctx)
		if err != nil {
			b.s.blobs.putBack(b.inline)
			return nil, fmt.Errorf("%w: %w", runstate.ErrConflict, b.s.db.connectError(err)) // nothing was sent: Lock decides
		}
		b.conn = conn
	}
	return &pb, nil
}

// lostBet is the error of an optimistic batch whose bet failed with
// code: runstate.ErrConflict (the head moved or is held; or, 40001, a
// serialization failure where the connection's default isolation is
// stricter than READ COMMITTED: its snapshot predates a commit it
// conflicts with, a moved head as a rule), or, for a
// session whose own lock was takeable, ErrSessionLost when the session is
// lost and ErrConflict while its lock is being taken again (Lock waits for
// that).
func (b *batch) lostBet(code string) error {
	b.s.opt.conflict()
	switch code {
	case "55P03":
		return fmt.Errorf("%w: run %s: another session's batch holds the head row", runstate.ErrConflict, b.s.name)
	case "40001":
		return fmt.Errorf("%w: run %s: a concurrent transaction conflicts with the bet at this connection's isolation level", runstate.ErrConflict, b.s.name)
	case "40P01":
		return fmt.Errorf("%w: run %s: the bet was chosen to end a deadlock", runstate.ErrConflict, b.s.name)
	case "2201F":
		if err := b.ses.fenced(); !errors.Is(err, errRehold) {
			return err
		}
		return fmt.Errorf("%w: run %s: the session's lock is being taken again", runstate.ErrConflict, b.s.name)
	}
	return fmt.Errorf("%w: run %s: another session appended after record %d", runstate.ErrConflict, b.s.name, b.head.Seq)
}
