package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/runstate/runstate/bench/internal/kit"
)

// raw is the baseline: one INSERT of the checkpoint's ~300-byte record, in
// a transaction of its own (autocommit), with synchronous_commit on: the
// least a durable checkpoint in PostgreSQL costs (one round trip, one WAL
// flush). No output file, no chain, no session.
type raw struct {
	pool  *pgxpool.Pool
	table string
}

func init() {
	register(contenderInfo{
		name:  "raw",
		order: 0,
		about: "one INSERT (run, seq, line) of the ~300-byte record, its own transaction, synchronous_commit on; no output file",
		make:  func() contender { return &raw{} },
		procs: true,
	})
}

func (c *raw) Open(ctx context.Context, cfg config) error { return c.open(ctx, cfg, "_raw") }

// open connects and creates the records table in the schema cfg.Schema +
// suffix (raw's, and twotx's).
func (c *raw) open(ctx context.Context, cfg config, suffix string) error {
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(cfg.Conns)
	if c.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return err
	}
	schema := pgx.Identifier{cfg.Schema + suffix}.Sanitize()
	c.table = schema + ".records"
	// Concurrent children may race to create it: a unique violation on
	// the catalog means another one did.
	for _, q := range []string{
		"CREATE SCHEMA IF NOT EXISTS " + schema,
		"CREATE TABLE IF NOT EXISTS " + c.table + " (run text NOT NULL, seq bigint NOT NULL, line bytea NOT NULL, PRIMARY KEY (run, seq))",
	} {
		for try := 0; ; try++ {
			_, err := c.pool.Exec(ctx, q)
			if err == nil {
				break
			}
			if try == 3 {
				return fmt.Errorf("%s: %w", q, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

func (c *raw) Checkpoints(ctx context.Context, first, n int, lat []time.Duration) error {
	q := "INSERT INTO " + c.table + " (run, seq, line) VALUES ('bench', $1, $2)"
	for k := range n {
		id := first + k
		t0 := time.Now()
		line := kit.CheckpointRecord(id, kit.OutputData(id))
		if _, err := c.pool.Exec(ctx, q, id, line); err != nil {
			return err
		}
		lat[k] = time.Since(t0)
	}
	return nil
}

func (c *raw) Close() error {
	c.pool.Close()
	return nil
}
