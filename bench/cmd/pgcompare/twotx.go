package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate/bench/internal/kit"
)

// twoTx is the least a checkpoint costs when its begin must be visible
// to other sessions before its work runs, as a Run's is (ErrBusy): two
// transactions of raw INSERTs, the begin's committed with
// synchronous_commit off in one pipelined round trip (BEGIN, SET LOCAL,
// INSERT, COMMIT), then the complete's in one of its own with
// synchronous_commit on. No output file, no chain, no session: a floor
// for the store, not a contender.
type twoTx struct{ raw }

func init() {
	register(contenderInfo{
		name:  "twotx",
		order: 1,
		about: "two raw INSERT transactions per checkpoint: the begin's (synchronous_commit off, one pipelined round trip), then the complete's (on); no output file",
		make:  func() contender { return &twoTx{} },
	})
}

func (c *twoTx) Open(ctx context.Context, cfg config) error { return c.open(ctx, cfg, "_twotx") }

func (c *twoTx) Checkpoints(ctx context.Context, first, n int, lat []time.Duration) error {
	q := "INSERT INTO " + c.table + " (run, seq, line) VALUES ('bench', $1, $2)"
	for k := range n {
		id := first + k
		t0 := time.Now()
		line := kit.CheckpointRecord(id, kit.OutputData(id))
		var b pgx.Batch
		b.Queue("BEGIN")
		b.Queue("SET LOCAL synchronous_commit = off")
		b.Queue(q, -id, line)
		b.Queue("COMMIT")
		if err := c.pool.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		if _, err := c.pool.Exec(ctx, q, id, line); err != nil {
			return err
		}
		lat[k] = time.Since(t0)
	}
	return nil
}
