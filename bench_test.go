package runstate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runstate/runstate"
)

// The performance budget (at the top of PERF.md) is read from these side by
// side: BenchmarkCheckpoint against BenchmarkRawAppend,
// BenchmarkCheckpointParallel8 and BenchmarkCheckpointLargePlan against
// BenchmarkCheckpoint. The program
// internal/perfreport measures the same in alternating rounds and prints
// the ratios.

var payload = []byte("result of the stage: 42 lines changed, all tests pass\n")

// checkpoint is one checkpoint as a pipeline makes it: Do of a stage that
// writes one small output.
func checkpoint(r *runstate.Run, name string) error {
	return r.Do(context.Background(), name, func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/"+name+".txt", payload)
	})
}

// openBench opens dir; a run created by GenRunForTest is resumed whatever
// it serves.
func openBench(b *testing.B, dir string) *runstate.Run {
	b.Helper()
	req := "benchmark"
	if _, err := os.Stat(filepath.Join(dir, "logs", "ledger.jsonl")); err == nil {
		req = ""
	}
	r, err := runstate.Open(dir, &runstate.Options{Request: req})
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// BenchmarkCheckpoint is one Do with one small WriteFile: a begin record,
// an output file, a complete record (fsync'd) and the projections.
func BenchmarkCheckpoint(b *testing.B) {
	dir := b.TempDir()
	r := openBench(b, dir)
	defer r.Close()
	fi, _ := os.Stat(filepath.Join(dir, "logs", "ledger.jsonl"))
	start := fi.Size()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := checkpoint(r, "s"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	fi, _ = os.Stat(filepath.Join(dir, "logs", "ledger.jsonl"))
	b.ReportMetric(float64(fi.Size()-start)/float64(b.N), "ledger-B/op")
}

// BenchmarkCheckpointRedo is BenchmarkCheckpoint on ten stages, each
// redone with a new input value, so that every output replaces the file
// its previous attempt wrote (a stage run again): on ext4 a rename over a
// file starts the writeback of the new one, which WriteFile's exchange
// avoids (output_linux.go).
func BenchmarkCheckpointRedo(b *testing.B) {
	r := openBench(b, b.TempDir())
	defer r.Close()
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := "s" + strconv.Itoa(i%10)
		err := r.Do(ctx, name, func(ctx context.Context, st *runstate.Stage) error {
			return st.WriteFile("artifacts/"+name+".txt", payload)
		}, runstate.Value("round", i))
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpointNoOutput is one Do of a stage that writes no file:
// what the library adds to the ledger's write and fsync, without the cost
// of creating the output file.
func BenchmarkCheckpointNoOutput(b *testing.B) {
	r := openBench(b, b.TempDir())
	defer r.Close()
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := r.Do(ctx, "s"+strconv.Itoa(i), func(context.Context, *runstate.Stage) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpointLargePlan is BenchmarkCheckpoint in a run whose plan
// has 100,000 stages, done in plan order: the handoff rewritten after each
// checkpoint summarizes the plan, and should cost no more for it.
func BenchmarkCheckpointLargePlan(b *testing.B) {
	r := openBench(b, b.TempDir())
	defer r.Close()
	names := make([]string, 100_000)
	for i := range names {
		names[i] = fmt.Sprintf("q%06d", i)
	}
	if err := r.Plan(context.Background(), names...); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := checkpoint(r, fmt.Sprintf("q%06d", i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer() // Close rewrites the manifest of 100,000 stages
}

// checkpointBytes returns the ledger bytes one checkpoint appends (its
// begin and complete lines), taken from a real run.
func checkpointBytes(tb testing.TB) []byte {
	dir := tb.TempDir()
	r, err := runstate.Open(dir, &runstate.Options{Request: "benchmark", NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	lp := filepath.Join(dir, "logs", "ledger.jsonl")
	fi, _ := os.Stat(lp)
	if err := checkpoint(r, "s123"); err != nil {
		tb.Fatal(err)
	}
	r.Close()
	data, err := os.ReadFile(lp)
	if err != nil {
		tb.Fatal(err)
	}
	data = data[fi.Size():]
	// The begin and complete lines, without the close record.
	i := bytes.IndexByte(data, '\n')
	j := bytes.IndexByte(data[i+1:], '\n')
	return data[:i+1+j+1]
}

// BenchmarkRawAppend is the floor: one write of the bytes a checkpoint
// appends, then fdatasync, on a file in the same file system.
func BenchmarkRawAppend(b *testing.B) {
	line := checkpointBytes(b)
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "raw.jsonl"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.SetBytes(int64(len(line)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := f.Write(line); err != nil {
			b.Fatal(err)
		}
		if err := fdatasync(f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpointParallel8 is 8 goroutines checkpointing at once, each
// on its own stages; ns/op is per checkpoint, so throughput is 1e9/ns.
// Group commit shares one write and one fsync among the checkpoints that
// wait at the same time.
func BenchmarkCheckpointParallel8(b *testing.B) {
	r := openBench(b, b.TempDir())
	defer r.Close()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := checkpoint(r, "s"+strconv.FormatInt(i, 10)); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkEffect is one side effect: an intent (fsync'd), Do, and a
// confirmation with the receipt (fsync'd).
func BenchmarkEffect(b *testing.B) {
	r := openBench(b, b.TempDir())
	defer r.Close()
	ctx := context.Background()
	e := runstate.Effect{Do: func(ctx context.Context, key string) (json.RawMessage, error) {
		return json.RawMessage(`{"ticket":"T-1"}`), nil
	}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := r.Effect(ctx, "ticket:"+strconv.Itoa(i), e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenSmall opens (resumes) a run of ten done stages; Close is
// not timed.
func BenchmarkOpenSmall(b *testing.B) {
	dir := b.TempDir()
	r := openBench(b, dir)
	for i := 0; i < 10; i++ {
		if err := checkpoint(r, "s"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
	}
	r.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := openBench(b, dir)
		b.StopTimer()
		r.Close()
		b.StartTimer()
	}
}

// cachedRun returns a run directory with a generated ledger of n records
// and a manifest, built once and kept under os.TempDir, keyed by format
// and generator version, so repeated benchmark runs reuse it. Each Open
// of it adds an open and a close record.
func cachedRun(b *testing.B, n int) string {
	b.Helper()
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("runstate-bench-f%d-g3-n%d", runstate.FormatVersion, n))
	if _, err := os.Stat(filepath.Join(dir, "manifest.json")); err == nil {
		return dir
	}
	os.RemoveAll(dir)
	tmp := dir + ".tmp" + strconv.Itoa(os.Getpid())
	os.RemoveAll(tmp)
	start := time.Now()
	if err := runstate.GenRunForTest(tmp, n, true); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		b.Fatal(err)
	}
	b.Logf("generated %d records in %s: %s", n, time.Since(start).Round(time.Millisecond), dir)
	return dir
}

// BenchmarkOpen1M resumes a run whose ledger holds a million records, from
// its manifest snapshot. Close is not timed.
func BenchmarkOpen1M(b *testing.B) {
	dir := cachedRun(b, 1_000_000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := openBench(b, dir)
		b.StopTimer()
		if err := r.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/open")
}

// BenchmarkReplay reads and checks every record of a 100,000-record
// ledger without a snapshot: Verify, and Open with no manifest.json.
func BenchmarkReplay(b *testing.B) {
	const n = 100_000
	b.Run("verify", func(b *testing.B) {
		dir := cachedRun(b, n)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			rep, err := runstate.Verify(dir)
			if err != nil {
				b.Fatal(err)
			}
			if rep.Records < n {
				b.Fatalf("verified %d records, want %d", rep.Records, n)
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	})
	b.Run("open-no-manifest", func(b *testing.B) {
		dir := b.TempDir()
		if err := runstate.GenRunForTest(dir, n, false); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			os.Remove(filepath.Join(dir, "manifest.json"))
			b.StartTimer()
			r := openBench(b, dir)
			b.StopTimer()
			r.Close()
			b.StartTimer()
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	})
}
