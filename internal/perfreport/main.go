// Command perfreport measures runstate against its performance budget
// (DESIGN.md section 5) and prints the figures and the ratios, each
// measured side by side with its baseline in alternating rounds, so that
// load from other processes hits both alike:
//
//	go run ./internal/perfreport [-dir DIR] [-rounds 5] [-n 200] [-records 1000000]
//
// It measures:
//
//   - a checkpoint (Do with one small WriteFile) against a raw write and
//     fdatasync of the bytes it appends to the ledger, and against the
//     same plus writing the output file as WriteFile does;
//   - a checkpoint of a run whose plan has 100,000 stages against one
//     of a run without a plan (the handoff, rewritten after every
//     checkpoint, summarizes the plan);
//   - 8 goroutines checkpointing against one (throughput);
//   - Open of a run of -records records (resumed from its manifest) and of
//     one a tenth as long;
//   - a full replay: Verify, and Open without a manifest, in records/s.
//
// The generated ledgers are kept in DIR (runstate-perf-f<format>c-n<N>)
// for the next run; everything else is removed at the end. File creation
// cost depends on the file system's state (ext4 without a journal skips
// every inode freed in the last 30 seconds, reading each), so the program
// deletes nothing while it measures.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runstate/runstate"

	"github.com/runstate/runstate/internal/cpustat"
	"github.com/runstate/runstate/internal/floorio"
)

func main() {
	dir := flag.String("dir", os.TempDir(), "where to work; generated ledgers are kept here")
	rounds := flag.Int("rounds", 5, "alternating rounds")
	n := flag.Int("n", 200, "checkpoints per round and measurement")
	records := flag.Int("records", 1_000_000, "records in the long ledger")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the checkpoint rounds to `file`")
	flag.Parse()
	if err := run(*dir, *rounds, *n, *records, *profile); err != nil {
		fmt.Fprintln(os.Stderr, "perfreport:", err)
		os.Exit(1)
	}
}

// bigPlan is how many stages the planned run's plan has.
const bigPlan = 100_000

var payload = []byte("result of the stage: 42 lines changed, all tests pass\n")

func checkpoint(r *runstate.Run, name string) error {
	return r.Do(context.Background(), name, func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/"+name+".txt", payload)
	})
}

func median(d []float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func run(base string, rounds, n, records int, profile string) error {
	work, err := os.MkdirTemp(base, "runstate-perf-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	fmt.Printf("runstate perfreport: %s/%s, %d CPUs, GOMAXPROCS %d, %s\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	fmt.Printf("working in %s; %d rounds of %d checkpoints\n\n", work, rounds, n)

	// What creating a file costs here now: on ext4 without a journal it
	// grows with the inodes freed in the same block group in the last 30
	// seconds, and it is part of every checkpoint that writes an output.
	create, err := createCost(filepath.Join(work, "probe"))
	if err != nil {
		return err
	}
	fmt.Printf("creating a file here: %.0f µs (median of 100)\n", create)

	// The bytes one checkpoint appends (begin and complete), from a real run.
	line, err := checkpointBytes(filepath.Join(work, "sample"))
	if err != nil {
		return err
	}
	raw, err := os.OpenFile(filepath.Join(work, "raw.jsonl"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer raw.Close()
	if err := os.MkdirAll(filepath.Join(work, "rawout", "tmp"), 0o755); err != nil {
		return err
	}
	outDir, err := os.Open(filepath.Join(work, "rawout"))
	if err != nil {
		return err
	}
	defer outDir.Close()
	tmpDir, err := os.Open(filepath.Join(work, "rawout", "tmp"))
	if err != nil {
		return err
	}
	defer tmpDir.Close()
	seqRun, err := runstate.Open(filepath.Join(work, "seq"), &runstate.Options{Request: "perfreport"})
	if err != nil {
		return err
	}
	defer seqRun.Close()
	parRun, err := runstate.Open(filepath.Join(work, "par"), &runstate.Options{Request: "perfreport"})
	if err != nil {
		return err
	}
	defer parRun.Close()
	planRun, err := runstate.Open(filepath.Join(work, "plan"), &runstate.Options{Request: "perfreport"})
	if err != nil {
		return err
	}
	defer planRun.Close()
	planned := make([]string, bigPlan)
	for i := range planned {
		planned[i] = fmt.Sprintf("q%06d", i)
	}
	if err := planRun.Plan(context.Background(), planned...); err != nil {
		return err
	}

	var (
		rawMed, outMed, ckMed, bareMed, planMed []float64 // µs, median per round
		seqThr, parThr                          []float64 // checkpoints/s
		seqCPU, parCPU                          []float64 // µs of CPU per checkpoint
		ratioRaw, ratioOut, ratioPar, ratioBare []float64
		ratioPlan                               []float64
		rawCount, ckCount, parCount, planCount  int
	)
	// The sequential figures are taken one operation each in turn,
	// so that a change in the file system's costs during a round (file
	// creation is the one that varies) hits all three alike.
	rawOp := func() error {
		if _, err := raw.Write(line); err != nil {
			return err
		}
		return floorio.Fdatasync(raw)
	}
	outOp := func() error {
		if err := floorio.WriteOutput(tmpDir, outDir, "t"+strconv.Itoa(rawCount), "o"+strconv.Itoa(rawCount)+".txt", payload); err != nil {
			return err
		}
		rawCount++
		return rawOp()
	}
	ckOp := func() error {
		ckCount++
		return checkpoint(seqRun, "s"+strconv.Itoa(ckCount))
	}
	bareOp := func() error {
		ckCount++
		return seqRun.Do(context.Background(), "b"+strconv.Itoa(ckCount), func(context.Context, *runstate.Stage) error { return nil })
	}
	planOp := func() error {
		name := fmt.Sprintf("q%06d", planCount) // the planned stages in order, then more
		planCount++
		return checkpoint(planRun, name)
	}
	sequential := func() error {
		var dr, do, dc, db, dp []float64
		var ckTotal, ckCPU time.Duration
		for i := 0; i < n; i++ {
			for k := 0; k < 5; k++ {
				var err error
				t, cpu := time.Now(), cpustat.Self()
				switch (i + k) % 5 {
				case 4:
					err = planOp()
					dp = append(dp, us(time.Since(t)))
				case 3:
					err = bareOp()
					db = append(db, us(time.Since(t)))
				case 0:
					err = rawOp()
					dr = append(dr, us(time.Since(t)))
				case 1:
					err = outOp()
					do = append(do, us(time.Since(t)))
				case 2:
					err = ckOp()
					d := time.Since(t)
					dc = append(dc, us(d))
					ckTotal += d
					ckCPU += cpustat.Self() - cpu
				}
				if err != nil {
					return err
				}
			}
		}
		rawMed, outMed, ckMed = append(rawMed, median(dr)), append(outMed, median(do)), append(ckMed, median(dc))
		bareMed = append(bareMed, median(db))
		planMed = append(planMed, median(dp))
		seqThr = append(seqThr, float64(n)/ckTotal.Seconds())
		seqCPU = append(seqCPU, us(ckCPU)/float64(n))
		return nil
	}
	parallel := func() error {
		var next atomic.Int64
		var wg sync.WaitGroup
		var first error
		var mu sync.Mutex
		start, cpu := time.Now(), cpustat.Self()
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(n) {
					mu.Lock()
					i := parCount
					parCount++
					mu.Unlock()
					if err := checkpoint(parRun, "p"+strconv.Itoa(i)); err != nil {
						mu.Lock()
						first = err
						mu.Unlock()
						return
					}
				}
			}()
		}
		wg.Wait()
		parThr = append(parThr, float64(n)/time.Since(start).Seconds())
		parCPU = append(parCPU, us(cpustat.Self()-cpu)/float64(n))
		return first
	}
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	for round := 0; round < rounds; round++ {
		steps := []func() error{sequential, parallel}
		if round%2 == 1 {
			steps[0], steps[1] = steps[1], steps[0]
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return err
			}
		}
		ratioRaw = append(ratioRaw, ckMed[round]/rawMed[round])
		ratioBare = append(ratioBare, bareMed[round]/rawMed[round])
		ratioOut = append(ratioOut, ckMed[round]/outMed[round])
		ratioPar = append(ratioPar, parThr[round]/seqThr[round])
		ratioPlan = append(ratioPlan, planMed[round]/ckMed[round])
		fmt.Printf("round %d: raw %.0f µs, raw+output %.0f µs, checkpoint %.0f µs (%.2fx raw, %.2fx raw+output), without an output %.0f µs (%.2fx raw); sequential %.0f/s (%.0f µs CPU each), 8 goroutines %.0f/s (%.0f µs CPU each, %.2fx); with a %d-stage plan %.0f µs (%.2fx)\n",
			round+1, rawMed[round], outMed[round], ckMed[round], ratioRaw[round], ratioOut[round], bareMed[round], ratioBare[round], seqThr[round], seqCPU[round], parThr[round], parCPU[round], ratioPar[round], bigPlan, planMed[round], ratioPlan[round])
	}

	pprof.StopCPUProfile()

	// Open: a long run and one a tenth as long, alternating.
	long, err := cachedRun(base, records)
	if err != nil {
		return err
	}
	short, err := cachedRun(base, records/10)
	if err != nil {
		return err
	}
	var openLong, openShort []float64
	var heapLong, heapShort []float64
	for round := 0; round < rounds; round++ {
		for _, c := range []struct {
			dir        string
			times, mem *[]float64
		}{{long, &openLong, &heapLong}, {short, &openShort, &heapShort}} {
			d, heap, err := timeOpen(c.dir)
			if err != nil {
				return err
			}
			*c.times = append(*c.times, ms(d))
			*c.mem = append(*c.mem, float64(heap)/1024)
		}
	}

	// Full replay: Verify of the long run, and Open of a copy without its
	// manifest.
	var verifyRate, openRate []float64
	noManifest := filepath.Join(work, "nomanifest")
	if err := copyRun(long, noManifest); err != nil {
		return err
	}
	for round := 0; round < rounds; round++ {
		t := time.Now()
		rep, err := runstate.Verify(long)
		if err != nil {
			return err
		}
		verifyRate = append(verifyRate, float64(rep.Records)/time.Since(t).Seconds())
		if err := os.Remove(filepath.Join(noManifest, "manifest.json")); err != nil {
			return err
		}
		t = time.Now()
		r, err := runstate.Open(noManifest, nil)
		if err != nil {
			return err
		}
		d := time.Since(t)
		st, err := r.Status()
		if err != nil {
			return err
		}
		if err := r.Close(); err != nil {
			return err
		}
		openRate = append(openRate, float64(st.Seq)/d.Seconds())
	}

	fmt.Printf("\n%-58s %12s  %s\n", "figure (median of rounds)", "measured", "budget")
	row := func(what, got, budget string) { fmt.Printf("%-58s %12s  %s\n", what, got, budget) }
	row("raw write+fdatasync of a checkpoint's bytes", fmt.Sprintf("%.0f µs", median(rawMed)), fmt.Sprintf("(%d bytes)", len(line)))
	row("raw write+fdatasync, plus the output file", fmt.Sprintf("%.0f µs", median(outMed)), fmt.Sprintf("(creating a file: %.0f µs)", create))
	row("checkpoint: Do with one small WriteFile", fmt.Sprintf("%.0f µs", median(ckMed)), "")
	row("  checkpoint / raw write+fdatasync", fmt.Sprintf("%.2fx", median(ratioRaw)), "<= 1.5x")
	row("  checkpoint / raw write+fdatasync with the output file", fmt.Sprintf("%.2fx", median(ratioOut)), "")
	row("checkpoint without an output: Do of a stage that writes none", fmt.Sprintf("%.0f µs", median(bareMed)), "")
	row("  checkpoint without an output / raw write+fdatasync", fmt.Sprintf("%.2fx", median(ratioBare)), "")
	row(fmt.Sprintf("checkpoint in a run with a %d-stage plan", bigPlan), fmt.Sprintf("%.0f µs", median(planMed)), "")
	row("  with the plan / without", fmt.Sprintf("%.2fx", median(ratioPlan)), "independent of plan size")
	row("sequential checkpoints", fmt.Sprintf("%.0f/s", median(seqThr)), "")
	row("8 goroutines checkpointing", fmt.Sprintf("%.0f/s", median(parThr)), "")
	row("  8 goroutines / sequential", fmt.Sprintf("%.2fx", median(ratioPar)), ">= 3x")
	row("  CPU per checkpoint, sequential / 8 goroutines", fmt.Sprintf("%.0f / %.0f µs", median(seqCPU), median(parCPU)), fmt.Sprintf("(%d CPUs)", runtime.NumCPU()))
	row(fmt.Sprintf("Open, %d records (manifest)", records), fmt.Sprintf("%.1f ms", median(openLong)), "<= 50 ms")
	row(fmt.Sprintf("Open, %d records (manifest)", records/10), fmt.Sprintf("%.1f ms", median(openShort)), "")
	row(fmt.Sprintf("  Open %d / Open %d", records, records/10), fmt.Sprintf("%.2fx", median(openLong)/median(openShort)), "independent of length")
	row("  heap held while open (long / short run)", fmt.Sprintf("%.0f / %.0f KiB", median(heapLong), median(heapShort)), "grows with stages, not records")
	row(fmt.Sprintf("Verify, %d records", records), fmt.Sprintf("%.2fM rec/s", median(verifyRate)/1e6), ">= 1M rec/s")
	row(fmt.Sprintf("Open without manifest (full replay), %d records", records), fmt.Sprintf("%.2fM rec/s", median(openRate)/1e6), ">= 1M rec/s")
	return nil
}

// createCost returns the median time, in µs, to create an empty file in
// dir.
func createCost(dir string) (float64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	d := make([]float64, 100)
	for i := range d {
		t := time.Now()
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(i)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return 0, err
		}
		d[i] = us(time.Since(t))
		f.Close()
	}
	return median(d), nil
}

// checkpointBytes returns the ledger lines one checkpoint appends.
func checkpointBytes(dir string) ([]byte, error) {
	r, err := runstate.Open(dir, &runstate.Options{Request: "perfreport", NoSync: true})
	if err != nil {
		return nil, err
	}
	lp := filepath.Join(dir, "logs", "ledger.jsonl")
	fi, err := os.Stat(lp)
	if err != nil {
		return nil, err
	}
	if err := checkpoint(r, "s123"); err != nil {
		return nil, err
	}
	if err := r.Close(); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(lp)
	if err != nil {
		return nil, err
	}
	data = data[fi.Size():]
	i := bytes.IndexByte(data, '\n')
	j := bytes.IndexByte(data[i+1:], '\n')
	return data[:i+1+j+1], nil
}

// timeOpen opens dir and reports how long Open took and how much heap the
// open run holds.
func timeOpen(dir string) (time.Duration, uint64, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t := time.Now()
	r, err := runstate.Open(dir, nil)
	d := time.Since(t)
	if err != nil {
		return 0, 0, err
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	var heap uint64
	if after.HeapAlloc > before.HeapAlloc {
		heap = after.HeapAlloc - before.HeapAlloc
	}
	return d, heap, r.Close()
}

// cachedRun returns a run directory whose ledger holds n records and has a
// manifest, generating it on first use and keeping it in base.
func cachedRun(base string, n int) (string, error) {
	dir := filepath.Join(base, fmt.Sprintf("runstate-perf-f%dc-n%d", runstate.FormatVersion, n))
	if _, err := os.Stat(filepath.Join(dir, "manifest.json")); err == nil {
		return dir, nil
	}
	os.RemoveAll(dir)
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	t := time.Now()
	if err := generate(tmp, n); err != nil {
		return "", err
	}
	// The first Open replays it all and writes the manifest.
	r, err := runstate.Open(tmp, nil)
	if err != nil {
		return "", err
	}
	if err := r.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	fmt.Printf("generated %s (%d records) in %s\n", dir, n, time.Since(t).Round(time.Millisecond))
	return dir, nil
}

// generate writes a ledger of n records the way a long pipeline leaves it,
// in the documented format (one JSON record a line, a SHA-256 chain, each
// line's CRC-32C):
// create, open, a plan of 100 stages, then begin and complete pairs
// cycling through them (one input, one output each), a close and an open
// every 1,000 records, and a close at the end.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func generate(dir string, n int) error {
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "logs", "ledger.jsonl"))
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	seq, prev := int64(0), ""
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	session := "01900000-0000-7000-8000-000000000001"
	emit := func(r *runstate.Record) error {
		seq++
		r.Seq, r.At, r.Session, r.Prev = seq, at, session, prev
		at = at.Add(time.Millisecond)
		buf.Reset()
		if err := enc.Encode(r); err != nil {
			return err
		}
		b := buf.Bytes()
		// The line's checksum, last, as the writer puts it.
		b = fmt.Appendf(b[:len(b)-2], `,"crc":"%08x"}`+"\n", crc32.Checksum(b[:len(b)-2], castagnoli))
		h := sha256.Sum256(b[:len(b)-1])
		prev = hex.EncodeToString(h[:])
		_, err := w.Write(b)
		return err
	}
	stages := make([]string, 100)
	for i := range stages {
		stages[i] = fmt.Sprintf("execute/file-%03d", i)
	}
	plan, _ := json.Marshal(stages)
	open := json.RawMessage(`{"pid":4242,"host":"perfreport"}`)
	if err := emit(&runstate.Record{Ev: "create", Data: json.RawMessage(`{"id":"01900000-0000-7000-8000-ffffffffffff","request":"perfreport","format":` + strconv.Itoa(runstate.FormatVersion) + `}`)}); err != nil {
		return err
	}
	if err := emit(&runstate.Record{Ev: "open", Data: open}); err != nil {
		return err
	}
	if err := emit(&runstate.Record{Ev: "plan", Data: plan}); err != nil {
		return err
	}
	attempts := map[string]int{}
	sessions, opened := 1, seq
	for i := 0; seq < int64(n); i++ {
		var err error
		switch left := int64(n) - seq; {
		case left == 1:
			err = emit(&runstate.Record{Ev: "close", Data: json.RawMessage(`{}`)})
		case left == 2:
			err = emit(&runstate.Record{Ev: "skip", Stage: "cleanup", Reason: "nothing to clean"})
		case seq-opened >= 1000:
			if err = emit(&runstate.Record{Ev: "close", Data: json.RawMessage(`{}`)}); err == nil {
				sessions++
				session = fmt.Sprintf("01900000-0000-7000-8000-%012d", sessions)
				err = emit(&runstate.Record{Ev: "open", Data: open})
				opened = seq
			}
		default:
			name := stages[i%len(stages)]
			attempts[name]++
			sum := sha256.Sum256([]byte(fmt.Sprint(name, i)))
			in := map[string]string{"src/" + name + ".go": "sha256:" + hex.EncodeToString(sum[:])}
			out := []runstate.Output{{Path: "artifacts/" + name + ".txt", SHA256: hex.EncodeToString(sum[:]), Size: int64(100 + i%900)}}
			if err = emit(&runstate.Record{Ev: "begin", Stage: name, Attempt: attempts[name], Inputs: in}); err == nil {
				err = emit(&runstate.Record{Ev: "complete", Stage: name, Attempt: attempts[name], Inputs: in, Outputs: out})
			}
		}
		if err != nil {
			return err
		}
	}
	return w.Flush()
}

// copyRun copies a run directory's ledger into dst (no manifest).
func copyRun(src, dst string) error {
	if err := os.MkdirAll(filepath.Join(dst, "logs"), 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(src, "logs", "ledger.jsonl"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dst, "logs", "ledger.jsonl"), data, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dst, "manifest.json"), []byte("{}"), 0o644)
}
