package main

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/runstate/runstate/bench/internal/kit"

	"github.com/runstate/runstate/internal/floorio"
)

// floor is the reference: the output file, then one write of the record
// (with its newline) to a file opened O_APPEND and one fdatasync. No lock,
// no framing, no hash chain: the least any durable checkpoint can cost. In
// the concurrent mode each goroutine does its own write + fdatasync (an
// O_APPEND write of a few hundred bytes is not interleaved on a local file
// system), so whatever the kernel overlaps is the floor's concurrency.
type floor struct {
	fw kit.FileWork
	f  *os.File
}

func init() {
	register(contenderInfo{
		name:  "floor",
		order: 0,
		about: "output file + one O_APPEND write of the record + fdatasync",
		make:  func() contender { return &floor{} },
	})
}

func (c *floor) Open(_ context.Context, dir string) error {
	fw, err := kit.NewFileWork(dir, writeOutputs)
	if err != nil {
		return err
	}
	c.fw = fw
	c.f, err = os.OpenFile(filepath.Join(dir, "ledger.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	return err
}

func (c *floor) Checkpoints(_ context.Context, first, n int, lat []time.Duration) error {
	for k := range n {
		id := first + k
		t0 := time.Now()
		data := kit.OutputData(id)
		if err := c.fw.Write(id, data); err != nil {
			return err
		}
		rec := append(kit.CheckpointRecord(id, data), '\n')
		if _, err := c.f.Write(rec); err != nil {
			return err
		}
		if err := floorio.Fdatasync(c.f); err != nil {
			return err
		}
		lat[k] = time.Since(t0)
	}
	return nil
}

func (c *floor) Close() error {
	c.fw.Close()
	return c.f.Close()
}
