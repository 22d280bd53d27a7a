package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/runstate/runstate"
)

// grace: a server that started less than this ago has lost every session
// lock with its restart; sessions reconnect and take theirs again within
// it, so until then none is taken for gone (a session that opened before
// the restart counts as alive: otherwise every session would be
// interrupted at once by the first to reconnect).
var grace = 10 * time.Second

// batch is one append transaction on a pooled connection: the run's head
// row locked FOR NO KEY UPDATE from Lock to COMMIT (Sync or Unlock) or
// ROLLBACK (Abort); Sync's wait for the WAL flush comes after that COMMIT
// (commitBatch). Not safe for concurrent use: the group-commit leader
// drives it.
type batch struct {
	s     *store
	ses   *session
	conn  *pgxpool.Conn
	runID string

	head    runstate.Position // the head row as locked
	now     time.Time         // the database's clock, never before the head's
	inGrace bool              // the server started less than grace ago
	tail    [][]byte          // lines after from, read under the lock
	// dead: the sessions Alive found gone (their locks this transaction
	// holds shared): a re-run of the batch must find them gone again.
	dead []string

	// What Append queued, sent with the COMMIT in one round trip.
	rows   recordRows
	outs   outputRows
	to     runstate.Position
	synced bool
	failed bool // Sync failed: Unlock and Abort only roll back
	done   bool
	// inline: the small blobs this batch's COMMIT carries (blobs.go),
	// taken once, so that a re-run of the commit carries them again.
	inline []inlineBlob
	took   bool

	// opt: an optimistic batch (optimistic.go), which holds no lock and
	// no connection until its commit; needLock: a decision asked Alive
	// about another session, which only the lock can answer.
	opt      bool
	needLock bool
}

type recordRows struct {
	seq        []int64
	line, hash [][]byte
	ev         []string
	stage, key []*string
	sessID     []pgtype.UUID // binary: a []*string went through pgx's failed binary try, then text
	attempt    []*int32
	at         []time.Time
}

type outputRows struct {
	seq  []int64
	path []string
	sha  [][]byte
	size []int64
}

// Lock starts the batch's transaction in one pipelined round trip: BEGIN,
// the head row FOR NO KEY UPDATE (which serializes the run's writers on every
// machine), then, as statements of their own so that they run after the
// wait for the row, the session's self-fence (its own lock must not be
// takeable), the clock, and the records after from.
func (s *store) Lock(ctx context.Context, from runstate.Position) (runstate.Batch, error) {
	ses, err := s.session()
	if err != nil {
		return nil, err
	}
	runID, err := s.id(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.flushAhead(ctx); err != nil { // ordered after what was sent ahead (ahead.go)
		return nil, err
	}
	var down time.Time // since when the server has not answered
	wait := 50 * time.Millisecond
	for try := 0; ; try++ {
		// A lock connection being re-established is waited for.
		if err := ses.check(ctx); err != nil {
			return nil, err
		}
		b, err := s.lockOnce(ctx, ses, runID, from)
		if err == nil {
			return b, nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, s.waitError(ctx, cerr)
		}
		// Nothing was written: a batch whose session was re-holding its
		// lock is tried again; one whose connection failed (a server
		// restart) is tried again with a growing pause, for as long as
		// the session may take its lock back (lostAfter), so that a
		// restart does not fail the calls under way.
		switch {
		case errors.Is(err, errRehold) && try < 10:
			continue
		case isConnError(err):
			if down.IsZero() {
				down = time.Now()
			}
			if time.Since(down) < lostAfter {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return nil, s.waitError(ctx, ctx.Err())
				}
				wait = min(2*wait, time.Second)
				continue
			}
		}
		return nil, err
	}
}

// waitError is Lock's error when ctx ended first: it wraps ctx's error
// (and runstate.ErrLockTimeout for a deadline) and says who held the run.
func (s *store) waitError(ctx context.Context, cerr error) error {
	if errors.Is(cerr, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w: the head row of %s was held by another session's batch (see pg_stat_activity for its client); nothing was recorded",
			runstate.ErrLockTimeout, cerr, s)
	}
	return fmt.Errorf("%w: waiting for the head row of %s; nothing was recorded", cerr, s)
}

func (s *store) lockOnce(ctx context.Context, ses *session, runID string, from runstate.Position) (*batch, error) {
	conn, err := s.db.pool.Acquire(ctx)
	if err != nil {
		return nil, s.db.connectError(err)
	}
	b := &batch{s: s, ses: ses, conn: conn, runID: runID}
	if err := b.begin(ctx, from, false); err != nil {
		pc := conn.Conn().PgConn()
		b.release()
		if ctx.Err() != nil && pc.IsClosed() {
			// ctx ended the wait for the head row: pgx closed the
			// connection and asks the server, on a connection of its
			// own and after this returns, to cancel the statement. Until
			// that lands the backend still waits in the row's queue
			// (ahead of later writers); wait, as the session's start
			// does, until the server has ended it, so that the error
			// leaves no backend waiting behind.
			waitBackendGone(s.db, pc.PID())
		}
		return nil, err
	}
	return b, nil
}

// TryLock is Lock without a wait (runstate.TryLocker): the head row is
// locked FOR NO KEY UPDATE NOWAIT, and ok is false when another session holds it,
// or when this session's lock connection is being re-established (Lock
// waits for that). It saves the committer a hand-off to a goroutine per
// batch.
func (s *store) TryLock(from runstate.Position) (runstate.Batch, bool, error) {
	ses, err := s.session()
	if err != nil {
		return nil, false, err
	}
	ses.mu.Lock()
	conn, lost := ses.conn, ses.lost
	ses.mu.Unlock()
	if lost != nil {
		return nil, false, lost
	}
	if conn == nil {
		return nil, false, nil
	}
	ctx := context.Background()
	runID, err := s.id(ctx)
	if err != nil {
		return nil, false, err
	}
	if err := s.flushAhead(ctx); err != nil {
		return nil, false, err
	}
	pc, err := s.db.pool.Acquire(ctx)
	if err != nil {
		return nil, false, nil // Lock reports it
	}
	b := &batch{s: s, ses: ses, conn: pc, runID: runID}
	err = b.begin(ctx, from, true)
	var pe *pgconn.PgError
	switch {
	case err == nil:
		return b, true, nil
	case errors.As(err, &pe) && pe.Code == "55P03": // lock_not_available
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _ = pc.Exec(cctx, "ROLLBACK") // keep the pooled connection
		cancel()
		b.release()
		return nil, false, nil
	case errors.Is(err, errRehold) || isConnError(err):
		b.release()
		return nil, false, nil // Lock waits and tries again
	}
	b.release()
	return nil, false, err
}

// lockSetupSQL begins a locked batch's transaction (Lock's, and the one
// that re-runs a batch whose reply was lost: relock): noTimeoutsSQL, and
// every statement of the transaction runs its prepared statement's
// generic plan, planned once per connection (genericPlanSQL). Left to
// itself the server planned the read of the tail afresh at every Lock (76
// µs of its CPU, against 51 µs to run it, with 4 processes on one run):
// the generic plan of an open range "seq > $2" expects a third of the run
// and is a sequential scan and a sort, dearer than a custom plan for a
// tail of a few records; tailSQL's closed range makes the generic plan
// the index scan a custom one is. The other statements of the transaction
// (the head row by its key, the append statements, the projections by
// their key) plan the same either way.
const lockSetupSQL = noTimeoutsSQL + ", " + genericPlanSet

// tailSQL reads the records after $2 in order; $3 is math.MaxInt64 (a
// closed range for the generic plan: lockSetupSQL).
const tailSQL = `SELECT seq, line FROM {s}.records WHERE run_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq`

func (b *batch) begin(ctx context.Context, from runstate.Position, nowait bool) error {
	db := b.s.db
	var pb pgx.Batch
	pb.Queue(beginSQL)
	pb.Queue(lockSetupSQL)
	// FOR NO KEY UPDATE: exclusive among writers (and against FOR
	// UPDATE), but not against the FOR KEY SHARE of other transactions'
	// foreign-key checks on the row (a session's row, a projection), which
	// FOR UPDATE would make wait and could deadlock with.
	lock := "FOR NO KEY UPDATE"
	if nowait {
		lock = "FOR NO KEY UPDATE NOWAIT"
	}
	pb.Queue(db.sql(`SELECT last_seq, last_hash, last_end, last_len, last_at FROM {s}.runs WHERE id = $1 `+lock), b.runID)
	pb.Queue(`SELECT NOT pg_try_advisory_xact_lock_shared($1), clock_timestamp(), now() - pg_postmaster_start_time() < $2::interval`,
		b.ses.key, grace)
	pb.Queue(db.sql(tailSQL), b.runID, from.Seq, int64(math.MaxInt64))
	br := b.conn.SendBatch(ctx, &pb)
	defer br.Close()
	for range 2 { // BEGIN, lockSetupSQL
		if _, err := br.Exec(); err != nil {
			return db.connectError(err)
		}
	}
	var hash []byte
	var lastAt *time.Time
	if err := br.QueryRow().Scan(&b.head.Seq, &hash, &b.head.End, &b.head.LastLen, &lastAt); err != nil {
		var pe *pgconn.PgError
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("pgstore: run %s is gone from %s.runs (deleted by hand?)", b.s.name, db.schema)
		} else if errors.As(err, &pe) && pe.Code == "55P03" {
			return err
		}
		return db.rightsError("lock run "+b.s.name, err)
	}
	b.head.Hash = hex.EncodeToString(hash)
	var alive bool
	if err := br.QueryRow().Scan(&alive, &b.now, &b.inGrace); err != nil {
		return db.connectError(err)
	}
	b.now = b.now.UTC()
	if lastAt != nil && !b.now.After(*lastAt) {
		// One clock per run, never backwards: last_at is the last
		// record's time rounded to microseconds.
		b.now = lastAt.UTC().Add(time.Microsecond)
	}
	rows, err := br.Query()
	if err != nil {
		return db.connectError(err)
	}
	want := from.Seq + 1
	for rows.Next() {
		var seq int64
		var line []byte
		if err := rows.Scan(&seq, &line); err != nil {
			rows.Close()
			return err
		}
		if seq != want {
			rows.Close()
			return fmt.Errorf("pgstore: run %s: record %d is missing from %s.records (seq jumps to %d)", b.s.name, want, db.schema, seq)
		}
		want++
		b.tail = append(b.tail, line)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return db.connectError(err)
	}
	if !alive {
		return b.ses.fenced()
	}
	switch {
	case b.head.Seq < from.Seq:
		return fmt.Errorf("%w: run %s: the database's last record is %d, but this session read up to %d: records it saw are gone (a server crash lost unflushed records, or a restore from backup); open the run again",
			runstate.ErrSessionLost, b.s.name, b.head.Seq, from.Seq)
	case b.head.Seq != from.Seq+int64(len(b.tail)):
		return fmt.Errorf("pgstore: run %s: %s.runs names record %d as the last, but the records end at %d (edited by hand?); run 'runstate verify'",
			b.s.name, db.schema, b.head.Seq, from.Seq+int64(len(b.tail)))
	case len(b.tail) == 0 && b.head.Hash != from.Hash && from.Seq > 0:
		return fmt.Errorf("%w: run %s: record %d's hash in the database is not the one this session read; open the run again",
			runstate.ErrSessionLost, b.s.name, from.Seq)
	}
	b.s.opt.locked(b.head, lastAt, b.now, len(b.tail) > 0)
	return nil
}

// Tail calls fn with the lines other sessions appended since from.
func (b *batch) Tail(fn func(line []byte) error) error {
	for _, l := range b.tail {
		if err := fn(l); err != nil {
			return err
		}
	}
	return nil
}

// Now is the time for this batch's records: the database's clock, never
// before the run's last record.
func (b *batch) Now() time.Time { return b.now }

// Alive reports whether session holds its lock, probing it under the head
// row lock: a session whose lock and pipeline key (ahead.go) this
// transaction can both take (shared, until COMMIT) is gone. A failed
// probe, or a server within its restart grace, answers alive.
func (b *batch) Alive(session string) bool {
	if session == "" {
		return false
	}
	if session == b.ses.id {
		return true
	}
	if _, err := uuid.Parse(session); err != nil {
		return false // not a session this store can hold
	}
	if b.opt {
		b.needLock = true // the batch is decided again under the lock
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := "SELECT " + goneSQL
	if b.inGrace {
		// Only a session that held its lock before the restart may be
		// reconnecting; one opened since was proven gone by its lock.
		q = b.s.db.sql(`SELECT CASE WHEN EXISTS (SELECT 1 FROM {s}.sessions WHERE id = $3 AND opened < pg_postmaster_start_time())
			THEN false ELSE ` + goneSQL + ` END`)
	}
	var free bool
	args := []any{lockKey(session), pipeKey(session)}
	if b.inGrace {
		args = append(args, session)
	}
	if err := b.conn.QueryRow(ctx, q, args...).Scan(&free); err != nil {
		return true
	}
	if free {
		b.dead = append(b.dead, session)
	}
	return !free
}

// goneSQL is true when a session's lock ($1) and its pipeline key ($2)
// are both free: both taken shared until COMMIT, so that neither can be
// taken back exclusive before the batch's decision is committed (the
// pipeline key first: while it is held the session's own lock is left
// alone).
const goneSQL = `CASE WHEN pg_try_advisory_xact_lock_shared($2) THEN pg_try_advisory_xact_lock_shared($1) ELSE false END`

// Append queues the batch's records (and their outputs) for the COMMIT
// round trip; to is the position after them.
func (b *batch) Append(recs []*runstate.Record, lines []byte, to runstate.Position) error {
	if b.done {
		return errors.New("pgstore: Append after the batch ended")
	}
	n := 0
	for len(lines) > 0 {
		i := bytes.IndexByte(lines, '\n')
		if i < 0 {
			return errors.New("pgstore: Append: a line without its '\\n'")
		}
		if n >= len(recs) {
			return fmt.Errorf("pgstore: Append: more lines than the %d records", len(recs))
		}
		line := lines[:i]
		lines = lines[i+1:]
		rec := recs[n]
		n++
		h := sha256.Sum256(line)
		r := &b.rows
		r.seq = append(r.seq, rec.Seq)
		r.line = append(r.line, line)
		r.hash = append(r.hash, h[:])
		r.ev = append(r.ev, rec.Ev)
		r.stage = append(r.stage, optional(rec.Stage))
		r.key = append(r.key, optional(rec.Key))
		if u, err := uuid.Parse(rec.Session); err == nil {
			r.sessID = append(r.sessID, pgtype.UUID{Bytes: u, Valid: true})
		} else {
			r.sessID = append(r.sessID, pgtype.UUID{})
		}
		if rec.Attempt != 0 {
			a := int32(rec.Attempt)
			r.attempt = append(r.attempt, &a)
		} else {
			r.attempt = append(r.attempt, nil)
		}
		r.at = append(r.at, rec.At)
		seen := map[string]bool{}
		for _, o := range rec.Outputs {
			sum, err := hex.DecodeString(o.SHA256)
			if err != nil || len(sum) != sha256.Size || seen[o.Path] {
				continue // not a blob this store can hold; Verify reports it
			}
			seen[o.Path] = true
			b.outs.seq = append(b.outs.seq, rec.Seq)
			b.outs.path = append(b.outs.path, o.Path)
			b.outs.sha = append(b.outs.sha, sum)
			b.outs.size = append(b.outs.size, o.Size)
		}
	}
	if n != len(recs) {
		return fmt.Errorf("pgstore: Append: %d lines for %d records", n, len(recs))
	}
	b.to = to
	return nil
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Sync commits the batch and waits for its WAL flush: when it returns
// nil, its records are in the database's WAL on disk. The records commit
// first, with synchronous_commit off, which releases the head row for the
// other sessions of the run; a transaction of their session's own after
// them commits with synchronous_commit on (commitBatch), in the same
// round trip. A connection lost around either COMMIT is resolved by
// content (resolve.go), which flushes what it finds.
func (b *batch) Sync(ctx context.Context) error {
	if b.done || b.synced {
		return nil
	}
	if err := b.bet(); err != nil {
		return err
	}
	err := b.commit(ctx, false)
	if err == nil {
		b.synced = true
	} else {
		b.failed = true
	}
	return err
}

// Publish keeps the projections for the database (each, newest seq wins):
// they are written with this batch's COMMIT when it has not committed yet,
// else with the next batch's, so that a busy session's cost no
// transaction of their own; an idle session's (no batch within about a
// second), a large manifest (over largeManifest: in the background, paced)
// and a clean Close's are written by one (publish.go, writeKept).
// The handoff is written at most once a second (handoffEvery): readers
// render it from the records anyway.
func (b *batch) Publish(at runstate.Position, manifest, handoff []byte) {
	b.s.pub.keep(at, manifest, handoff)
}

// Unlock ends the batch: COMMIT with synchronous_commit off when Sync did
// not commit it (visible at once; a later synchronous commit makes it
// durable, since WAL is flushed in order).
func (b *batch) Unlock() error {
	if b.done {
		return nil
	}
	defer b.release()
	if b.synced {
		return nil
	}
	if b.failed {
		// Nothing of it committed (or its outcome is the sticky error
		// Sync returned): the records are not sent again.
		b.rollback()
		return nil
	}
	return b.commit(context.Background(), true)
}

// Abort rolls the batch back and releases the head row.
func (b *batch) Abort() error {
	if b.done {
		return nil
	}
	defer b.release()
	if b.synced || b.conn == nil { // an optimistic batch's before its commit: nothing to drop
		return nil
	}
	if b.failed {
		b.rollback()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.conn.Exec(ctx, "ROLLBACK"); err != nil {
		return b.s.db.connectError(err)
	}
	return nil
}

// rollback ends a transaction whose commit failed, best effort (a broken
// connection is dropped by the pool at release). An optimistic batch's
// failed commit needs none: its implicit transaction was rolled back at
// the pipeline's Sync, and the connection is idle.
func (b *batch) rollback() {
	if b.conn == nil || b.conn.Conn().PgConn().IsClosed() || b.conn.Conn().PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = b.conn.Exec(ctx, "ROLLBACK")
}

func (b *batch) release() {
	if !b.done {
		b.done = true
		if b.conn != nil {
			b.conn.Release()
		}
	}
}

// The statement that appends a batch: the records, their outputs, and the
// head's compare-and-set (a failed one divides by zero, which aborts the
// transaction; under the row lock it can only be a bug). An output's
// bytes ($22, NULL for one whose bytes are in blobs) are the batch's
// own, or another row's of the same content (outputDataSQL).
const appendSQL = `WITH ins AS (
  INSERT INTO {s}.records (run_id, seq, line, hash, ev, stage, attempt, key, session, at)
  SELECT $1, * FROM unnest($2::bigint[], $3::bytea[], $4::bytea[], $5::text[], $6::text[], $7::int[], $8::text[], $9::uuid[], $10::timestamptz[])
), outs AS (
  INSERT INTO {s}.outputs (run_id, seq, path, sha256, size, data)
  SELECT $1, o.seq, o.path, o.sum, o.size, ` + outputDataSQL + ` FROM unnest($11::bigint[], $12::text[], $13::bytea[], $14::bigint[], $22::bytea[]) o(seq, path, sum, size, data)
), head AS (
  UPDATE {s}.runs SET last_seq = $15, last_hash = $16, last_end = $17, last_len = $18, last_at = $19
  WHERE id = $1 AND last_seq = $20 AND last_hash = $21 RETURNING 1
)
SELECT 1 / (SELECT count(*)::int FROM head)`

// outputDataSQL is an output row's bytes (schema version 4): o.data, the
// small blob the batch carries for it, else those of another row of the
// same content (outputs_inline), else NULL: its bytes are in blobs (the
// row's foreign key, on blob, checks that). The other row is there when
// the blob was Put for this record but an earlier batch of the session
// took it with a record of the same content (pending blobs are the
// session's, not a record's): the earlier batch committed first.
const outputDataSQL = `coalesce(o.data, (SELECT x.data FROM {s}.outputs x WHERE x.sha256 = o.sum AND x.data IS NOT NULL LIMIT 1))`

// appendOneSQL is appendSQL for the common batch of one record without
// outputs (a begin), and appendOneOutputSQL for one record with one
// output (a checkpoint's complete: its bytes $18): the same statement
// shape, with the values as scalar parameters, so that neither pgx (array
// encoding) nor the server (unnest) handles arrays for them.
const (
	appendOneSQL       = appendOneRecord + appendOneHead
	appendOneOutputSQL = appendOneRecord + `
), outs AS (
  INSERT INTO {s}.outputs (run_id, seq, path, sha256, size, data)
  SELECT $1, $2, o.path, o.sum, o.size, ` + outputDataSQL + ` FROM (VALUES ($15::text, $16::bytea, $17::bigint, $18::bytea)) o(path, sum, size, data)` + appendOneHead

	appendOneRecord = `WITH ins AS (
  INSERT INTO {s}.records (run_id, seq, line, hash, ev, stage, attempt, key, session, at)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`
	appendOneHead = `
), head AS (
  UPDATE {s}.runs SET last_seq = $2, last_hash = $4, last_end = $11, last_len = $12, last_at = $10
  WHERE id = $1 AND last_seq = $13 AND last_hash = $14 RETURNING 1
)
SELECT 1 / (SELECT count(*)::int FROM head)`
)

// The projections, each newest seq wins.
const (
	publishManifestSQL = `INSERT INTO {s}.projections AS p (run_id, seq, hash, "end", last_len, crc, manifest, at)
VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp())
ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, "end" = excluded."end",
  last_len = excluded.last_len, crc = excluded.crc, manifest = excluded.manifest, at = excluded.at
WHERE p.seq < excluded.seq`
	// lz4SQL makes the transaction store the manifest it writes next with
	// lz4 instead of the server's default, pglz: a manifest is O(stages)
	// (6 MB for 8000 stages with an output each), and pglz took 25-40 ms
	// to store one here, lz4 4-5 ms (29% larger: 388 KB against 301 KB),
	// while the batch that carries it holds the run's head row. Local to
	// the transaction; values already stored keep their method, and
	// readers decompress either.
	lz4SQL            = `SELECT set_config('default_toast_compression', 'lz4', true)`
	publishHandoffSQL = `INSERT INTO {s}.projections AS p (run_id, handoff_seq, handoff, at) VALUES ($1, $2, $3, clock_timestamp())
ON CONFLICT (run_id) DO UPDATE SET handoff_seq = excluded.handoff_seq, handoff = excluded.handoff, at = excluded.at
WHERE p.handoff_seq < excluded.handoff_seq`
)

// queuePublish queues the projections due (published.take: inline for a
// batch's commit, else for a write of their own), and reports whether the
// manifest it queued is a large one.
func (s *store) queuePublish(pb *pgx.Batch, runID string, all, inline bool) (large bool) {
	m, h := s.pub.take(time.Now(), all, inline)
	if m != nil {
		large = s.pub.largeOne(m)
		if hash, err := hex.DecodeString(m.at.Hash); err == nil {
			if s.db.lz4 {
				pb.Queue(lz4SQL)
			}
			pb.Queue(s.db.sql(publishManifestSQL), runID, m.at.Seq, hash, m.at.End, m.at.LastLen, m.at.CRC, m.data)
		}
	}
	if h != nil {
		pb.Queue(s.db.sql(publishHandoffSQL), runID, h.at.Seq, string(h.data))
	}
	return large
}

// commitBatch builds the round trip that ends a locked batch's
// transaction: the queued records, their outputs and the head's
// compare-and-set, the projection, SET LOCAL synchronous_commit = off,
// COMMIT; and when the batch acknowledges (not lazy), a transaction of
// its own after it that waits for the WAL flush (flushSQL). The head row
// is released at the first COMMIT, before the flush: other sessions of
// the run lock it while this one's records reach the disk (early lock
// release), instead of one flush after another. The records are visible
// from that COMMIT and durable when the flush's COMMIT answers (WAL is
// flushed in order: its commit record comes after theirs), which is when
// Sync returns. cut is the number of statements up to the records'
// COMMIT: an error after it (sendCommit) leaves them committed but not
// known to be flushed. (An optimistic batch's is betBatch's.)
func (b *batch) commitBatch(lazy bool) (pb *pgx.Batch, cut int) {
	pb = new(pgx.Batch)
	b.queueWrites(pb, lazy, nil, nil)
	pb.Queue("SET LOCAL synchronous_commit = off")
	pb.Queue("COMMIT")
	cut = pb.Len()
	if !lazy {
		pb.Queue("BEGIN")
		pb.Queue(syncOnSQL)
		pb.Queue(b.s.db.sql(flushSQL), b.ses.id)
		pb.Queue("COMMIT")
	}
	return pb, cut
}

// flushSQL is the write of the transaction that makes a locked batch's
// records durable (commitBatch): an update of the session's own row in
// place (a HOT update: no index, and no other session's statement locks
// the row but for the key share of a foreign key, which it does not
// block), so that the transaction has an xid and WAL of its own, and its
// synchronous COMMIT waits for the WAL flush up to its commit record,
// which follows the records'. A session's row lives until its clean
// Close; one that is gone (deleted by hand) makes it fail (22012), and the
// commit is then settled as one whose reply was lost: checkCommit, which
// finds the records, flushes them. A variable for tests.
var flushSQL = `WITH u AS (UPDATE {s}.sessions SET pid = pid WHERE id = $1 RETURNING 1) SELECT 1 / count(*) FROM u`

// errUnflushed wraps the error of a locked batch's flush transaction
// (commitBatch): the records' COMMIT answered, so they are in the table,
// but whether they reached the disk is not known; ambiguous treats it as
// a lost reply, which settle resolves by content (and flushes).
type errUnflushed struct{ err error }

func (e errUnflushed) Error() string {
	return "the records committed, but waiting for their WAL flush failed: " + e.err.Error()
}
func (e errUnflushed) Unwrap() error { return e.err }

// sendCommit sends a commitBatch in one round trip and reads its answers
// in order: an error after cut is an errUnflushed.
func sendCommit(ctx context.Context, conn *pgxpool.Conn, pb *pgx.Batch, cut int) error {
	n := pb.Len()
	br := conn.SendBatch(ctx, pb)
	for i := range n {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			if i >= cut {
				return errUnflushed{err}
			}
			return err
		}
	}
	if err := br.Close(); err != nil {
		return errUnflushed{err} // every statement answered; a failure now is the connection's
	}
	return nil
}

// syncOnSQL makes the transaction commit synchronously where the
// connection's synchronous_commit is off (the server's, the database's or
// the role's default, or the DSN's): a batch that acknowledges must be in
// the WAL on disk when Sync returns, whatever the user's settings say.
// The other values (local, remote_write, on, remote_apply) all wait for
// the local flush, and stay. Local to the transaction, so that it holds
// through a transaction-mode pooler too; the bet's append statement does
// the same in its last expression (betEnd).
const syncOnSQL = `SELECT set_config('synchronous_commit', 'on', true) WHERE current_setting('synchronous_commit') = 'off'`

// genericPlanSQL makes the server run the array form of the append
// statement (appendSQL, a batch of several records or outputs) with its
// prepared statement's generic plan, planned once per connection. Left to
// itself (plan_cache_mode auto), the server plans it afresh at every
// execution: a custom plan knows the arrays' lengths, so its estimate
// always beats the generic plan's, which assumes 100 rows an array. That
// planning took 250 µs a batch on the development server, more than the
// statement's execution (about 200 µs for 5 records), and 8 goroutines on
// one run commit a batch of about 5 every millisecond. Every array's rows
// are the statement's own, inserted under the head row's lock, so no plan
// depends on the parameters' values. Local to the transaction, implicit
// or not, so that it holds through a transaction-mode pooler and ends
// with the batch: the other statements on the connection keep the
// server's choice. A bet queues it; a locked batch's transaction is
// generic from its start (lockSetupSQL).
const genericPlanSQL = "SELECT " + genericPlanSet

// genericPlanSet is the expression of genericPlanSQL and lockSetupSQL.
const genericPlanSet = "set_config('plan_cache_mode', 'force_generic_plan', true)"

// inlineOutputs: a batch's small outputs ride in their outputs rows
// (schema version 4; false: in blobs and blob_chunks, as every output did
// before, which the benchmarks compare).
var inlineOutputs = true

// queueWrites queues what a batch's commit writes: the small blobs it
// carries (every pending one; when lazy, a batch committed with
// synchronous_commit off, those its outputs name: take) that none of its
// outputs holds in its row (outputData), before the records (the outputs'
// foreign key to blobs), then the records, their outputs (a small one
// with its bytes) and the head's compare-and-set in one statement, and the
// projections due. bet is nil
// for a locked batch; for an optimistic one, the bet's parameters (the
// session's lock key, lazy), and the append statement is its bet form in
// form (optimistic.go: betForm, or aheadForm on the pipeline, unless blobs
// are queued before it), which also locks the head row and probes the
// session's own lock.
func (b *batch) queueWrites(pb *pgx.Batch, lazy bool, bet []any, form map[string]string) {
	db := b.s.db
	if !b.took {
		b.inline, b.took = b.s.blobs.take(b.outs.sha, !lazy), true
	}
	r, o, n := &b.rows, &b.outs, len(b.rows.seq)
	data, rest := b.outputData()
	b.s.blobs.queueInline(pb, rest)
	if n > 0 {
		headHash, _ := hex.DecodeString(b.head.Hash)
		var q string
		var args []any
		switch {
		case n == 1 && len(o.seq) == 0:
			q = appendOneSQL
			args = []any{b.runID, r.seq[0], r.line[0], r.hash[0], r.ev[0], r.stage[0], r.attempt[0], r.key[0], r.sessID[0], r.at[0],
				b.to.End, b.to.LastLen, b.head.Seq, headHash}
		case n == 1 && len(o.seq) == 1:
			q = appendOneOutputSQL
			args = []any{b.runID, r.seq[0], r.line[0], r.hash[0], r.ev[0], r.stage[0], r.attempt[0], r.key[0], r.sessID[0], r.at[0],
				b.to.End, b.to.LastLen, b.head.Seq, headHash, o.path[0], o.sha[0], o.size[0], data[0]}
		default:
			q = appendSQL
			// FlatArray: slices of types pgx has no plan for ([][]byte,
			// []*string, []*int32) are otherwise encoded by reflection.
			args = []any{b.runID, r.seq, pgtype.FlatArray[[]byte](r.line), pgtype.FlatArray[[]byte](r.hash), r.ev,
				pgtype.FlatArray[*string](r.stage), pgtype.FlatArray[*int32](r.attempt), pgtype.FlatArray[*string](r.key),
				pgtype.FlatArray[pgtype.UUID](r.sessID), r.at,
				o.seq, o.path, pgtype.FlatArray[[]byte](o.sha), o.size, b.to.Seq, r.hash[n-1], b.to.End, b.to.LastLen, r.at[n-1], b.head.Seq, headHash,
				pgtype.FlatArray[[]byte](data)}
		}
		if q == appendSQL && bet != nil { // a locked batch's transaction has it already (lockSetupSQL)
			pb.Queue(genericPlanSQL)
		}
		if bet != nil {
			if len(rest) > 0 {
				// The blobs' inserts lock their keys first: a statement
				// that then waited for the head row could deadlock with
				// a locked batch holding the row and storing the same
				// blob (aheadForm), so the bet takes the row NOWAIT.
				form = betForm
			}
			q, args = form[q], append(args, bet...)
		}
		pb.Queue(db.sql(q), args...)
	}
	b.s.queuePublish(pb, b.runID, false, true)
}

// outputData returns the bytes each of the batch's outputs holds in its
// row: the small blob the batch carries under its sha256, or nil (its
// bytes are in blobs, or another row holds them: outputDataSQL); and the
// small blobs no output of the batch holds, which go to blobs (Put for a
// record of a later batch, or for a caller of the seam that names them
// otherwise).
func (b *batch) outputData() (data [][]byte, rest []inlineBlob) {
	o := &b.outs
	data = make([][]byte, len(o.seq))
	if !inlineOutputs {
		return data, b.inline
	}
	for _, x := range b.inline {
		held := false
		for i, sum := range o.sha {
			if bytes.Equal(sum, x.sum) && o.size[i] == int64(len(x.data)) {
				data[i], held = x.data, true
			}
		}
		if !held {
			rest = append(rest, x)
		}
	}
	return data, rest
}

// commit sends commitBatch in one round trip. A connection lost around
// it leaves the outcome unknown: settle (resolve.go) finds it out.
func (b *batch) commit(ctx context.Context, lazy bool) error {
	n := len(b.rows.seq)
	if n > 0 && (lineHex(b.rows.hash[n-1]) != b.to.Hash || b.rows.seq[n-1] != b.to.Seq) {
		return fmt.Errorf("pgstore: Append's position %d/%s is not its last record's", b.to.Seq, b.to.Hash)
	}
	var pb *pgx.Batch
	cut := -1 // a bet: its answers are read as one
	// alone, epoch: the session had the run alone when the batch was sent
	// (ahead.go): a bet confirmed then, in the same epoch, proves its head
	// for sending ahead.
	alone, epoch := false, uint64(0)
	if b.opt {
		// On the pipeline while the session has the run alone; else after
		// what is there (ahead.go).
		a := &b.s.ahead
		a.mu.Lock()
		defer a.mu.Unlock()
		var on bool
		if on, alone, epoch = b.s.onPipeline(b.ses); on && n > 0 {
			// A batch sent ahead (lazy) is not fenced: no session key, so
			// its statement does not probe the session's lock (ahead.go).
			key := any(b.ses.key)
			if lazy {
				key = (*int64)(nil)
			}
			var bp pgx.Batch
			b.queueWrites(&bp, lazy, []any{key, lazy}, aheadForm)
			return b.s.send(ctx, b, &bp, lazy)
		}
		if err := b.s.releasePipeline(ctx, false); err != nil {
			return err
		}
		var err error
		if pb, err = b.betBatch(ctx, lazy); pb == nil {
			return err
		}
	} else {
		pb, cut = b.commitBatch(lazy)
	}
	var err error
	if cut < 0 {
		err = b.conn.SendBatch(ctx, pb).Close()
	} else {
		err = sendCommit(ctx, b.conn, pb, cut)
	}
	switch {
	case err == nil:
		if alone && n > 0 {
			if now, e := b.ses.aloneEpoch(); now && e == epoch {
				b.s.ahead.epoch = epoch // under ahead.mu (b.opt)
			}
		}
		b.committed()
		return nil
	case n == 0:
		b.s.blobs.putBack(b.inline)
		return b.s.db.rightsError("commit a batch of run "+b.s.name, err)
	case !ambiguous(err):
		b.s.blobs.putBack(b.inline)
		return b.appendError(err)
	}
	err = b.settle(ctx, err, lazy)
	if err != nil {
		b.s.blobs.putBack(b.inline) // Put again: idempotent
	}
	return err
}

// committed moves the batch's head past what it committed.
func (b *batch) committed() {
	if n := len(b.rows.seq); n > 0 {
		b.s.opt.committed(b.to, b.rows.at[n-1], b.opt)
		b.head, b.rows, b.outs = b.to, recordRows{}, outputRows{}
	}
}

func lineHex(h []byte) string { return hex.EncodeToString(h) }

// appendError explains a failed append statement.
func (b *batch) appendError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "22012", "55P03", "2201F", "40001":
			if b.opt {
				return b.lostBet(pe.Code)
			}
			return fmt.Errorf("pgstore: run %s: the head row moved under this batch's lock (a bug); nothing was recorded", b.s.name)
		case "40P01": // a bet is rolled back whole: nothing was written
			if b.opt {
				return b.lostBet(pe.Code)
			}
		case "23503":
			if pe.ConstraintName == "outputs_blob_fkey" {
				return fmt.Errorf("pgstore: run %s: a record names an output whose bytes are not in %s.blobs (%s): store them first (Blobs.Put); nothing was recorded",
					b.s.name, b.s.db.schema, pe.Detail)
			}
			fallthrough
		case "23505":
			return fmt.Errorf("pgstore: run %s: the append broke %s (%s): a bug, nothing was recorded; run 'runstate verify'", b.s.name, pe.ConstraintName, pe.Message)
		}
	}
	return b.s.db.rightsError("append to run "+b.s.name, err)
}

// ambiguous reports whether err leaves a sent COMMIT's outcome unknown:
// the connection failed (or the context ended) rather than the server
// answering with an error.
func ambiguous(err error) bool {
	if errors.As(err, new(errUnflushed)) {
		return true
	}
	if pgconn.SafeToRetry(err) {
		return false // nothing was sent
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")
	}
	return true
}
