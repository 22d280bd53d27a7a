package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/bench/internal/kit"
	"github.com/runstate/runstate/pgstore"
)

// pgRun is runstate on PostgreSQL: one Run.Do of a new stage per
// checkpoint, whose function writes the ~160-byte output with
// Stage.WriteFile. Do commits the begin record (synchronous_commit off),
// uploads the output's blob (when the database lacks it) and commits the
// complete record (synchronous_commit on) before it returns. The goroutines
// of one process share one Run (group commit); each process opens its own
// (a session of its own) with its own working directory.
type pgRun struct {
	db  *pgstore.DB
	run *runstate.Run
	// skip: a checkpoint is one Run.Skip of a new stage instead (the
	// contender pgskip), in a schema of its own (suffix).
	skip   bool
	suffix string
}

func init() {
	register(contenderInfo{
		name:  "pgstore",
		order: 10,
		about: "runstate pgstore: one Run.Do per checkpoint, its output via Stage.WriteFile (its bytes also stored in the database, in the output's row); a session alone on its run sends its begins ahead of their reply",
		make:  func() contender { return &pgRun{} },
		procs: true,
		runs:  true,
	})
	register(contenderInfo{
		name:     "pgskip",
		order:    11,
		about:    "runstate pgstore: one Run.Skip per checkpoint, a single record committed with synchronous_commit on (what a raw INSERT does, through the library); optional",
		make:     func() contender { return &pgRun{skip: true, suffix: "_skip"} },
		optional: true,
	})
}

func (c *pgRun) Open(ctx context.Context, cfg config) error {
	sep := "?"
	if strings.Contains(cfg.DSN, "?") {
		sep = "&"
	}
	var err error
	c.db, err = pgstore.Connect(ctx, fmt.Sprintf("%s%sschema=%s&pool_max_conns=%d", cfg.DSN, sep, cfg.Schema+c.suffix, cfg.Conns))
	if err != nil {
		return err
	}
	if c.run, err = c.db.Open(ctx, cfg.Run, cfg.Dir, &runstate.Options{Request: "bench"}); err != nil {
		return err
	}
	// A session alone on its run takes it alone at its first ping, a
	// second after Open, and then sends its begins ahead of their reply
	// (pgstore's package doc): the sequential and 8-goroutine modes
	// measure that steady state, as any run that lives longer than a
	// second has, not the first second. A child process measures from its
	// Open, as before: waiting there let every child's first batch carry
	// a manifest due meanwhile, under the head row (p99 of 4 processes on
	// one run 98-122 ms without the wait, 175-258 ms with it, solo on or
	// off), which is the manifest's cost, not the sessions'.
	if !cfg.Child {
		time.Sleep(1500 * time.Millisecond)
	}
	return nil
}

func (c *pgRun) Checkpoints(ctx context.Context, first, n int, lat []time.Duration) error {
	if !c.skip {
		return kit.DoCheckpoints(ctx, c.run, first, n, lat, writeOutputs)
	}
	for k := range n {
		t0 := time.Now()
		if err := c.run.Skip(ctx, kit.StageName(first+k), "bench"); err != nil {
			return err
		}
		lat[k] = time.Since(t0)
	}
	return nil
}

// CheckpointParts is Checkpoints with the begin and complete parts of
// each checkpoint timed (splitter); a Skip has no parts.
func (c *pgRun) CheckpointParts(ctx context.Context, first, n int, lat, begin, complete []time.Duration) (bool, error) {
	if c.skip {
		return false, c.Checkpoints(ctx, first, n, lat)
	}
	return true, kit.DoCheckpointParts(ctx, c.run, first, n, lat, begin, complete, writeOutputs)
}

func (c *pgRun) Close() error {
	err := c.run.Close()
	c.db.Close()
	return err
}
