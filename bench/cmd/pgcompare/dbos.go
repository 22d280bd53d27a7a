package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
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
type dbosPG struct {
	fw   kit.FileWork
	dctx dbos.Context

	mu    sync.Mutex
	sinks map[int][]time.Duration // first id of a workflow → its latencies
}

func init() {
	register(contenderInfo{
		name:  "dbos",
		order: 20,
		about: "DBOS Transact Go v1.8.0, system database on the same server: one RunAsStep (output file + the record as its output) per checkpoint",
		make:  func() contender { return &dbosPG{sinks: map[int][]time.Duration{}} },
	})
}

// dbosCurrent is the contender the registered workflow works for: DBOS
// registers workflows by function name, so one is open at a time.
var dbosCurrent *dbosPG

type dbosBatch struct {
	First int `json:"first"`
	N     int `json:"n"`
}

func dbosWorkflow(ctx dbos.Context, in dbosBatch) (int, error) {
	c := dbosCurrent
	c.mu.Lock()
	lat := c.sinks[in.First]
	c.mu.Unlock()
	for k := range in.N {
		id := in.First + k
		t0 := time.Now()
		_, err := dbos.RunAsStep(ctx, func(context.Context) (string, error) {
			data := kit.OutputData(id)
			if err := c.fw.Write(id, data); err != nil {
				return "", err
			}
			return string(kit.CheckpointRecord(id, data)), nil
		}, dbos.WithStepName(kit.StageName(id)))
		if err != nil {
			return k, err
		}
		lat[k] = time.Since(t0)
	}
	return in.N, nil
}

func (c *dbosPG) Open(ctx context.Context, cfg config) error {
	if dbosCurrent != nil {
		return fmt.Errorf("dbos: only one DBOS contender can be open at a time")
	}
	var err error
	if c.fw, err = kit.NewFileWork(cfg.Dir, writeOutputs); err != nil {
		return err
	}
	c.dctx, err = dbos.NewContext(ctx, dbos.Config{
		AppName:        "runstate-pgcompare",
		DatabaseURL:    cfg.DSN,
		DatabaseSchema: cfg.Schema + "_dbos",
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	dbos.RegisterWorkflow(c.dctx, dbosWorkflow, dbos.WithWorkflowName("pgcompare-checkpoints"))
	dbosCurrent = c
	return dbos.Launch(c.dctx)
}

func (c *dbosPG) Checkpoints(_ context.Context, first, n int, lat []time.Duration) error {
	c.mu.Lock()
	c.sinks[first] = lat[:n]
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.sinks, first)
		c.mu.Unlock()
	}()
	h, err := dbos.RunWorkflow(c.dctx, dbosWorkflow, dbosBatch{First: first, N: n},
		dbos.WithWorkflowID(fmt.Sprintf("pgc-%08d", first)))
	if err != nil {
		return err
	}
	done, err := h.GetResult()
	if err != nil {
		return err
	}
	if done != n {
		return fmt.Errorf("dbos: workflow did %d of %d checkpoints", done, n)
	}
	return nil
}

func (c *dbosPG) Close() error {
	c.fw.Close()
	err := dbos.Shutdown(c.dctx, 30*time.Second)
	dbosCurrent = nil
	return err
}
