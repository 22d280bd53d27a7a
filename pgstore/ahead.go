package pgstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/runstate/runstate"
)

// Begins sent ahead. A stage's begin must be in the database before its
// work runs: another session's Begin of the stage must find it (ErrBusy),
// and a process killed during the work must leave it behind (the restart
// policy counts the attempt). Waiting for the begin's reply is what a
// checkpoint spent most on besides the complete's flush: a round trip, the
// server's statement, the client's reading. It is needed only where
// another session could append meanwhile: the begin's bet could then be
// lost, and the work would have run on a decision that did not hold.
//
// So a session that is the only one open on its run holds the run's lock
// exclusive (session.go: every session holds it shared from Open to
// Close, so only a session alone can have it; one that opens meanwhile
// asks for it through the want lock, and waits), and then sends its
// optimistic batches (runstate.Optimist) pipelined on one connection
// (wire.go): a batch of begins (synchronous_commit off) is written to the
// connection and Confirm returns without its reply, so the stage's work
// starts; the complete's batch is written behind it, on the same
// connection, and its Sync reads both replies, the begin's first. While
// the session lives no other session can append before the server has
// run the begin, so the bet holds: the head is the session's own; and the
// server runs the complete after the begin, in the connection's order,
// while the client wrote the output.
//
// A SIGKILL of the process during the work leaves the begin to the server
// (the kernel delivers what was written before it closes the socket),
// which commits it as if the reply had been read. The server may run it
// only after it has seen the lock connection end and freed the session's
// lock (the two connections' backends run in no set order: on a busy
// server the begin's waits for a CPU). Two things make it count all the
// same:
//   - The pipeline's connection is one of its own (not the pool's), with
//     the lock connection's keepalives and tcp_user_timeout, and holds
//     the session's pipeline key (pipeKey) for its life. Another session
//     finds this one gone only when its lock and that key are both free
//     (Alive, Live), and the server frees the key when it ends the
//     backend, after the input it had: so nobody decides on the killed
//     session before its begin has run.
//   - A batch sent ahead is not fenced by the probe of the session's own
//     lock (its statement gets no session key), which would find the lock
//     free and refuse the begin. Its fence is the compare-and-set: a
//     session that found this one gone and recorded anything moved the
//     head, and the begin fails (nothing written).
// A begin whose session's lock connection alone was cut while its process
// lives lands the same way (the session re-holds its lock, or is lost, and
// its pipeline closed: lostAhead). The complete, and every batch that is
// awaited, keeps the probe: a session cut off ends no stage. The
// connection stays open, and its key held, until the session yields the
// run, is lost, or closes.
//
// A batch goes on the pipeline only in an epoch of having the run alone
// (the count of the session's takes of the run's lock) in which an
// earlier batch was confirmed, sent after the take: its compare-and-set
// then proved the session's position the head, and no other session has
// appended since. A batch sent ahead that did not land (the session's
// lock was lost, the server crashed before its WAL writer flushed it, a
// bug) makes the Run read-only when its reply is read: its callers were
// already let go, so the error (wrapping runstate.ErrSessionLost) comes
// from the next batch's Lock or commit. A lost reply is resolved by
// content, as any commit's (resolve.go). After any error the pipeline's
// connection is dropped.
//
// When another session wants the run, the pinger stops the sending ahead
// and reads back what was sent (yield: under the same mutex as the sends,
// so that nothing is sent after it), and only then lets the run's lock go:
// the other session's first batch finds every begin this one sent.

// ahead is the pipeline: a connection of its own (wire.go) and the
// batches written on it whose outcome is not taken yet, in order. Guarded
// by mu, which a commit of an optimistic batch holds from its decision to
// send on the pipeline (or to read it back first) to its return.
type ahead struct {
	mu sync.Mutex
	// epoch: the epoch of having the run alone in which a batch sent after
	// the take was confirmed (0: none); off: stopped by a yield until the
	// next take.
	epoch uint64
	off   uint64
	w     *wire // the connection, holding the session's pipeKey; nil: none
	key   int64 // that key
	// stmts: the statements prepared on w, by their SQL.
	stmts map[string]*pgconn.StatementDescription
	eqb   pgx.ExtendedQueryBuilder
	sent  []*sentBatch // written, outcome not taken yet, in order
	err   error        // sticky: a batch sent ahead did not land
	count int          // batches sent ahead of their reply (tests)
	// trace, when set (a benchmark: BenchmarkGoroutines), is called as a
	// batch has been written and as an awaited batch's reply has been
	// read, with a.mu held.
	trace func(pipeEvent)
}

// pipeEvent is what ahead.trace is told: when a batch of records was
// written to the pipeline (replied false) or its reply read (an awaited
// batch: replied true), and whether it was sent ahead (lazy).
type pipeEvent struct {
	at      time.Time
	lazy    bool
	records int
	replied bool
}

// maxUnread is the most batches on the pipeline whose replies are not read
// (a variable for tests).
var maxUnread = 64

// sentBatch is a batch written to the pipeline: a copy of it (its records,
// for errors and for settling a lost reply; the Run releases the original),
// and whether its caller was let go before the reply (lazy: sent ahead).
// The goroutine that reads its reply (wire.wait) sets err (the server's
// answer, or the connection's failure) and closes done; take sets final
// (the outcome) under a.mu.
type sentBatch struct {
	b     *batch
	ahead bool

	w    *wire
	done chan struct{}
	err  error
	prep *pgconn.StatementDescription // a prepare's answer (wire.prepare)
	// collect: keep the rows (wire.query).
	collect bool
	rows    [][][]byte

	taken bool
	final error
}

// onPipeline reports whether an optimistic batch goes on the pipeline now,
// and the epoch of having the run alone to note when an awaited commit
// confirms the head. The caller holds a.mu.
func (s *store) onPipeline(ses *session) (ok, alone bool, epoch uint64) {
	alone, epoch = ses.aloneEpoch()
	a := &s.ahead
	return alone && a.epoch == epoch && a.off != epoch && a.err == nil, alone, epoch
}

// send writes b's writes (pb: queueWrites in the bet form) to the
// pipeline. lazy: b is a batch of begins, whose caller goes on once it is
// written (Confirm); else its Sync, which reads every reply up to its
// own and takes their outcomes, in order. The caller holds a.mu.
func (s *store) send(ctx context.Context, b *batch, pb *pgx.Batch, lazy bool) error {
	sb, err := s.write(ctx, b, pb, lazy)
	if err != nil || lazy {
		return err
	}
	if err := s.await(ctx, sb); err != nil {
		return err
	}
	b.committed()
	return nil
}

// write writes b's writes (pb) to the pipeline and returns what was
// written; lazy: b is sent ahead (its caller goes on), and the head moves
// past it at once. The caller holds a.mu.
func (s *store) write(ctx context.Context, b *batch, pb *pgx.Batch, lazy bool) (*sentBatch, error) {
	a := &s.ahead
	if a.w == nil {
		w, err := s.pipeConnect(ctx, b.ses)
		if err != nil {
			s.blobs.putBack(b.inline)
			return nil, fmt.Errorf("%w: %w", runstate.ErrConflict, err) // nothing was sent: Lock decides
		}
		a.w, a.key, a.stmts = w, pipeKey(b.ses.id), map[string]*pgconn.StatementDescription{}
	}
	// Replies not read stay in the sockets' buffers: past a bound they are
	// read first, so that the server never blocks writing them while this
	// write waits for it to read (each is about 100 bytes).
	if len(a.sent) >= maxUnread {
		if err := s.readBack(ctx); err != nil {
			s.blobs.putBack(b.inline)
			return nil, err
		}
		if a.w == nil {
			return s.write(ctx, b, pb, lazy) // readBack dropped it
		}
	}
	// A statement new to the connection is prepared after what is on the
	// pipeline (once per statement and connection).
	for _, q := range pb.QueuedQueries {
		if a.stmts[q.SQL] != nil {
			continue
		}
		if err := s.readBack(ctx); err != nil {
			s.blobs.putBack(b.inline)
			return nil, err
		}
		if a.w == nil {
			return s.write(ctx, b, pb, lazy) // readBack dropped it
		}
		sd, err := a.w.prepare(q.SQL)
		if err != nil {
			s.blobs.putBack(b.inline)
			s.dropPipeline(nil)
			if ambiguous(err) {
				// The connection failed (the server ended the backend:
				// pg_terminate_backend, a restart, a failover): nothing
				// of the batch was sent, and Lock decides it again.
				return nil, fmt.Errorf("%w: %w", runstate.ErrConflict, s.db.connectError(err))
			}
			return nil, b.appendError(err)
		}
		a.stmts[q.SQL] = sd
	}
	w := a.w
	for _, q := range pb.QueuedQueries {
		sd := a.stmts[q.SQL]
		if err := a.eqb.Build(w.tm, sd, q.Arguments); err != nil {
			// Nothing of the batch was flushed: the queued messages go
			// with the connection, and with it the replies of what was
			// sent before, whose outcome is then unknown (a bug either
			// way: the arguments are pgstore's own).
			s.blobs.putBack(b.inline)
			err = fmt.Errorf("pgstore: run %s: encode a statement: %w", s.name, err)
			if len(a.sent) > 0 {
				first := a.sent[0].b
				err = s.aheadFailed(first, err)
			}
			s.dropPipeline(err)
			return nil, err
		}
		w.out.SendBind(&pgproto3.Bind{PreparedStatement: sd.Name, ParameterFormatCodes: a.eqb.ParamFormats,
			Parameters: a.eqb.ParamValues, ResultFormatCodes: a.eqb.ResultFormats})
		w.out.SendExecute(&pgproto3.Execute{})
	}
	sb := &sentBatch{b: new(batch), ahead: lazy}
	*sb.b = *b
	sb.b.conn = nil
	a.sent = append(a.sent, sb)
	werr := w.send(sb) // written: a failure leaves its outcome unknown, as a lost reply
	n := len(b.rows.seq)
	if a.trace != nil {
		a.trace(pipeEvent{at: time.Now(), lazy: lazy, records: n})
	}
	if lazy {
		a.count++
		s.opt.committed(b.to, b.rows.at[n-1], true)
		if werr != nil {
			return nil, s.readBack(ctx) // settles it, and every one before
		}
	}
	return sb, nil
}

// await waits for sb's reply and takes its outcome, and that of every
// batch before it. The caller holds a.mu.
func (s *store) await(ctx context.Context, sb *sentBatch) error {
	a := &s.ahead
	sb.w.wait(sb)
	if !sb.taken {
		s.take(ctx, sb)
	}
	if sb.final != nil {
		return sb.final
	}
	if a.trace != nil {
		a.trace(pipeEvent{at: time.Now(), records: len(sb.b.rows.seq), replied: true})
	}
	return nil
}

// readBack waits for the replies of everything on the pipeline and takes
// their outcomes (take). It returns the sticky error of a batch sent
// ahead that did not land, or the error of the last batch if it failed.
// The caller holds a.mu.
func (s *store) readBack(ctx context.Context) error {
	a := &s.ahead
	if len(a.sent) == 0 {
		return nil
	}
	last := a.sent[len(a.sent)-1]
	s.take(ctx, last)
	if a.err != nil {
		return a.err
	}
	return last.final
}

// take takes the outcomes of the batches on the pipeline, in order, up to
// and including upTo, waiting for each one's reply: a batch sent ahead
// that did not land sets the sticky error (aheadFailed), which every batch
// after it gets (it followed a failed batch, and failed its
// compare-and-set); an awaited batch's error is its own, as its commit's
// would be (a lost bet, a lost reply settled by content: resolve.go).
// After any error the connection is dropped. The caller holds a.mu.
func (s *store) take(ctx context.Context, upTo *sentBatch) {
	a := &s.ahead
	for len(a.sent) > 0 && !upTo.taken {
		sb := a.sent[0]
		sb.w.wait(sb)
		err := sb.err
		if err == nil {
			a.sent = a.sent[1:]
			sb.taken = true
			continue
		}
		rest := a.sent
		if !ambiguous(err) {
			err = sb.b.appendError(err)
			if sb.ahead || len(rest) > 1 {
				err = s.aheadFailed(sb.b, err)
			}
			sb.final, sb.taken = err, true
			s.dropPipeline(err) // what follows in the pipeline followed a failed batch, and fails its compare-and-set
			return
		}
		// The connection broke: every batch from this one on is settled
		// by content, in order.
		s.dropPipeline(nil)
		for i, sb := range rest {
			err := sb.b.settle(ctx, err, sb.ahead)
			if sb.b.conn != nil {
				sb.b.conn.Release() // a re-run's
				sb.b.conn = nil
			}
			if err != nil && sb.ahead {
				err = s.aheadFailed(sb.b, err)
				for _, r := range rest[i:] {
					r.final, r.taken = err, true
				}
				return
			}
			sb.final, sb.taken = err, true
		}
		return
	}
	if !upTo.taken {
		// Dropped with the connection before its reply was read (the
		// session was lost): the server ran what it received, or not.
		upTo.final, upTo.taken = s.droppedError(upTo.b), true
	}
}

// droppedError is the outcome of a batch whose connection was closed
// before its reply was taken.
func (s *store) droppedError(b *batch) error {
	if s.ahead.err != nil {
		return s.ahead.err
	}
	first, last := b.marks()
	return fmt.Errorf("%w: pgstore: run %s: the pipeline's connection was closed before the reply of records %d-%d was read (the session was lost): their outcome is unknown; this Run is read-only: open the run again",
		runstate.ErrSessionLost, s.name, first.Seq, last.Seq)
}

// aheadFailed makes the sticky error of batch b, sent ahead, that did not
// land.
func (s *store) aheadFailed(b *batch, err error) error {
	first, last := b.marks()
	s.ahead.err = fmt.Errorf("%w: pgstore: run %s: records %d-%d, sent ahead of their reply while the session had the run alone, did not land (%v): the session went on as if they had; this Run is read-only: open the run again",
		runstate.ErrSessionLost, s.name, first.Seq, last.Seq, err)
	return s.ahead.err
}

// dropPipeline closes the pipeline's connection without reading what is
// left, as a killed process's would be (the server still runs what it
// received, then frees the session's pipeline key). Every batch whose
// outcome was not taken gets err (nil: droppedError). The caller holds
// a.mu.
func (s *store) dropPipeline(err error) {
	a := &s.ahead
	if a.w == nil {
		return
	}
	a.w.close()
	for _, sb := range a.sent {
		if !sb.taken {
			sb.final, sb.taken = err, true
			if err == nil {
				sb.final = s.droppedError(sb.b)
			}
		}
	}
	a.w, a.stmts, a.sent = nil, nil, nil
}

// releasePipeline reads back what is on the pipeline; end: the connection
// is closed too (its key let go). It is kept otherwise, with its
// statements prepared: opening one takes a connection's setup, and a
// batch of projections alone, which does not go on the pipeline, comes as
// often as every 50 ms while records come (the views' timer, runstate's
// handoffLag; the manifest's at most every second). The caller holds a.mu.
func (s *store) releasePipeline(ctx context.Context, end bool) error {
	err := s.readBack(ctx)
	if a := &s.ahead; a.w != nil && end {
		// Its key let go before the connection ends (the server frees it
		// only when the backend exits, a moment after a Terminate).
		if uerr := a.w.exec(fmt.Sprintf("SELECT pg_advisory_unlock(%d)", a.key), pingTimeout); uerr != nil {
			a.w.close()
		} else {
			a.w.terminate()
		}
		a.w, a.stmts = nil, nil
	}
	if err == nil {
		err = s.ahead.err
	}
	return err
}

// flushAhead reads back what was sent ahead before a batch takes the run's
// lock on a connection of its own, so that it is ordered after it.
func (s *store) flushAhead(ctx context.Context) error {
	a := &s.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	return s.releasePipeline(ctx, false)
}

// stopAhead is the session's yield in epoch (session.go): nothing goes on
// the pipeline until the run is taken alone again, and what is there is
// read back; its connection is closed (the session shares the run now,
// maybe for long).
func (s *store) stopAhead(epoch uint64) {
	a := &s.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	a.off = epoch
	_ = s.releasePipeline(context.Background(), true)
}

// closeAhead ends the pipeline at Close: read back when clean; otherwise
// its connection is closed as a killed process's would be, without
// reading (the server still runs what it received).
func (s *store) closeAhead(clean bool) {
	a := &s.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if clean {
		_ = s.releasePipeline(context.Background(), true)
		return
	}
	if a.w != nil {
		key := a.key
		s.dropPipeline(nil)
		// Gone to the others only once the server has freed its key.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		waitAdvisoryFree(ctx, s.db, key)
		cancel()
	}
}

// pipeConnect opens the pipeline's connection: one of its own (not from
// the pool), with the lock connections' keepalives and tcp_user_timeout,
// holding the session's pipeKey for its life. Another session counts the
// session alive while the key is held (Alive, Live), so that a killed
// process is found gone only once the server has run, and ended, what it
// wrote to its pipeline: the server frees the key when it ends the
// backend, after the input it had. A key still held by the session's
// previous pipeline (being closed) is waited for, as long as ctx allows.
func (s *store) pipeConnect(ctx context.Context, ses *session) (*wire, error) {
	cfg := s.db.lockCfg.Copy()
	cfg.RuntimeParams["application_name"] = "runstate pipeline " + ses.id
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, s.db.connectError(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", pipeKey(ses.id)); err != nil {
		closeNow(conn)
		return nil, s.db.connectError(err)
	}
	w, err := hijack(ctx, conn)
	if err != nil {
		closeNow(conn)
		return nil, s.db.connectError(err)
	}
	return w, nil
}

// lostAhead is the session's dropAhead (session.go): once the session is
// lost, its pipeline's connection is closed without reading what is left
// (the server still runs what it received), so that its key no longer
// keeps the session alive to the others.
func (s *store) lostAhead() {
	a := &s.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	s.dropPipeline(nil)
}
