package kit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// DBOS records checkpoints as DBOS Transact Go steps: a checkpoint is one
// dbos.RunAsStep whose function writes the output file (FileWork) and
// returns the record; DBOS stores the step's output in its system database
// (one write transaction, committed durably) before RunAsStep returns.
// Each call of Checkpoints is one workflow of n such steps, so the
// workflow's own rows (start, end) count in the throughput but not in the
// per-step latencies. Checkpoints is safe for concurrent use; one DBOS is
// open at a time in a process (DBOS registers workflows by function name).
type DBOS struct {
	fw   FileWork
	dctx dbos.Context

	mu    sync.Mutex
	sinks map[int][]time.Duration // first id of a workflow → its latencies
}

// dbosCurrent is the DBOS the registered workflow works for.
var dbosCurrent *DBOS

type dbosBatch struct {
	First int `json:"first"`
	N     int `json:"n"`
}

// dbosWorkflow is the workflow: n steps, one per checkpoint.
func dbosWorkflow(ctx dbos.Context, in dbosBatch) (int, error) {
	c := dbosCurrent
	c.mu.Lock()
	lat := c.sinks[in.First]
	c.mu.Unlock()
	for k := range in.N {
		id := in.First + k
		t0 := time.Now()
		_, err := dbos.RunAsStep(ctx, func(context.Context) (string, error) {
			data := OutputData(id)
			if err := c.fw.Write(id, data); err != nil {
				return "", err
			}
			return string(CheckpointRecord(id, data)), nil
		}, dbos.WithStepName(StageName(id)))
		if err != nil {
			return k, err
		}
		lat[k] = time.Since(t0)
	}
	return in.N, nil
}

// OpenDBOS creates the DBOS context of cfg, registers the checkpoint
// workflow and launches it. fw is the file work of each step; Close closes
// it.
func OpenDBOS(ctx context.Context, cfg dbos.Config, fw FileWork) (*DBOS, error) {
	if dbosCurrent != nil {
		return nil, fmt.Errorf("dbos: only one DBOS contender can be open at a time")
	}
	c := &DBOS{fw: fw, sinks: map[int][]time.Duration{}}
	var err error
	if c.dctx, err = dbos.NewContext(ctx, cfg); err != nil {
		return nil, err
	}
	dbos.RegisterWorkflow(c.dctx, dbosWorkflow, dbos.WithWorkflowName("bench-checkpoints"))
	dbosCurrent = c
	if err := dbos.Launch(c.dctx); err != nil {
		return c, err
	}
	return c, nil
}

// Checkpoints runs checkpoints first … first+n-1 as one workflow and
// stores the latency of step k in lat[k].
func (c *DBOS) Checkpoints(first, n int, lat []time.Duration) error {
	c.mu.Lock()
	c.sinks[first] = lat[:n]
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.sinks, first)
		c.mu.Unlock()
	}()
	h, err := dbos.RunWorkflow(c.dctx, dbosWorkflow, dbosBatch{First: first, N: n},
		dbos.WithWorkflowID(fmt.Sprintf("bench-%08d", first)))
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

// Close shuts DBOS down and closes the file work.
func (c *DBOS) Close() error {
	c.fw.Close()
	err := dbos.Shutdown(c.dctx, 30*time.Second)
	dbosCurrent = nil
	return err
}
