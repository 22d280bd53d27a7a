//go:build unix

package runstate_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runstate/runstate"
)

// The CPU benchmarks report the process's CPU time (user and system,
// getrusage) per checkpoint besides the wall time, which on a shared
// machine or a slow disk says little about the library's own cost. Run
// with TMPDIR on a tmpfs to take the disk and the file system's state out
// of it, and alternate the trees compared (PERF.md, issue 14). Compare
// cpu-µs/op: the kernel splits user and system time by its clock ticks:
//
//	TMPDIR=/dev/shm/x go test -run '^$' -bench CPU -benchtime 3000x .

// cpuTimes is the process's user and system CPU time so far.
func cpuTimes() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// reportCPU reports the CPU time since user0 and sys0 per operation.
func reportCPU(b *testing.B, user0, sys0 time.Duration) {
	user, sys := cpuTimes()
	n := float64(b.N)
	b.ReportMetric(float64(user-user0)/1e3/n, "usr-µs/op")
	b.ReportMetric(float64(sys-sys0)/1e3/n, "sys-µs/op")
	b.ReportMetric(float64(user-user0+sys-sys0)/1e3/n, "cpu-µs/op")
}

// benchCPU checkpoints b.N times from goroutines goroutines, each Do
// writing one small output file if output is set.
func benchCPU(b *testing.B, goroutines int, output bool) {
	r := openBench(b, b.TempDir())
	defer r.Close()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	user0, sys0 := cpuTimes()
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				name := "s" + strconv.FormatInt(i, 10)
				err := r.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
					if output {
						return st.WriteFile("artifacts/"+name+".txt", payload)
					}
					return nil
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	reportCPU(b, user0, sys0)
}

// BenchmarkCPUCheckpoint is BenchmarkCheckpoint with its CPU time.
func BenchmarkCPUCheckpoint(b *testing.B) { benchCPU(b, 1, true) }

// BenchmarkCPUCheckpointNoOutput is BenchmarkCheckpointNoOutput with its
// CPU time.
func BenchmarkCPUCheckpointNoOutput(b *testing.B) { benchCPU(b, 1, false) }

// BenchmarkCPUCheckpointParallel8 is 8 goroutines checkpointing with an
// output each, with the CPU time per checkpoint.
func BenchmarkCPUCheckpointParallel8(b *testing.B) { benchCPU(b, 8, true) }
