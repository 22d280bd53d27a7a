package pgstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
// asks for it through the want lock, and waits), and then sends a batch
// of begins (an optimistic batch, runstate.Optimist, with
// synchronous_commit off) without waiting for its reply: the bet
// statement is on the wire, in the socket's buffer, when Confirm returns,
// and the stage's work starts. A SIGKILL of the process from then on
// leaves the begin to the server (the kernel delivers what was written
// before it closes the socket), which commits it as if the reply had been
// read. No other session can append before the server has run it, so the
// bet holds: the head is the session's own, its lock is held (the bet's
// fence still checks, on the server, as every bet's does). The next batch
// on the connection (the complete, whose bet follows the begin's in the
// same connection's order) first reads the begin's reply, which by then
// is there.
//
// A batch is sent ahead only in an epoch of having the run alone (the
// count of the session's takes of the run's lock) in which an earlier
// batch was confirmed, sent after the take: its compare-and-set then
// proved the session's position the head, and no other session has
// appended since. A batch sent ahead that did not land (the session's
// lock was lost, the server crashed before its WAL writer flushed it, a
// bug) makes the Run read-only when its reply is read: its callers were
// already let go, so the error (wrapping runstate.ErrSessionLost) comes
// from the next batch's Lock or commit. A lost reply is resolved by
// content, as any commit's (resolve.go).
//
// When another session wants the run, the pinger stops the sending ahead
// and reads back what was sent (yield: under the same mutex as the sends,
// so that nothing is sent after it), and only then lets the run's lock go:
// the other session's first batch finds every begin this one sent.

// ahead is what the store sent ahead: at most one batch whose reply is
// not read yet (a second send reads the first's reply first, as the
// connection requires). Guarded by mu, which a commit of an optimistic
// batch holds from reading what was ahead to its own send.
type ahead struct {
	mu sync.Mutex
	// epoch: the epoch of having the run alone in which a batch sent after
	// the take was confirmed (0: none); off: stopped by a yield until the
	// next take.
	epoch uint64
	off   uint64
	b     *batch           // the batch sent ahead (a copy: the Run's is released), with its connection and records
	br    pgx.BatchResults // its reply, unread
	err   error            // sticky: a batch sent ahead did not land
	sent  int              // batches sent ahead (tests)
}

// readAhead reads the reply of the batch sent ahead, if any, and returns
// its connection, idle, for the caller to use or release (nil: none). A
// batch that did not land makes a sticky error, returned from then on.
// The caller holds s.ahead.mu.
func (s *store) readAhead(ctx context.Context) (*pgxpool.Conn, error) {
	a := &s.ahead
	if a.b == nil {
		return nil, a.err
	}
	b, br := a.b, a.br
	a.b, a.br = nil, nil
	first, last := b.marks()
	err := br.Close()
	if err != nil && ambiguous(err) {
		// The reply was lost: resolve by content, as a commit's; the
		// re-run (when not committed) is of the batch as it was.
		err = b.settle(ctx, err, true)
	} else if err != nil {
		err = b.appendError(err)
	}
	b.rows, b.outs = recordRows{}, outputRows{}
	conn := b.conn
	b.conn = nil
	if err == nil {
		return conn, nil
	}
	if conn != nil {
		conn.Release() // a broken one is dropped by the pool
	}
	a.err = fmt.Errorf("%w: pgstore: run %s: records %d-%d, begins sent ahead of their reply while the session had the run alone, did not land (%v): the session went on as if they had; this Run is read-only: open the run again",
		runstate.ErrSessionLost, s.name, first.Seq, last.Seq, err)
	return nil, a.err
}

// flushAhead reads what was sent ahead before a batch takes the run's lock
// on a connection of its own, so that it is ordered after it; the
// connection goes back to the pool.
func (s *store) flushAhead(ctx context.Context) error {
	a := &s.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	conn, err := s.readAhead(ctx)
	if conn != nil {
		conn.Release()
	}
	return err
}

// stopAhead is the session's yield in epoch (session.go): nothing is sent
// ahead until the run is taken alone again, and what was is read back.
func (s *store) stopAhead(epoch uint64) {
	a := &s.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	a.off = epoch
	if conn, _ := s.readAhead(context.Background()); conn != nil {
		conn.Release()
	}
}

// closeAhead ends what was sent ahead at Close: read back when clean;
// otherwise its connection is closed as a killed process's would be,
// without reading (the server still runs what it received).
func (s *store) closeAhead(clean bool) {
	a := &s.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.b == nil {
		return
	}
	if clean {
		if conn, _ := s.readAhead(context.Background()); conn != nil {
			conn.Release()
		}
		return
	}
	conn := a.b.conn
	a.b.conn, a.b, a.br = nil, nil, nil
	if nc := conn.Conn().PgConn().Conn(); nc != nil {
		_ = nc.Close()
	}
	conn.Release()
}
