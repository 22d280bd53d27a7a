package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchContender opens the contender name on $RUNSTATE_PG_DSN in a schema
// of its own, dropped at the end.
func benchContender(b *testing.B, name string) contender {
	b.Helper()
	dsn := os.Getenv("RUNSTATE_PG_DSN")
	if dsn == "" {
		b.Skip("RUNSTATE_PG_DSN is not set")
	}
	bn := &bench{dsn: dsn, base: fmt.Sprintf("pgcb_%d", time.Now().UnixNano()%1e12)}
	c := registry[name].make()
	cfg := config{DSN: dsn, Schema: bn.base, Run: "bench", Dir: filepath.Join(b.TempDir(), name), Conns: 10}
	if err := c.Open(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := c.Close(); err != nil {
			b.Error(err)
		}
		if err := bn.dropSchemas(context.Background()); err != nil {
			b.Error(err)
		}
	})
	return c
}

// benchmark runs b.N checkpoints of contender name, one at a time or from
// 8 goroutines at once (parallel; pgstore: one Run).
func benchmark(b *testing.B, name string, parallel bool) {
	c := benchContender(b, name)
	var next atomic.Int64
	if !parallel {
		lat := make([]time.Duration, 1)
		for b.Loop() {
			if err := c.Checkpoints(context.Background(), int(next.Add(1)), 1, lat); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			lat := make([]time.Duration, 1)
			for id := next.Add(1); id <= int64(b.N); id = next.Add(1) {
				if err := c.Checkpoints(context.Background(), int(id), 1, lat); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkRawInsert(b *testing.B)   { benchmark(b, "raw", false) }
func BenchmarkRawInsert8(b *testing.B)  { benchmark(b, "raw", true) }
func BenchmarkTwoTx(b *testing.B)       { benchmark(b, "twotx", false) }
func BenchmarkCheckpoint(b *testing.B)  { benchmark(b, "pgstore", false) }
func BenchmarkCheckpoint8(b *testing.B) { benchmark(b, "pgstore", true) }
func BenchmarkSkip(b *testing.B)        { benchmark(b, "pgskip", false) }
func BenchmarkSkip8(b *testing.B)       { benchmark(b, "pgskip", true) }
func BenchmarkDBOSStep(b *testing.B)    { benchmark(b, "dbos", false) }
