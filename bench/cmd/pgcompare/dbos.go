package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/runstate/runstate/bench/internal/kit"
)

// dbosPG runs DBOS Transact Go with its system database on the same
// PostgreSQL server (schema <base>_dbos). A checkpoint is one step
// (dbos.RunAsStep) whose function writes the output file, as pgstore's
// Stage.WriteFile does, and returns the record: DBOS inserts the step's
// output into operation_outputs (its own transaction, synchronous_commit
// on, the server's default, which DBOS does not change) before RunAsStep
// returns. Each call of Checkpoints is one workflow of n steps: the
// workflow's own rows (start, end) count in the throughput, not in the
// step latencies.
type dbosPG struct{ d *kit.DBOS }

func init() {
	register(contenderInfo{
		name:  "dbos",
		order: 20,
		about: "DBOS Transact Go v1.8.0, system database on the same server: one RunAsStep (output file + the record as its output) per checkpoint",
		make:  func() contender { return &dbosPG{} },
	})
}

func (c *dbosPG) Open(ctx context.Context, cfg config) error {
	fw, err := kit.NewFileWork(cfg.Dir, writeOutputs)
	if err != nil {
		return err
	}
	c.d, err = kit.OpenDBOS(ctx, dbos.Config{
		AppName:        "runstate-pgcompare",
		DatabaseURL:    cfg.DSN,
		DatabaseSchema: cfg.Schema + "_dbos",
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, fw)
	return err
}

func (c *dbosPG) Checkpoints(_ context.Context, first, n int, lat []time.Duration) error {
	return c.d.Checkpoints(first, n, lat)
}

func (c *dbosPG) Close() error {
	if c.d == nil {
		return nil
	}
	return c.d.Close()
}
