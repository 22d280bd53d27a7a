package main

import (
	"context"
	"time"

	"github.com/runstate/runstate/bench/internal/kit"

	"github.com/runstate/runstate"
)

// runstateRun records each checkpoint as one Run.Do of a new stage whose
// function writes the output file with Stage.WriteFile: a begin record,
// the atomic write, and the complete record (fsync'd before Do returns),
// plus whatever else runstate does per checkpoint (the handoff file).
type runstateRun struct {
	run *runstate.Run
}

func init() {
	register(contenderInfo{
		name:  "runstate",
		order: 10,
		about: "runstate: one Run.Do per checkpoint, output via Stage.WriteFile",
		make:  func() contender { return &runstateRun{} },
	})
}

func (c *runstateRun) Open(_ context.Context, dir string) error {
	var err error
	c.run, err = runstate.Open(dir, &runstate.Options{Request: "bench"})
	return err
}

func (c *runstateRun) Checkpoints(ctx context.Context, first, n int, lat []time.Duration) error {
	return kit.DoCheckpoints(ctx, c.run, first, n, lat, writeOutputs)
}

func (c *runstateRun) Close() error { return c.run.Close() }
