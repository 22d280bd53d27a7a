package pgstore

// Commit ambiguity. A COMMIT whose reply is lost (the
// connection broke, or the context ended, after it was sent) may or may
// not have landed. Asking the table answers it by content, as DBOS's
// "sameWrite" does: every line carries this session's id and a ns
// timestamp, so a record with our line's hash at our seq is ours, and no
// other writer's record ever has it. The answer must come from under the
// run's head row lock: until the old backend's transaction has ended (its
// COMMIT still flushing, or an orphaned transaction the server has not yet
// noticed) a plain SELECT sees "absent", and the records could land after
// we said so. An optimistic batch's transaction takes the head row only in
// its commit round trip, so even that wait does not order it (its backend
// may run the pipeline it received after the check): it can land only
// while the head is at the bet's position, so a re-run that finds the
// head moved resolves again, and that answer is final (rerun).

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/runstate/runstate"
)

// commitMark names one record of a batch whose COMMIT's outcome is
// unknown: its seq and the sha256 of its line.
type commitMark struct {
	Seq  int64
	Hash []byte
}

// CommitTimeout bounds how long resolveCommit tries to reach the database
// (a new connection each try, with a growing pause) after a connection
// was lost around a COMMIT, to read whether the batch's records are in
// the table: past it the outcome is unknown and the Run turns read-only;
// the next Open reads the outcome from the table. Tests shorten it; set it before opening
// runs, it is not guarded for concurrent change.
var CommitTimeout = 30 * time.Second

// errHalf: one transaction wrote both records or neither, so finding one
// of them means the table was edited; no retry helps.
var errHalf = errors.New("only one of them is in the table (the records table was edited by hand?); run 'runstate verify'")

// settle decides the outcome of a batch whose commitBatch was sent and
// whose reply was lost (err): committed -> nil, as if the reply had come.
// Not committed -> the batch is run again, once, on a fresh connection
// under a fresh lock (rerun), when nothing it was decided on changed
// meanwhile; else an error, nothing recorded. Unknown -> an error
// wrapping runstate.ErrReadOnly ("commit outcome unknown"): the Run
// refuses every later write, and the next Open reads the outcome from the
// table.
func (b *batch) settle(ctx context.Context, err error, lazy bool) error {
	ctx = context.WithoutCancel(ctx) // the caller's deadline may be what cut the COMMIT
	if done, rerr := b.resolve(ctx); done {
		return rerr
	}
	first, last := b.marks()
	if afterResolve != nil {
		afterResolve()
	}
	if rerr := b.rerun(ctx, lazy); rerr != nil {
		if errors.Is(rerr, runstate.ErrReadOnly) {
			return rerr
		}
		return fmt.Errorf("%w: pgstore: run %s: the connection was lost before the COMMIT of records %d-%d landed (%v), and running the batch again failed, so nothing was recorded (this Run is read-only: open the run again): %w",
			runstate.ErrReadOnly, b.s.name, first.Seq, last.Seq, err, rerr)
	}
	return nil
}

// afterResolve, when set (tests), runs after settle found the batch not
// committed and before it runs the batch again.
var afterResolve func()

// resolve asks the table whether the batch committed (resolveCommit):
// done when it did (nil: acknowledged, as if the reply had come) or when
// the outcome is unknown (the error); else it did not, and may run again.
func (b *batch) resolve(ctx context.Context) (done bool, err error) {
	first, last := b.marks()
	committed, rerr := resolveCommit(ctx, b.s.connect, b.runID, first, last)
	switch {
	case rerr != nil:
		return true, b.unknown(first, last, rerr)
	case committed:
		b.committed()
		return true, nil
	}
	return false, nil
}

// marks are the batch's first and last records.
func (b *batch) marks() (first, last commitMark) {
	n := len(b.rows.seq)
	return commitMark{Seq: b.rows.seq[0], Hash: b.rows.hash[0]}, commitMark{Seq: b.rows.seq[n-1], Hash: b.rows.hash[n-1]}
}

func (b *batch) unknown(first, last commitMark, err error) error {
	return fmt.Errorf("%w: run %s: the connection was lost around the COMMIT of records %d-%d and the outcome is unknown: %v; open the run again (Open reads the outcome from the table)",
		runstate.ErrReadOnly, b.s.name, first.Seq, last.Seq, err)
}

// errRerun: a re-run found the run changed since the batch was decided.
var errRerun = errors.New("the run changed since the batch was decided")

// rerun runs the batch again on a new pooled connection: it locks the head
// row and goes on only if the head is still where the batch was decided
// (no other writer appended meanwhile), this session still holds its lock,
// and every session the batch found gone is still gone (one may have
// taken its lock again meanwhile: then the batch's interrupted records
// would be false). A session whose lock is being taken again (a server
// restart dropped every lock) is waited for, as Lock does, and a failed
// connection is tried again until CommitTimeout. Then it sends
// commitBatch once more; a reply lost again is resolved again, never
// re-run twice.
func (b *batch) rerun(ctx context.Context, lazy bool) error {
	ctx, cancel := context.WithTimeout(ctx, CommitTimeout)
	defer cancel()
	var conn *pgxpool.Conn
	wait := 50 * time.Millisecond // between tries on a failed connection
	for try := 0; ; try++ {
		if err := b.ses.check(ctx); err != nil {
			return err
		}
		var err error
		if conn, err = b.relock(ctx); err == nil {
			break
		}
		if errors.Is(err, errRerun) && b.opt {
			// An optimistic batch's lost transaction takes the head row
			// only in its commit round trip: it may have landed after
			// resolveCommit found it absent (its backend was slow to
			// run the pipeline it had received). Now that the head has
			// left the bet's position it never can: this answer is
			// final.
			if done, rerr := b.resolve(ctx); done {
				return rerr
			}
		}
		switch {
		case try < 3 && ctx.Err() == nil && errors.Is(err, errRehold):
			continue
		case ctx.Err() == nil && isConnError(err):
			// The pool's other connections may be as dead as the
			// batch's (a server restart ends them all, and the pool
			// hands out one idle for less than a second unpinged), or
			// the server not up yet: again, with a growing pause,
			// until CommitTimeout.
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return err
			}
			wait = min(2*wait, time.Second)
			continue
		}
		return err
	}
	pb, cut := b.commitBatch(lazy)
	err := sendCommit(ctx, conn, pb, cut)
	switch {
	case err == nil:
		b.committed()
		return nil
	case !ambiguous(err):
		return b.appendError(err)
	}
	first, last := b.marks()
	committed, rerr := resolveCommit(ctx, b.s.connect, b.runID, first, last)
	switch {
	case rerr != nil:
		return b.unknown(first, last, rerr)
	case !committed:
		return fmt.Errorf("the connection was lost again before the second COMMIT landed: %w", err)
	}
	b.committed()
	return nil
}

// relock takes a new pooled connection for the batch (the old one is
// broken, or in a transaction: the pool drops it), locks the head row
// there and checks that nothing the batch was decided on has changed.
func (b *batch) relock(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := b.s.db.pool.Acquire(ctx)
	if err != nil {
		return nil, b.s.db.connectError(err)
	}
	if b.conn != nil {
		b.conn.Release()
	}
	b.conn = conn
	var pb pgx.Batch
	pb.Queue(beginSQL)
	pb.Queue(lockSetupSQL) // its commit is commitBatch's, as after Lock
	pb.Queue(b.s.db.sql(`SELECT last_seq, last_hash FROM {s}.runs WHERE id = $1 FOR UPDATE`), b.runID)
	pb.Queue(`SELECT NOT pg_try_advisory_xact_lock_shared($1)`, b.ses.key)
	for _, d := range b.dead {
		pb.Queue("SELECT "+goneSQL, lockKey(d), pipeKey(d))
	}
	br := conn.SendBatch(ctx, &pb)
	err = b.recheck(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_, _ = conn.Exec(ctx, "ROLLBACK")
		return nil, err
	}
	return conn, nil
}

// recheck reads the answers of relock's round trip.
func (b *batch) recheck(br pgx.BatchResults) error {
	for range 2 { // BEGIN, lockSetupSQL
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	var seq int64
	var hash []byte
	if err := br.QueryRow().Scan(&seq, &hash); err != nil {
		return err
	}
	if seq != b.head.Seq || hex.EncodeToString(hash) != b.head.Hash {
		return fmt.Errorf("%w: the last record is %d now, the batch followed %d", errRerun, seq, b.head.Seq)
	}
	var alive bool
	if err := br.QueryRow().Scan(&alive); err != nil {
		return err
	}
	if !alive {
		return b.ses.fenced()
	}
	for _, d := range b.dead {
		var gone bool
		if err := br.QueryRow().Scan(&gone); err != nil {
			return err
		}
		if !gone {
			return fmt.Errorf("%w: session %s, which the batch found gone, holds its lock again", errRerun, d)
		}
	}
	return nil
}

// resolveCommit finds out whether the batch whose records run from first
// to last committed: on new connections (store.connect sets search_path to
// the schema), with backoff, until CommitTimeout, it locks the run's head row
// and reads the hashes at first.Seq and last.Seq. Both ours: committed,
// and on disk when it returns (checkCommit flushes them).
// Neither there, or other records there: not committed, and since the
// check waited for the head row, the lost transaction can no longer land.
// An error means the outcome is still unknown (or the table contradicts
// itself: errHalf).
func resolveCommit(ctx context.Context, connect func(context.Context) (*pgx.Conn, error), runID string, first, last commitMark) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, CommitTimeout)
	defer cancel()
	start := time.Now()
	wait := 20 * time.Millisecond
	var lastErr error
	for tries := 1; ; tries++ {
		committed, err := checkCommit(ctx, connect, runID, first, last)
		if err == nil || errors.Is(err, errHalf) {
			return committed, err
		}
		lastErr = err
		// Jittered, so that the sessions a failover cut off do not
		// reconnect in step.
		t := time.NewTimer(wait/2 + time.Duration(rand.Int64N(int64(wait))))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("commit outcome unknown: no answer from the database in %v (%d tries): %w",
				time.Since(start).Round(time.Millisecond), tries, lastErr)
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// checkCommit is one try of resolveCommit.
func checkCommit(ctx context.Context, connect func(context.Context) (*pgx.Conn, error), runID string, first, last commitMark) (bool, error) {
	conn, err := connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.BeginTx(ctx, readCommitted)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // read only
	if _, err := tx.Exec(ctx, noTimeoutsSQL); err != nil {
		return false, err
	}
	var headSeq int64
	if err := tx.QueryRow(ctx, `SELECT last_seq FROM runs WHERE id = $1 FOR UPDATE`, runID).Scan(&headSeq); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("the run's row (id %s) is gone from the runs table: %w", runID, errHalf)
		}
		return false, err
	}
	rows, err := tx.Query(ctx, `SELECT seq, hash FROM records WHERE run_id = $1 AND seq = ANY($2::bigint[])`,
		runID, []int64{first.Seq, last.Seq})
	if err != nil {
		return false, err
	}
	got := map[int64][]byte{}
	for rows.Next() {
		var seq int64
		var h []byte
		if err := rows.Scan(&seq, &h); err != nil {
			rows.Close()
			return false, err
		}
		got[seq] = h
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	f, l := bytes.Equal(got[first.Seq], first.Hash), bytes.Equal(got[last.Seq], last.Hash)
	if f != l || (f && headSeq < last.Seq) {
		return false, fmt.Errorf("records %d and %d of one batch: %w", first.Seq, last.Seq, errHalf)
	}
	if f {
		// Found, but maybe not yet on disk: a locked batch's records
		// commit before their flush (commitBatch), a lazy one's without
		// it. The head row's lock gave this transaction an xid and WAL, so
		// its synchronous COMMIT waits for the flush up to its own commit
		// record, past the records'.
		if _, err := tx.Exec(ctx, syncOnSQL); err != nil {
			return false, err
		}
		if err := tx.Commit(ctx); err != nil {
			return false, err
		}
	}
	return f, nil
}
