package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
)

// wire is the pipeline's connection (ahead.go), taken from pgconn once it
// is set up (Hijack) and spoken to in the extended protocol directly: a
// batch is its Bind/Execute messages and a Sync, written with one write;
// its reply is read up to the Sync's ReadyForQuery. pgconn's Pipeline
// sends the same messages with more work around them (a pipeline started
// and closed for every awaited batch, a timer armed around every flush
// against a write blocked by unread replies, a result reader for every
// statement): a sequential checkpoint took 1.94 × a raw INSERT on the
// wire against 2.09 × through pgconn (medians of 26 alternating pairs of
// runs of bench/cmd/pgcompare, the median pair 6% faster:
// bench/README.md, 2026-12-07).
// Writes go through one frontend, under ahead.mu; replies are read
// through another, in the order the batches were written, by whichever
// goroutine waits for one (wait), one at a time. Closing the connection
// fails every reply not read yet. Safe for concurrent use as its methods
// say; lock order: ahead.mu, then rmu, then qmu.
type wire struct {
	nc  net.Conn
	out *pgproto3.Frontend // writes, under ahead.mu
	in  *pgproto3.Frontend // reads, under rmu
	tm  *pgtype.Map
	pid uint32

	qmu   sync.Mutex
	queue []*sentBatch // written, reply not read, in order

	rmu    sync.Mutex
	broken error // the read that failed, under rmu

	closeOnce sync.Once
}

// hijack takes conn's connection for a wire. conn is unusable after.
func hijack(ctx context.Context, conn *pgx.Conn) (*wire, error) {
	tm := conn.TypeMap()
	pc := conn.PgConn()
	if err := pc.SyncConn(ctx); err != nil {
		return nil, err
	}
	hc, err := pc.Hijack()
	if err != nil {
		return nil, err
	}
	return &wire{
		nc:  hc.Conn,
		out: pgproto3.NewFrontend(nil, hc.Conn),
		in:  pgproto3.NewFrontend(hc.Conn, nil),
		tm:  tm,
		pid: hc.PID,
	}, nil
}

// wait returns once sb's reply is read, reading the replies before it
// (and closing their done) where no other goroutine does. After a failed
// read (the connection broke or was closed) every reply left fails with
// that error. Safe for concurrent use; the caller may hold ahead.mu.
func (w *wire) wait(sb *sentBatch) {
	for {
		select {
		case <-sb.done:
			return
		default:
		}
		w.rmu.Lock()
		select {
		case <-sb.done:
			w.rmu.Unlock()
			return
		default:
		}
		w.qmu.Lock()
		next := w.queue[0] // sb is queued and not read: the queue is not empty
		w.queue = w.queue[1:]
		w.qmu.Unlock()
		if w.broken == nil {
			w.broken = w.readOne(next)
		}
		if w.broken != nil && next.err == nil {
			next.err = w.broken
		}
		close(next.done)
		w.rmu.Unlock()
	}
}

// readOne reads one batch's reply, up to its Sync's ReadyForQuery: sb.err
// is the first error the server answered (the statements after it were
// skipped, and the batch's implicit transaction rolled back). It returns
// an error only when the connection failed.
func (w *wire) readOne(sb *sentBatch) error {
	for {
		msg, err := w.in.Receive()
		if err != nil {
			return fmt.Errorf("pgstore: pipeline: read a reply: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return nil
		case *pgproto3.ErrorResponse:
			if sb.err == nil {
				sb.err = pgconn.ErrorResponseToPgError(m)
			}
		case *pgproto3.DataRow:
			if sb.collect {
				row := make([][]byte, len(m.Values))
				for i, v := range m.Values {
					row[i] = slices.Clone(v)
				}
				sb.rows = append(sb.rows, row)
			}
		case *pgproto3.ParameterDescription:
			if sb.prep != nil {
				sb.prep.ParamOIDs = slices.Clone(m.ParameterOIDs)
			}
		case *pgproto3.RowDescription:
			if sb.prep != nil {
				for _, f := range m.Fields {
					sb.prep.Fields = append(sb.prep.Fields, pgconn.FieldDescription{
						Name: string(f.Name), TableOID: f.TableOID, TableAttributeNumber: f.TableAttributeNumber,
						DataTypeOID: f.DataTypeOID, DataTypeSize: f.DataTypeSize, TypeModifier: f.TypeModifier, Format: f.Format,
					})
				}
			}
		}
	}
}

// send ends the messages written to w.out since the last send with a Sync
// and flushes them; sb's done is closed once its reply is read. A failed
// flush leaves the outcome unknown (part may have reached the server):
// the connection is closed, so that sb's reply fails and is settled by
// content. The caller holds ahead.mu.
func (w *wire) send(sb *sentBatch) error {
	w.out.SendSync(&pgproto3.Sync{})
	return w.flush(sb)
}

// flush queues sb for its reply and flushes what was written.
func (w *wire) flush(sb *sentBatch) error {
	sb.w, sb.done = w, make(chan struct{})
	w.qmu.Lock()
	w.queue = append(w.queue, sb)
	w.qmu.Unlock()
	if err := w.out.Flush(); err != nil {
		_ = w.nc.Close()
		return err
	}
	return nil
}

// prepare prepares sql as a statement of that name and returns its
// description. The caller holds ahead.mu and has taken every reply before.
func (w *wire) prepare(sql string) (*pgconn.StatementDescription, error) {
	// The server keeps 63 bytes of a name: the SQL's hash names it.
	sum := sha256.Sum256([]byte(sql))
	name := "runstate_" + hex.EncodeToString(sum[:16])
	sb := &sentBatch{prep: &pgconn.StatementDescription{Name: name, SQL: sql}}
	w.out.SendParse(&pgproto3.Parse{Name: name, Query: sql})
	w.out.SendDescribe(&pgproto3.Describe{ObjectType: 'S', Name: name})
	if err := w.send(sb); err != nil {
		return nil, err
	}
	w.wait(sb)
	if sb.err != nil {
		return nil, sb.err
	}
	return sb.prep, nil
}

// exec runs sql (a simple query, no parameters) and waits up to timeout
// for its reply. The caller holds ahead.mu and has taken every reply
// before.
func (w *wire) exec(sql string, timeout time.Duration) error {
	_, err := w.query(sql, timeout)
	return err
}

// query is exec that returns the rows, their values in text.
func (w *wire) query(sql string, timeout time.Duration) ([][][]byte, error) {
	sb := &sentBatch{collect: true}
	w.out.Send(&pgproto3.Query{String: sql})
	// A simple query ends with its own ReadyForQuery: no Sync.
	if err := w.flush(sb); err != nil {
		return nil, err
	}
	t := time.AfterFunc(timeout, func() {
		select {
		case <-sb.done: // answered as the timer fired: the connection stays
		default:
			_ = w.nc.Close()
		}
	})
	w.wait(sb)
	if !t.Stop() && sb.err != nil {
		return nil, errors.New("pgstore: pipeline: no reply in time")
	}
	return sb.rows, sb.err
}

// close closes the connection without reading what is left (the server
// still runs what it received); every reply not read fails. Idempotent.
// The caller holds ahead.mu.
func (w *wire) close() {
	w.closeOnce.Do(func() { _ = w.nc.Close() })
}

// terminate ends the session politely (Terminate), then closes.
func (w *wire) terminate() {
	w.out.Send(&pgproto3.Terminate{})
	_ = w.out.Flush()
	w.close()
}
