// Command pgcompare measures what a durable checkpoint costs on PostgreSQL:
// runstate's pgstore against a raw INSERT transaction and against a DBOS
// Transact Go step (and the floor of two raw transactions, twotx), side by
// side on one server, in alternating rounds.
//
// Each round runs, in an order rotated by the round: every contender
// sequentially (one goroutine), every contender on -goroutines goroutines
// in this process (pgstore: all on one run), and -procs child processes
// (this program re-executed) on one run and on one run each. Latencies are
// pooled over the rounds; throughputs and every ratio are per round, then
// the median over rounds (with the interquartile range), so a slow spell of
// the machine falls on all contenders alike.
//
//	cd bench && go run ./cmd/pgcompare -dsn 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
//
// The DSN defaults to $RUNSTATE_PG_DSN. Everything is created in fresh
// schemas (pgc_<time>, pgc_<time>_raw, pgc_<time>_twotx, pgc_<time>_dbos), dropped at the end
// unless -keep.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate/bench/internal/kit"
	"github.com/runstate/runstate/internal/cpustat"
)

// writeOutputs says whether checkpoints write their output file (-outputs).
var writeOutputs = true

// config is where a contender keeps its store: the server, its schema, the
// run (pgstore), a local working directory, and how many connections the
// process may use at once.
type config struct {
	DSN    string `json:"dsn"`
	Schema string `json:"schema"` // the base name; each contender adds its suffix
	Run    string `json:"run"`
	Dir    string `json:"dir"`
	Conns  int    `json:"conns"`
	// Child: the store is opened by a child process of a multi-process
	// mode, whose clock starts when all are ready.
	Child bool `json:"child"`
}

// A contender is one way of durably recording checkpoints on PostgreSQL.
type contender interface {
	// Open connects and creates what the contender needs (idempotent: a
	// child process opens the same store as the others).
	Open(ctx context.Context, cfg config) error
	// Checkpoints performs n checkpoints, one after another, for the ids
	// first … first+n-1, and stores the latency of checkpoint k in lat[k].
	// It is called from several goroutines at once, with disjoint ids.
	Checkpoints(ctx context.Context, first, n int, lat []time.Duration) error
	// Close releases it.
	Close() error
}

// A splitter is a contender whose sequential checkpoints have two parts
// around the work: the begin (from the call to the start of the work) and
// the complete (from the end of the work to the return). ok is false when
// this one has none (and begin and complete are left alone).
type splitter interface {
	CheckpointParts(ctx context.Context, first, n int, lat, begin, complete []time.Duration) (ok bool, err error)
}

type contenderInfo struct {
	name  string
	order int
	about string
	make  func() contender
	// procs: the contender also runs in the multi-process mode; runs: it
	// has runs, so that mode is run twice: all processes on one run, and
	// each on its own. optional: run only when -contenders names it.
	procs, runs, optional bool
}

var registry = map[string]contenderInfo{}

func register(ci contenderInfo) { registry[ci.name] = ci }

func registered() []contenderInfo {
	var all []contenderInfo
	for _, ci := range registry {
		all = append(all, ci)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].order < all[j].order })
	return all
}

func main() {
	var (
		dsn        = flag.String("dsn", os.Getenv("RUNSTATE_PG_DSN"), "the PostgreSQL server (default $RUNSTATE_PG_DSN)")
		rounds     = flag.Int("rounds", 10, "measured rounds; each runs every contender in every mode")
		ops        = flag.Int("ops", 200, "checkpoints per contender per round, in each mode (split over the goroutines or processes)")
		goroutines = flag.Int("goroutines", 8, "goroutines in the in-process concurrent mode")
		procs      = flag.Int("procs", 4, "processes in the multi-process modes (0: leave them out)")
		warmup     = flag.Int("warmup", 1, "unmeasured rounds first, at a quarter of -ops")
		names      = flag.String("contenders", "", "comma-separated contenders (default: all but pgskip): "+strings.Join(contenderNames(), ", "))
		keep       = flag.Bool("keep", false, "keep the schemas and the working directories")
		child      = flag.String("child", "", "internal: run as a child process of the multi-process modes")
		cpuprofile = flag.String("cpuprofile", "", "write the parent process's CPU profile to this file")
	)
	flag.BoolVar(&writeOutputs, "outputs", true, "pgstore and dbos checkpoints write their output file (false: the record alone)")
	flag.Parse()
	if *child != "" {
		os.Exit(childMain(*child))
	}
	if *dsn == "" {
		fatalf("no server: give -dsn or set RUNSTATE_PG_DSN (e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)")
	}
	if *rounds < 1 || *ops < 1 || *goroutines < 1 || *procs < 0 || *warmup < 0 {
		fatalf("-rounds, -ops and -goroutines must be at least 1, -procs and -warmup at least 0")
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
	b := &bench{dsn: *dsn, rounds: *rounds, ops: *ops, goroutines: *goroutines, procs: *procs, warmup: *warmup, keep: *keep}
	err = b.run(context.Background(), chosen)
	stop()
	if err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pgcompare: "+format+"\n", args...)
	os.Exit(1)
}

func contenderNames() []string {
	var n []string
	for _, ci := range registered() {
		n = append(n, ci.name)
	}
	return n
}

func choose(list string) ([]contenderInfo, error) {
	if strings.TrimSpace(list) == "" {
		var out []contenderInfo
		for _, ci := range registered() {
			if !ci.optional {
				out = append(out, ci)
			}
		}
		return out, nil
	}
	want := map[string]bool{"raw": true} // the baseline is always run
	for n := range strings.SplitSeq(list, ",") {
		n = strings.TrimSpace(n)
		if _, ok := registry[n]; !ok && n != "" {
			return nil, fmt.Errorf("unknown contender %q (known: %s)", n, strings.Join(contenderNames(), ", "))
		}
		want[n] = true
	}
	var out []contenderInfo
	for _, ci := range registered() {
		if want[ci.name] {
			out = append(out, ci)
		}
	}
	return out, nil
}

// series is what was measured of one contender in one mode.
type series struct {
	lat  []time.Duration // every checkpoint, pooled over the rounds
	med  []time.Duration // per round, the median latency
	tput []float64       // per round, checkpoints/s
}

func (s *series) add(lat []time.Duration, wall time.Duration) {
	s.lat = append(s.lat, lat...)
	s.med = append(s.med, kit.Median(lat))
	s.tput = append(s.tput, float64(len(lat))/wall.Seconds())
}

// entry is one contender during the run.
type entry struct {
	info contenderInfo
	c    contender
	cfg  config
	seq  series
	conc series
	// the parts of the sequential checkpoints (a splitter's): the begin,
	// the work between, and the complete
	begin, work, complete series
	// the multi-process modes: procs processes on one run, and each on
	// its own run (the same for contenders without runs)
	oneRun, ownRuns series
	// seqCPU, concCPU: the CPU (the server's and this process's) of the
	// measured sequential and concurrent rounds
	seqCPU, concCPU cpustat.Span
}

type bench struct {
	dsn                                     string
	rounds, ops, goroutines, procs, warmup  int
	keep                                    bool
	base, work                              string
	nextID                                  int
	mu                                      sync.Mutex
	server, syncCommit, fsync, loadB, loadA string
	fileB, fileA                            time.Duration // kit.FileCreation before and after the rounds
}

// take returns the first of n fresh checkpoint ids.
func (b *bench) take(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	first := b.nextID
	b.nextID += n
	return first
}

func (b *bench) run(ctx context.Context, chosen []contenderInfo) (err error) {
	if err := b.probeServer(ctx); err != nil {
		return err
	}
	b.base = fmt.Sprintf("pgc_%d", time.Now().UnixNano()%1e12)
	if b.work, err = os.MkdirTemp("", "pgcompare-"); err != nil {
		return err
	}
	var entries []*entry
	defer func() {
		for _, e := range entries {
			if cerr := e.c.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("%s: close: %w", e.info.name, cerr)
			}
		}
		if b.keep {
			fmt.Printf("kept: schemas %s*, working directories in %s\n", b.base, b.work)
			return
		}
		if derr := b.dropSchemas(context.Background()); derr != nil && err == nil {
			err = derr
		}
		os.RemoveAll(b.work)
	}()
	for _, ci := range chosen {
		e := &entry{info: ci, c: ci.make(), cfg: config{DSN: b.dsn, Schema: b.base, Run: "bench", Dir: filepath.Join(b.work, ci.name), Conns: b.goroutines + 2}}
		if err := e.c.Open(ctx, e.cfg); err != nil {
			return fmt.Errorf("%s: open: %w", ci.name, err)
		}
		entries = append(entries, e)
	}
	b.loadB = kit.Loadavg()
	if b.fileB, err = kit.FileCreation(b.work, kit.FileCreationFiles); err != nil {
		return err
	}
	start := time.Now()
	total := b.warmup + b.rounds
	for r := range total {
		measured := r >= b.warmup
		n := b.ops
		if !measured {
			n = max(b.ops/4, b.goroutines, b.procs)
		}
		order := make([]*entry, len(entries))
		for i := range entries {
			order[i] = entries[(i+r)%len(entries)]
		}
		for _, e := range order {
			lat := make([]time.Duration, n)
			begin := make([]time.Duration, n)
			complete := make([]time.Duration, n)
			parts := false
			cpu := cpustat.Now()
			t0 := time.Now()
			if s, ok := e.c.(splitter); ok {
				parts, err = s.CheckpointParts(ctx, b.take(n), n, lat, begin, complete)
			} else {
				err = e.c.Checkpoints(ctx, b.take(n), n, lat)
			}
			if err != nil {
				return fmt.Errorf("%s: sequential: %w", e.info.name, err)
			}
			if measured {
				wall := time.Since(t0)
				e.seqCPU.Add(cpu, wall, n)
				e.seq.add(lat, wall)
				if parts {
					work := make([]time.Duration, n)
					for k := range work {
						work[k] = lat[k] - begin[k] - complete[k]
					}
					e.begin.add(begin, wall)
					e.work.add(work, wall)
					e.complete.add(complete, wall)
				}
			}
		}
		for _, e := range order {
			cpu := cpustat.Now()
			lat, wall, err := b.concurrent(ctx, e, n)
			if err != nil {
				return fmt.Errorf("%s: %d goroutines: %w", e.info.name, b.goroutines, err)
			}
			if measured {
				e.concCPU.Add(cpu, wall, len(lat))
				e.conc.add(lat, wall)
			}
		}
		for _, e := range order {
			if !e.info.procs || b.procs == 0 {
				continue
			}
			modes := []bool{false}
			if e.info.runs {
				modes = append(modes, true)
			}
			for _, own := range modes {
				lat, wall, err := b.processes(ctx, e, n, own, r)
				if err != nil {
					return fmt.Errorf("%s: %d processes: %w", e.info.name, b.procs, err)
				}
				if measured && own {
					e.ownRuns.add(lat, wall)
				} else if measured {
					e.oneRun.add(lat, wall)
				}
			}
		}
		label := "round"
		if !measured {
			label = "warm-up round"
		}
		fmt.Fprintf(os.Stderr, "%s %d/%d done (%.0fs)\n", label, r+1, total, time.Since(start).Seconds())
	}
	b.loadA = kit.Loadavg()
	if b.fileA, err = kit.FileCreation(b.work, kit.FileCreationFiles); err != nil {
		return err
	}
	b.report(entries, time.Since(start))
	return nil
}

// concurrent runs n checkpoints (rounded up to a multiple of the
// goroutines) on b.goroutines goroutines at once.
func (b *bench) concurrent(ctx context.Context, e *entry, n int) ([]time.Duration, time.Duration, error) {
	g := b.goroutines
	per := (n + g - 1) / g
	lat := make([]time.Duration, per*g)
	firsts := make([]int, g)
	for i := range firsts {
		firsts[i] = b.take(per)
	}
	errs := make([]error, g)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range g {
		wg.Go(func() { errs[i] = e.c.Checkpoints(ctx, firsts[i], per, lat[i*per:(i+1)*per]) })
	}
	wg.Wait()
	return lat, time.Since(t0), errors.Join(errs...)
}

// childJob is what the parent asks of a child process.
type childJob struct {
	Cfg   config `json:"cfg"`
	First int    `json:"first"`
	N     int    `json:"n"`
}

// childResult is what a child reports.
type childResult struct {
	Lat []time.Duration `json:"lat"`
	Err string          `json:"err,omitempty"`
}

// processes runs n checkpoints (rounded up to a multiple of b.procs) in
// b.procs child processes, on the entry's run or (own) each on a run of
// its own. Each child connects and opens first and says "ready"; the clock
// starts when all are ready and stops when the last has reported.
func (b *bench) processes(ctx context.Context, e *entry, n int, own bool, round int) ([]time.Duration, time.Duration, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, 0, err
	}
	per := (n + b.procs - 1) / b.procs
	type kid struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	kids := make([]*kid, b.procs)
	defer func() {
		for _, k := range kids {
			if k != nil && k.cmd.Process != nil {
				k.in.Close()
				k.cmd.Wait()
			}
		}
	}()
	for i := range kids {
		cfg := e.cfg
		cfg.Conns = 2
		cfg.Dir = filepath.Join(b.work, fmt.Sprintf("%s-r%d-p%d", e.info.name, round, i))
		if own {
			// A run of its own, in a working directory of its own: the
			// shared run's, of the same round, names that run (pgstore
			// refuses a working directory of another run).
			cfg.Run = fmt.Sprintf("bench-p%d", i)
			cfg.Dir += "-own"
		}
		job, _ := json.Marshal(childJob{Cfg: cfg, First: b.take(per), N: per})
		cmd := exec.CommandContext(ctx, exe, "-child", e.info.name, fmt.Sprintf("-outputs=%t", writeOutputs))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, 0, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, 0, err
		}
		if err := cmd.Start(); err != nil {
			return nil, 0, err
		}
		k := &kid{cmd: cmd, in: in, out: bufio.NewReader(out)}
		kids[i] = k
		if _, err := fmt.Fprintf(in, "%s\n", job); err != nil {
			return nil, 0, err
		}
	}
	for i, k := range kids {
		line, err := k.out.ReadString('\n')
		if strings.TrimSpace(line) != "ready" {
			return nil, 0, fmt.Errorf("child %d did not get ready: %q %v", i, line, err)
		}
	}
	t0 := time.Now()
	for _, k := range kids {
		if _, err := io.WriteString(k.in, "go\n"); err != nil {
			return nil, 0, err
		}
	}
	var lat []time.Duration
	for i, k := range kids {
		line, err := k.out.ReadString('\n')
		if err != nil {
			return nil, 0, fmt.Errorf("child %d: %v", i, err)
		}
		var res childResult
		if err := json.Unmarshal([]byte(line), &res); err != nil {
			return nil, 0, fmt.Errorf("child %d: %v: %q", i, err, line)
		}
		if res.Err != "" {
			return nil, 0, fmt.Errorf("child %d: %s", i, res.Err)
		}
		lat = append(lat, res.Lat...)
	}
	return lat, time.Since(t0), nil
}

// childMain is a child process: read the job, open, say ready, wait for
// go, checkpoint, report, close.
func childMain(name string) int {
	ci, ok := registry[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "pgcompare child: unknown contender %q\n", name)
		return 2
	}
	in := bufio.NewReader(os.Stdin)
	report := func(res childResult) int {
		b, _ := json.Marshal(res)
		fmt.Printf("%s\n", b)
		if res.Err != "" {
			return 1
		}
		return 0
	}
	line, err := in.ReadString('\n')
	if err != nil {
		return report(childResult{Err: "read job: " + err.Error()})
	}
	var job childJob
	if err := json.Unmarshal([]byte(line), &job); err != nil {
		return report(childResult{Err: "job: " + err.Error()})
	}
	ctx := context.Background()
	c := ci.make()
	job.Cfg.Child = true
	if err := c.Open(ctx, job.Cfg); err != nil {
		return report(childResult{Err: "open: " + err.Error()})
	}
	defer c.Close()
	fmt.Println("ready")
	if _, err := in.ReadString('\n'); err != nil {
		return report(childResult{Err: "wait for go: " + err.Error()})
	}
	lat := make([]time.Duration, job.N)
	if err := c.Checkpoints(ctx, job.First, job.N, lat); err != nil {
		return report(childResult{Err: err.Error()})
	}
	return report(childResult{Lat: lat})
}

// probeServer reads the server's version and durability settings: a
// server with fsync or synchronous_commit off would flatter everyone.
func (b *bench) probeServer(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", b.dsn, err)
	}
	defer conn.Close(ctx)
	for _, q := range []struct {
		sql string
		to  *string
	}{{"SHOW server_version", &b.server}, {"SHOW synchronous_commit", &b.syncCommit}, {"SHOW fsync", &b.fsync}} {
		if err := conn.QueryRow(ctx, q.sql).Scan(q.to); err != nil {
			return fmt.Errorf("%s: %w", q.sql, err)
		}
	}
	if b.syncCommit != "on" || b.fsync != "on" {
		return fmt.Errorf("the server has synchronous_commit=%s, fsync=%s: a durable commit needs both on", b.syncCommit, b.fsync)
	}
	return nil
}

func (b *bench) dropSchemas(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, b.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname = $1 OR nspname LIKE $2`, b.base, b.base+`\_%`)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{n}.Sanitize()+" CASCADE"); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) report(entries []*entry, took time.Duration) {
	fmt.Printf("runstate bench/cmd/pgcompare  %s  %s/%s  %d CPUs  %s\n",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02 15:04 MST"))
	outputs := "with"
	if !writeOutputs {
		outputs = "without"
	}
	fmt.Printf("PostgreSQL %s (synchronous_commit=%s, fsync=%s); %d rounds × %d checkpoints per contender and mode, %s output files; took %.0fs; load average %s before, %s after\n",
		b.server, b.syncCommit, b.fsync, b.rounds, b.ops, outputs, took.Seconds(), b.loadB, b.loadA)
	fmt.Printf("%s\n", kit.FileCreationLines(b.fileB, b.fileA, writeOutputs))
	var raw, dbos, pg, two *entry
	for _, e := range entries {
		switch e.info.name {
		case "raw":
			raw = e
		case "dbos":
			dbos = e
		case "twotx":
			two = e
		case "pgstore":
			pg = e
		}
	}
	g := fmt.Sprintf("%dg", b.goroutines)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "contender\tmedian µs\tp99 µs\tseq ops/s\t× raw (IQR)\t%s ops/s\t%s p99 µs\t%s / seq (IQR)\t\n", g, g, g)
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%s\t%.0f\t%.0f\t%s\t\n", e.info.name,
			kit.US(kit.Median(e.seq.lat)), kit.US(kit.Percentile(e.seq.lat, 0.99)), kit.MedianF(e.seq.tput),
			kit.WithIQR(ratio(e.seq.med, raw.seq.med)), kit.MedianF(e.conc.tput), kit.US(kit.Percentile(e.conc.lat, 0.99)),
			kit.WithIQR(divide(e.conc.tput, e.seq.tput)))
	}
	tw.Flush()
	if b.procs > 0 {
		fmt.Printf("\n%d processes, each with its own connections and working directory:\n", b.procs)
		tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "contender\truns\tops/s\tmedian µs\tp99 µs\t/ seq (IQR)\t\n")
		for _, e := range entries {
			if !e.info.procs {
				continue
			}
			for _, m := range []struct {
				runs string
				s    *series
			}{{"1", &e.oneRun}, {fmt.Sprint(b.procs), &e.ownRuns}} {
				if !e.info.runs && m.s == &e.ownRuns {
					continue
				}
				runs := m.runs
				if !e.info.runs {
					runs = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%s\t\n", e.info.name, runs, kit.MedianF(m.s.tput),
					kit.US(kit.Median(m.s.lat)), kit.US(kit.Percentile(m.s.lat, 0.99)), kit.WithIQR(divide(m.s.tput, e.seq.tput)))
			}
		}
		tw.Flush()
	}
	fmt.Println()
	fmt.Println("median, p99: latency of one checkpoint, pooled over the rounds; ops/s: median over rounds.")
	fmt.Println("Ratios are per round (× raw: the round's median latency ÷ raw's; / seq: the round's throughput ÷ the same contender's sequential throughput), then the median over rounds (IQR: the middle half).")
	for _, e := range entries {
		fmt.Printf("  %-8s %s\n", e.info.name, e.info.about)
	}
	if pg == nil {
		return
	}
	fmt.Println()
	r := kit.MedianF(ratio(pg.seq.med, raw.seq.med))
	fmt.Printf("pgstore checkpoint %.2f × a raw INSERT transaction (target ≤ 2.0: %s)\n", r, kit.Verdict(r <= 2.0))
	if dbos != nil {
		r = kit.MedianF(ratio(pg.seq.med, dbos.seq.med))
		fmt.Printf("pgstore checkpoint %.2f × a DBOS Transact Go step (target ≤ 0.5: %s)\n", r, kit.Verdict(r <= 0.5))
	}
	if two != nil {
		r = kit.MedianF(ratio(two.seq.med, raw.seq.med))
		file := ""
		if writeOutputs {
			file = " with the output file between them"
		}
		fmt.Printf("(two raw transactions%s, what a checkpoint costs that waits for its begin's reply before its work: %.2f × raw; pgstore %.2f × that)\n",
			file, r, kit.MedianF(ratio(pg.seq.med, two.seq.med)))
	}
	if len(pg.complete.med) > 0 {
		// DESIGN.md §5 words its file-store target as "one checkpoint
		// (Complete)": the durable record alone, without the begin.
		fmt.Printf("(its parts, sequential medians: begin %.0f µs (%s × raw), work %.0f µs, complete %.0f µs (%s × raw): the complete alone is the durable record, with the output's bytes where there is one)\n",
			kit.US(kit.Median(pg.begin.lat)), kit.WithIQR(ratio(pg.begin.med, raw.seq.med)), kit.US(kit.Median(pg.work.lat)),
			kit.US(kit.Median(pg.complete.lat)), kit.WithIQR(ratio(pg.complete.med, raw.seq.med)))
	}
	r = kit.MedianF(divide(pg.conc.tput, pg.seq.tput))
	fmt.Printf("pgstore %s on one run %.2f × sequential throughput (target ≥ 3: %s)\n", g, r, kit.Verdict(r >= 3))
	if c, sq := pg.concCPU, pg.seqCPU; c.OK() && sq.OK() {
		cpus := runtime.NumCPU()
		ss, sc := sq.PerOp()
		cs, cc := c.PerOp()
		fmt.Printf("(its CPU a checkpoint, the server's processes + this one's: sequential %.0f + %.0f µs, %.0f%% of the %d CPUs busy; %s %.0f + %.0f µs, %.0f%% busy: with every CPU busy at that CPU a checkpoint, %s could reach %.2f × sequential)\n",
			kit.US(ss), kit.US(sc), sq.Busy(cpus), cpus, g, kit.US(cs), kit.US(cc), c.Busy(cpus), g, cpustat.Ceiling(sq, c, cpus))
	}
}

// ratio divides a's per-round medians by b's.
func ratio(a, b []time.Duration) []float64 {
	out := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		out = append(out, float64(a[i])/float64(b[i]))
	}
	return out
}

// divide divides a's per-round figures by b's.
func divide(a, b []float64) []float64 {
	out := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]/b[i])
	}
	return out
}
