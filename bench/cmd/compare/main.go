// Command compare measures what a durable checkpoint costs in runstate and
// in the stores an agent could use instead, side by side in one run.
//
// Every contender does the same logical work per checkpoint: write a small
// output file (atomically, no fsync) and durably record a ~300-byte record
// of the completed stage (name, output path, sha256, size). The contenders
// take turns round by round (the order rotates each round), so a slow spell
// of the machine — on some file systems creating files is several times
// slower for minutes after many files were deleted — falls on all of them
// alike. Latencies are per checkpoint, pooled over the rounds; throughputs
// are medians of the per-round figures; every ratio is to the floor (a raw
// append + fdatasync) measured in the same run.
//
//	cd bench && go run ./cmd/compare [-rounds 15] [-ops 400] [-contenders floor,runstate,...]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/runstate/runstate/bench/internal/kit"
)

// writeOutputs says whether checkpoints write their output file (-outputs).
var writeOutputs = true

func main() {
	var (
		rounds     = flag.Int("rounds", 15, "measured rounds; each runs every contender in turn")
		ops        = flag.Int("ops", 400, "checkpoints per contender per round, in each mode (sequential, and split over the goroutines)")
		goroutines = flag.Int("goroutines", 8, "goroutines in the concurrent mode")
		warmup     = flag.Int("warmup", 1, "unmeasured rounds first, at a quarter of -ops")
		dir        = flag.String("dir", "", "directory for the stores (default: a new temp dir under "+os.TempDir()+")")
		keep       = flag.Bool("keep", false, "keep the stores after the run")
		names      = flag.String("contenders", "", "comma-separated contenders to run (default: all but the optional ones; floor is always run)")
		list       = flag.Bool("list", false, "list the contenders and exit")
		cpuprofile = flag.String("cpuprofile", "", "write a CPU profile of the measured run to this file")
		probe      = flag.Bool("probe", false, "instead of the comparison: time write+fdatasync alone and beside 1, 3 and 7 goroutines creating files")
	)
	flag.BoolVar(&writeOutputs, "outputs", true, "write each checkpoint's output file (false: the durable record alone)")
	flag.Parse()

	if *probe {
		base := *dir
		if base == "" {
			base = os.TempDir()
		}
		if err := fsyncProbe(base, 1000); err != nil {
			fatalf("%v", err)
		}
		return
	}
	if *list {
		for _, ci := range registered() {
			opt := ""
			if ci.optional {
				opt = " (optional)"
			}
			fmt.Printf("%-12s %s%s\n", ci.name, ci.about, opt)
		}
		return
	}
	if *rounds < 1 || *ops < 1 || *goroutines < 1 || *warmup < 0 {
		fatalf("-rounds, -ops and -goroutines must be at least 1, -warmup at least 0")
	}
	chosen, err := choose(*names)
	if err != nil {
		fatalf("%v", err)
	}
	stop := func() {}
	if *cpuprofile != "" {
		if stop, err = kit.StartCPUProfile(*cpuprofile); err != nil {
			fatalf("%v", err)
		}
	}
	err = run(chosen, *rounds, *ops, *goroutines, *warmup, *dir, *keep)
	stop()
	if err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "compare: "+format+"\n", args...)
	os.Exit(1)
}

// choose returns the contenders named in list (all but the optional ones
// when list is empty), the floor always first.
func choose(list string) ([]contenderInfo, error) {
	all := registered()
	if strings.TrimSpace(list) == "" {
		var out []contenderInfo
		for _, ci := range all {
			if !ci.optional {
				out = append(out, ci)
			}
		}
		return out, nil
	}
	want := map[string]bool{"floor": true}
	for n := range strings.SplitSeq(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if _, ok := registry[n]; !ok {
			var known []string
			for _, ci := range all {
				known = append(known, ci.name)
			}
			return nil, fmt.Errorf("unknown contender %q (known: %s)", n, strings.Join(known, ", "))
		}
		want[n] = true
	}
	var out []contenderInfo
	for _, ci := range all {
		if want[ci.name] {
			out = append(out, ci)
		}
	}
	return out, nil
}

// entry is one contender during a run, with what was measured of it.
type entry struct {
	info   contenderInfo
	c      contender
	nextID int

	seqLat   []time.Duration // every sequential checkpoint
	concLat  []time.Duration // every concurrent checkpoint
	seqMed   []time.Duration // per round, median sequential latency
	seqTput  []float64       // per round, checkpoints/s
	concTput []float64       // per round, checkpoints/s
}

// take returns the first of n fresh checkpoint ids.
func (e *entry) take(n int) int {
	first := e.nextID
	e.nextID += n
	return first
}

func run(chosen []contenderInfo, rounds, ops, goroutines, warmup int, dir string, keep bool) (err error) {
	ctx := context.Background()
	base, err := makeBase(dir)
	if err != nil {
		return err
	}
	defer func() {
		if keep {
			fmt.Printf("stores kept in %s\n", base)
			return
		}
		if rerr := os.RemoveAll(base); rerr != nil && err == nil {
			err = rerr
		}
	}()

	var entries []*entry
	defer func() {
		for _, e := range entries {
			if cerr := e.c.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("%s: close: %w", e.info.name, cerr)
			}
		}
	}()
	for _, ci := range chosen {
		d := filepath.Join(base, ci.name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		c := ci.make()
		if err := c.Open(ctx, d); err != nil {
			return fmt.Errorf("%s: open: %w", ci.name, err)
		}
		entries = append(entries, &entry{info: ci, c: c})
	}

	loadBefore := kit.Loadavg()
	fileBefore, err := kit.FileCreation(base, kit.FileCreationFiles)
	if err != nil {
		return err
	}
	start := time.Now()
	total := warmup + rounds
	for r := range total {
		measured := r >= warmup
		n := ops
		if !measured {
			n = max(ops/4, goroutines)
		}
		// Rotate the order each round so that no contender always runs
		// right after the same other one, or first in the round.
		order := make([]*entry, len(entries))
		for i := range entries {
			order[i] = entries[(i+r)%len(entries)]
		}
		for _, e := range order {
			if err := sequential(ctx, e, n, measured); err != nil {
				return fmt.Errorf("%s: sequential: %w", e.info.name, err)
			}
		}
		for _, e := range order {
			if err := concurrent(ctx, e, n, goroutines, measured); err != nil {
				return fmt.Errorf("%s: %d goroutines: %w", e.info.name, goroutines, err)
			}
		}
		label := "round"
		if !measured {
			label = "warm-up round"
		}
		fmt.Fprintf(os.Stderr, "%s %d/%d done (%.0fs)\n", label, r+1, total, time.Since(start).Seconds())
	}
	took := time.Since(start)
	fileAfter, err := kit.FileCreation(base, kit.FileCreationFiles)
	if err != nil {
		return err
	}
	report(entries, rounds, ops, goroutines, base, took, loadBefore, kit.Loadavg(), kit.FileCreationLines(fileBefore, fileAfter, writeOutputs))
	return nil
}

// makeBase creates the directory that holds this run's stores.
func makeBase(dir string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", "runstate-bench-")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(dir, "run-")
}

func sequential(ctx context.Context, e *entry, n int, measured bool) error {
	lat := make([]time.Duration, n)
	first := e.take(n)
	t0 := time.Now()
	if err := e.c.Checkpoints(ctx, first, n, lat); err != nil {
		return err
	}
	wall := time.Since(t0)
	if measured {
		e.seqLat = append(e.seqLat, lat...)
		e.seqMed = append(e.seqMed, kit.Median(lat))
		e.seqTput = append(e.seqTput, float64(n)/wall.Seconds())
	}
	return nil
}

// concurrent runs n checkpoints (rounded up to a multiple of g) on g
// goroutines at once, each doing its share one after another.
func concurrent(ctx context.Context, e *entry, n, g int, measured bool) error {
	per := (n + g - 1) / g
	lat := make([]time.Duration, per*g)
	firsts := make([]int, g)
	for i := range firsts {
		firsts[i] = e.take(per)
	}
	errs := make([]error, g)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range g {
		wg.Go(func() {
			errs[i] = e.c.Checkpoints(ctx, firsts[i], per, lat[i*per:(i+1)*per])
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if measured {
		e.concLat = append(e.concLat, lat...)
		e.concTput = append(e.concTput, float64(per*g)/wall.Seconds())
	}
	return nil
}

func report(entries []*entry, rounds, ops, goroutines int, base string, took time.Duration, loadBefore, loadAfter, files string) {
	fmt.Printf("runstate bench/cmd/compare  %s  %s/%s  %d CPUs  %s\n",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02 15:04 MST"))
	outputs := "with"
	if !writeOutputs {
		outputs = "without"
	}
	fmt.Printf("%d rounds × %d checkpoints per contender, sequential and on %d goroutines, %s output files\n",
		rounds, ops, goroutines, outputs)
	fmt.Printf("stores in %s; took %.0fs; load average %s before, %s after\n%s\n", base, took.Seconds(), loadBefore, loadAfter, files)

	var fl *entry
	for _, e := range entries {
		if e.info.name == "floor" {
			fl = e
		}
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	g := fmt.Sprintf("%dg", goroutines)
	fmt.Fprintf(tw, "contender\tmedian µs\tp99 µs\tmean µs\t× floor (IQR)\tseq ops/s\t%s ops/s\t%s × floor\t%s / seq (IQR)\t%s median µs\t\n", g, g, g, g)
	for _, e := range entries {
		r := pairedRatios(e, fl)
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%s\t%.0f\t%.0f\t%.2f\t%s\t%.0f\t\n",
			e.info.name, kit.US(kit.Median(e.seqLat)), kit.US(kit.Percentile(e.seqLat, 0.99)), kit.US(kit.Mean(e.seqLat)), kit.WithIQR(r.lat),
			kit.MedianF(e.seqTput), kit.MedianF(e.concTput), kit.MedianF(r.conc), kit.WithIQR(r.scale), kit.US(kit.Median(e.concLat)))
	}
	tw.Flush()

	fmt.Println()
	fmt.Println("median, p99, mean: latency of one sequential checkpoint, over all rounds.")
	fmt.Printf("seq, %s ops/s: median over rounds of checkpoints per second, sequential and on %d goroutines sharing one store.\n", g, goroutines)
	fmt.Printf("%s median: latency of one checkpoint while %d goroutines checkpoint at once.\n", g, goroutines)
	fmt.Println("Ratios are paired by round, then the median over rounds is taken (IQR: the middle half of the rounds):")
	fmt.Println("× floor: the round's median latency ÷ the floor's in that round;")
	fmt.Printf("%s × floor: the round's %s throughput ÷ the floor's; %s / seq: the round's %s throughput ÷ its sequential throughput.\n", g, g, g, g)
	for _, e := range entries {
		fmt.Printf("  %-12s %s\n", e.info.name, e.info.about)
	}
	for _, e := range entries {
		if e.info.name != "runstate" {
			continue
		}
		r := pairedRatios(e, fl)
		ratio, scale := kit.MedianF(r.lat), kit.MedianF(r.scale)
		fmt.Printf("\nrunstate against the design's targets (DESIGN.md §5): checkpoint %.2f × floor (target ≤ 1.5: %s); %s %.2f × sequential throughput (target ≥ 3: %s)\n",
			ratio, kit.Verdict(ratio <= 1.5), g, scale, kit.Verdict(scale >= 3))
	}
}

// ratios holds one value per measured round.
type ratios struct {
	lat   []float64 // median sequential latency ÷ the floor's
	conc  []float64 // concurrent throughput ÷ the floor's
	scale []float64 // concurrent throughput ÷ sequential throughput
}

// pairedRatios compares e with the floor round by round, so that a slow
// spell of the machine, which lasts longer than a round, cancels out.
func pairedRatios(e, fl *entry) ratios {
	var r ratios
	for i := range e.seqMed {
		r.lat = append(r.lat, float64(e.seqMed[i])/float64(fl.seqMed[i]))
		r.conc = append(r.conc, e.concTput[i]/fl.concTput[i])
		r.scale = append(r.scale, e.concTput[i]/e.seqTput[i])
	}
	return r
}
