package pgstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// optimistic batches (runstate.Optimist) on one connection in pipeline
// mode: a batch of begins (synchronous_commit off) is written to the
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

// ahead is the pipeline: a connection of its own in pipeline mode and the
// batches sent on it whose replies are not read yet, in order. Guarded by
// mu, which a commit of an optimistic batch holds from its decision to
// send on the pipeline (or to read it back first) to its return.
type ahead struct {
	mu sync.Mutex
	// epoch: the epoch of having the run alone in which a batch sent after
	// the take was confirmed (0: none); off: stopped by a yield until the
	// next take.
	epoch uint64
	off   uint64
	conn  *pgx.Conn        // a connection of its own, holding the session's pipeKey
	key   int64            // that key
	pipe  *pgconn.Pipeline // nil: the connection is in normal mode
	// stmts: the statements prepared on conn, by their SQL.
	stmts map[string]*pgconn.StatementDescription
	eqb   pgx.ExtendedQueryBuilder
	sent  []sentBatch // written, replies not read, in order
	err   error       // sticky: a batch sent ahead did not land
	count int         // batches sent ahead of their reply (tests)
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

// sentBatch is a batch written to the pipeline: a copy of it (its records,
// for errors and for settling a lost reply; the Run releases the original),
// its statement count, and whether its caller was let go before the reply
// (lazy: sent ahead).
type sentBatch struct {
	b     *batch
	n     int
	ahead bool
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
// own. The caller holds a.mu.
func (s *store) send(ctx context.Context, b *batch, pb *pgx.Batch, lazy bool) error {
	a := &s.ahead
	if a.conn == nil {
		conn, err := s.pipeConnect(ctx, b.ses)
		if err != nil {
			s.blobs.putBack(b.inline)
			return fmt.Errorf("%w: %w", runstate.ErrConflict, err) // nothing was sent: Lock decides
		}
		a.conn, a.key, a.stmts = conn, pipeKey(b.ses.id), map[string]*pgconn.StatementDescription{}
	}
	// A statement new to the connection is prepared in normal mode, after
	// what is on the pipeline (once per statement and connection).
	for _, q := range pb.QueuedQueries {
		if a.stmts[q.SQL] != nil {
			continue
		}
		if err := s.readBack(ctx); err != nil {
			s.blobs.putBack(b.inline)
			return err
		}
		if a.conn == nil {
			return s.send(ctx, b, pb, lazy) // readBack dropped it
		}
		sd, err := a.conn.Prepare(ctx, q.SQL, q.SQL)
		if err != nil {
			s.blobs.putBack(b.inline)
			s.dropPipeline()
			return b.appendError(err)
		}
		a.stmts[q.SQL] = sd
	}
	if a.pipe == nil {
		a.pipe = a.conn.PgConn().StartPipeline(context.Background())
	}
	tm := a.conn.TypeMap()
	for _, q := range pb.QueuedQueries {
		sd := a.stmts[q.SQL]
		if err := a.eqb.Build(tm, sd, q.Arguments); err != nil {
			// Nothing of the batch was flushed: the queued messages go
			// with the connection, and with it the replies of what was
			// sent before, whose outcome is then unknown (a bug either
			// way: the arguments are pgstore's own).
			s.blobs.putBack(b.inline)
			err = fmt.Errorf("pgstore: run %s: encode a statement: %w", s.name, err)
			if len(a.sent) > 0 {
				first := a.sent[0].b
				s.dropPipeline()
				return s.aheadFailed(first, err)
			}
			s.dropPipeline()
			return err
		}
		a.pipe.SendQueryStatement(sd, a.eqb.ParamValues, a.eqb.ParamFormats, slices.Clone(a.eqb.ResultFormats))
	}
	sb := *b
	sb.conn = nil
	a.sent = append(a.sent, sentBatch{b: &sb, n: len(pb.QueuedQueries), ahead: lazy})
	werr := a.pipe.Sync() // written: a failure leaves its outcome unknown, as a lost reply
	n := len(b.rows.seq)
	if a.trace != nil {
		a.trace(pipeEvent{at: time.Now(), lazy: lazy, records: n})
	}
	if lazy {
		a.count++
		s.opt.committed(b.to, b.rows.at[n-1], true)
		if werr != nil {
			return s.readBack(ctx) // settles it, and every one before
		}
		return nil
	}
	if err := s.readBack(ctx); err != nil {
		if a.err != nil {
			return a.err
		}
		return err
	}
	if a.trace != nil {
		a.trace(pipeEvent{at: time.Now(), records: n, replied: true})
	}
	b.committed()
	return nil
}

// readBack reads the replies of everything on the pipeline and puts the
// connection back in normal mode. A batch sent ahead that did not land
// sets the sticky error, returned from then on; an awaited batch's error
// is returned as its commit's would be (a lost bet, a lost reply settled
// by content: resolve.go). After any error the connection is dropped. The
// caller holds a.mu.
func (s *store) readBack(ctx context.Context) error {
	a := &s.ahead
	sent := a.sent
	a.sent = nil
	var last error
	for i, sb := range sent {
		err := a.readOne(sb.n)
		if err != nil && !ambiguous(err) {
			err = sb.b.appendError(err)
			s.dropPipeline() // what follows in the pipeline is unread: it followed a failed batch, and fails its compare-and-set
			if sb.ahead || i < len(sent)-1 {
				return s.aheadFailed(sb.b, err)
			}
			return err
		}
		if err != nil {
			// The connection broke: every batch from this one on is
			// settled by content, in order.
			s.dropPipeline()
			for _, sb := range sent[i:] {
				err := sb.b.settle(ctx, err, sb.ahead)
				if sb.b.conn != nil {
					sb.b.conn.Release() // a re-run's
					sb.b.conn = nil
				}
				if err != nil && sb.ahead {
					return s.aheadFailed(sb.b, err)
				}
				last = err
			}
			return last
		}
	}
	if a.pipe != nil {
		if err := a.pipe.Close(); err != nil {
			a.pipe = nil
			s.dropPipeline()
			return nil // every reply was read: the batches landed
		}
		a.pipe = nil
	}
	return nil
}

// readOne reads the replies of one batch: n statements, then its Sync.
func (a *ahead) readOne(n int) error {
	for range n {
		res, err := a.pipe.GetResults()
		if err != nil {
			return err
		}
		rr, ok := res.(*pgconn.ResultReader)
		if !ok {
			return fmt.Errorf("pgstore: pipeline: a %T for a statement", res)
		}
		if _, err := rr.Close(); err != nil {
			return err
		}
	}
	res, err := a.pipe.GetResults()
	if err != nil {
		return err
	}
	if _, ok := res.(*pgconn.PipelineSync); !ok {
		return fmt.Errorf("pgstore: pipeline: a %T for a Sync", res)
	}
	return nil
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
// received, then frees the session's pipeline key). The caller holds a.mu.
func (s *store) dropPipeline() {
	a := &s.ahead
	if a.conn == nil {
		return
	}
	closeNow(a.conn)
	a.conn, a.pipe, a.stmts, a.sent = nil, nil, nil, nil
}

// releasePipeline reads back what is on the pipeline, which leaves its
// connection in normal mode; end: the connection is closed too (its key
// let go). It is kept otherwise, with its statements prepared: opening one
// takes a connection's setup, and a batch of projections alone, which does
// not go on the pipeline, comes as often as every 50 ms while records come
// (the views' timer, runstate's handoffLag; the manifest's at most every
// second). The caller holds a.mu.
func (s *store) releasePipeline(ctx context.Context, end bool) error {
	err := s.readBack(ctx)
	if a := &s.ahead; a.conn != nil && end {
		// Its key let go before the connection ends (the server frees it
		// only when the backend exits, a moment after a Terminate).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pingTimeout)
		if _, uerr := a.conn.Exec(cctx, "SELECT pg_advisory_unlock($1)", a.key); uerr != nil {
			closeNow(a.conn)
		} else {
			_ = a.conn.Close(cctx)
		}
		cancel()
		a.conn, a.stmts = nil, nil
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
	if a.conn != nil {
		key := a.key
		s.dropPipeline()
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
func (s *store) pipeConnect(ctx context.Context, ses *session) (*pgx.Conn, error) {
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
	return conn, nil
}

// lostAhead is the session's dropAhead (session.go): once the session is
// lost, its pipeline's connection is closed without reading what is left
// (the server still runs what it received), so that its key no longer
// keeps the session alive to the others.
func (s *store) lostAhead() {
	a := &s.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	s.dropPipeline()
}
