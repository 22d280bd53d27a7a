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
	for k := range n {
		id := first + k
		t0 := time.Now()
		err := c.run.Do(ctx, kit.StageName(id), func(ctx context.Context, st *runstate.Stage) error {
			if !writeOutputs {
				return nil
			}
			return st.WriteFile(kit.OutputPath(id), kit.OutputData(id))
		})
		if err != nil {
			return err
		}
		lat[k] = time.Since(t0)
	}
	return nil
}

func (c *runstateRun) Close() error { return c.run.Close() }
