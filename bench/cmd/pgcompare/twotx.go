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
// synchronous_commit on; between them, where checkpoints write their
// output file (-outputs), the file pgstore's work writes, written the same
// way (kit.FileWork, as dbos's). No chain, no session, no blob: a floor
// for the store, not a contender.
type twoTx struct {
	raw
	fw kit.FileWork
}

func init() {
	register(contenderInfo{
		name:  "twotx",
		order: 1,
		about: "two raw INSERT transactions per checkpoint: the begin's (synchronous_commit off, one pipelined round trip), then the complete's (on); between them the output file, as pgstore's work writes it (-outputs)",
		make:  func() contender { return &twoTx{} },
	})
}

func (c *twoTx) Open(ctx context.Context, cfg config) error {
	var err error
	if c.fw, err = kit.NewFileWork(cfg.Dir, writeOutputs); err != nil {
		return err
	}
	return c.open(ctx, cfg, "_twotx")
}

func (c *twoTx) Close() error {
	c.fw.Close()
	return c.raw.Close()
}

func (c *twoTx) Checkpoints(ctx context.Context, first, n int, lat []time.Duration) error {
	q := "INSERT INTO " + c.table + " (run, seq, line) VALUES ('bench', $1, $2)"
	for k := range n {
		id := first + k
		t0 := time.Now()
		data := kit.OutputData(id)
		line := kit.CheckpointRecord(id, data)
		var b pgx.Batch
		b.Queue("BEGIN")
		b.Queue("SET LOCAL synchronous_commit = off")
		b.Queue(q, -id, line)
		b.Queue("COMMIT")
		if err := c.pool.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		if err := c.fw.Write(id, data); err != nil {
			return err
		}
		if _, err := c.pool.Exec(ctx, q, id, line); err != nil {
			return err
		}
		lat[k] = time.Since(t0)
	}
	return nil
}
