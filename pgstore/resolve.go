package pgstore

// The pgfault helper owns this file and hardens it (its fault tests drive
// it); the pg helper wrote this first, simple version so the call site in
// batch.go and the signature are agreed.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
)

// settle decides the outcome of a batch whose COMMIT (commitBatch) was
// sent and whose reply was lost (err): committed -> nil; not committed ->
// an error, nothing recorded (pgfault: re-run the batch once under a fresh
// lock); unknown -> an error wrapping runstate.ErrReadOnly.
func (b *batch) settle(ctx context.Context, err error, lazy bool) error {
	n := len(b.rows.seq)
	first := commitMark{Seq: b.rows.seq[0], Hash: b.rows.hash[0]}
	last := commitMark{Seq: b.rows.seq[n-1], Hash: b.rows.hash[n-1]}
	committed, rerr := resolveCommit(context.WithoutCancel(ctx), b.s.connect, b.runID, first, last)
	if rerr != nil {
		return fmt.Errorf("%w: run %s: the connection was lost around the COMMIT of records %d-%d and the outcome is unknown: %v (the next Open finds out from the table)",
			runstate.ErrReadOnly, b.s.name, first.Seq, last.Seq, rerr)
	}
	if committed {
		b.committed()
		return nil
	}
	return fmt.Errorf("pgstore: run %s: the connection was lost before the COMMIT of records %d-%d landed; nothing was recorded: %w",
		b.s.name, first.Seq, last.Seq, err)
}

// commitMark names one record of a batch whose COMMIT's outcome is
// unknown: its seq and the sha256 of its line.
type commitMark struct {
	Seq  int64
	Hash []byte
}

// CommitTimeout bounds how long resolveCommit tries to reach the database
// after a connection was lost around a COMMIT (DESIGN-pg.md §6).
var CommitTimeout = 30 * time.Second

// resolveCommit finds out whether a batch whose COMMIT's reply was lost
// committed, by content (DBOS's "sameWrite"): on a new connection (connect
// sets search_path to the schema), the records at first.Seq and last.Seq
// have our lines' hashes -> committed; absent or other -> not committed
// (every line carries this session's id and a ns timestamp, so another
// writer's record never has our hash). It reconnects with backoff until
// CommitTimeout; an error means the outcome is still unknown.
func resolveCommit(ctx context.Context, connect func(context.Context) (*pgx.Conn, error), runID string, first, last commitMark) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, CommitTimeout)
	defer cancel()
	wait := 50 * time.Millisecond
	var lastErr error
	for {
		committed, err := checkCommit(ctx, connect, runID, first, last)
		if err == nil {
			return committed, nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("no answer from the database within %v: %w", CommitTimeout, lastErr)
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func checkCommit(ctx context.Context, connect func(context.Context) (*pgx.Conn, error), runID string, first, last commitMark) (bool, error) {
	conn, err := connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// One statement: one snapshot for both records.
	rows, err := conn.Query(ctx, `SELECT seq, hash FROM records WHERE run_id = $1 AND seq = ANY($2::bigint[])`,
		runID, []int64{first.Seq, last.Seq})
	if err != nil {
		return false, err
	}
	got := map[int64][]byte{}
	for rows.Next() {
		var seq int64
		var h []byte
		if err := rows.Scan(&seq, &h); err != nil {
			return false, err
		}
		got[seq] = h
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	f, l := bytes.Equal(got[first.Seq], first.Hash), bytes.Equal(got[last.Seq], last.Hash)
	if f != l {
		// One transaction wrote both or neither: a half means the table
		// was changed by hand.
		return false, errors.New("records of one batch are half there (the records table was edited?)")
	}
	return f, nil
}
