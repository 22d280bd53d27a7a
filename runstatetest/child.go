package runstatetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runstate/runstate/internal/leakcheck"
	"github.com/runstate/runstate/internal/testhook"
)

// The child's environment: which pipeline, where, and where to die.
const (
	envChild  = "RUNSTATETEST_CHILD"
	envDir    = "RUNSTATETEST_DIR"
	envKillAt = "RUNSTATETEST_KILL_AT" // point/skip/name
	envCounts = "RUNSTATETEST_COUNTS"  // file for the crossing counts

	startedLine  = "runstatetest: pipeline started"
	finishedLine = "runstatetest: pipeline finished"
	killingLine  = "runstatetest: killing myself at"
)

// ChildFunc is a pipeline as a child process runs it: open the run in dir,
// do the work, close the run, and return nil when everything is done.
// What it needs besides dir (the address of a fake service, say) it reads
// from the environment, which Child.Env sets.
type ChildFunc func(ctx context.Context, dir string) error

var (
	regMu    sync.Mutex
	registry = map[string]ChildFunc{}
)

// Register names a pipeline that a child process can run. Call it from an
// init function or from TestMain before Main, so that the child, which is
// the same test binary, has it too. It panics on a name registered twice.
// Safe for concurrent use.
func Register(name string, fn ChildFunc) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("runstatetest: pipeline " + name + " registered twice")
	}
	registry[name] = fn
}

// Main is TestMain's body for a package that uses Child or Storm:
//
//	func TestMain(m *testing.M) { runstatetest.Main(m) }
//
// In a child process started by Child.Run it runs the registered pipeline
// and exits (0 when the pipeline returned nil). Otherwise it runs the
// tests and, when they passed, checks that no goroutine started by them
// is still running; then it exits with their status.
func Main(m *testing.M) {
	if name, ok := os.LookupEnv(envChild); ok {
		os.Exit(runChild(name))
	}
	code := m.Run()
	if code == 0 {
		if err := leakcheck.Find(nil, 5*time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "runstatetest: goroutines leaked by the tests:\n%v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// runChild is the child's side: arm the crash points, run the pipeline.
func runChild(name string) int {
	regMu.Lock()
	fn := registry[name]
	regMu.Unlock()
	if fn == nil {
		fmt.Fprintf(os.Stderr, "runstatetest: no pipeline registered as %q: call runstatetest.Register before runstatetest.Main\n", name)
		return 2
	}
	var counts [testhook.NumPoints]atomic.Int64
	for p := testhook.Point(1); p < testhook.NumPoints; p++ {
		testhook.Arm(&testhook.Trigger{Point: p, Count: &counts[p]})
	}
	if spec := os.Getenv(envKillAt); spec != "" {
		at, err := parseAt(spec)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		testhook.Arm(&testhook.Trigger{Point: testhook.Point(at.Point), Name: at.Name, Skip: at.Skip,
			Fire: func(_ any, p testhook.Point, name string) error {
				fmt.Printf("%s %s %s\n", killingLine, p, name)
				killSelf()
				return ErrCrashed // not reached
			}})
	}
	fmt.Println(startedLine)
	if err := fn(context.Background(), os.Getenv(envDir)); err != nil {
		fmt.Fprintf(os.Stderr, "runstatetest: pipeline %s failed: %v\n", name, err)
		return 3
	}
	if path := os.Getenv(envCounts); path != "" {
		m := map[string]int64{}
		for p := testhook.Point(1); p < testhook.NumPoints; p++ {
			m[p.String()] = counts[p].Load()
		}
		data, _ := json.Marshal(m)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	fmt.Println(finishedLine)
	return 0
}

// killSelf ends the process as SIGKILL does (TerminateProcess on Windows):
// no deferred function runs, nothing is flushed.
func killSelf() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	time.Sleep(time.Hour) // the kill is on its way
}

func formatAt(at At) string { return fmt.Sprintf("%s/%d/%s", at.Point, at.Skip, at.Name) }

func parseAt(s string) (At, error) {
	ps, rest, _ := strings.Cut(s, "/")
	skip, name, _ := strings.Cut(rest, "/")
	p, err := ParsePoint(ps)
	if err != nil {
		return At{}, err
	}
	n, err := strconv.Atoi(skip)
	if err != nil {
		return At{}, fmt.Errorf("runstatetest: bad %s %q", envKillAt, s)
	}
	return At{Point: p, Skip: n, Name: name}, nil
}

// Child runs a registered pipeline in a child process: the test binary
// itself, started again, with TestMain calling Main. Its fields are read
// by Run; a Child may be run by several goroutines at once.
type Child struct {
	Pipeline string        // the name given to Register
	Dir      string        // the run directory, handed to the pipeline
	Env      []string      // extra environment, "KEY=value"
	Timeout  time.Duration // for one process; zero means one minute
	MaxRuns  int           // RunKilled and Storm give up after this many processes; zero means 100
}

// Kill says how to end a child early. The zero Kill lets it finish.
type Kill struct {
	// At, when At.Point is set, makes the child kill itself (SIGKILL) at
	// that crossing of a crash point.
	At At
	// After, when positive, makes the parent kill the child (SIGKILL)
	// this long after its pipeline started.
	After time.Duration
}

// String says how the kill ends the child, as in "kill at after-begin
// fetch" or "kill after 40ms"; the zero Kill is "no kill".
func (k Kill) String() string {
	switch {
	case k.At.Point != 0 && k.After > 0:
		return fmt.Sprintf("kill at %s or after %s", k.At, k.After)
	case k.At.Point != 0:
		return "kill at " + k.At.String()
	case k.After > 0:
		return fmt.Sprintf("kill after %s", k.After)
	}
	return "no kill"
}

// Outcome is how one child process ended.
type Outcome struct {
	Finished  bool          // it exited 0: the pipeline returned nil
	Killed    bool          // the kill ended it before it finished
	Crossings map[Point]int // of a finished child: how often it crossed each crash point
	Elapsed   time.Duration // from the pipeline's start to the child's exit
	Output    string        // what it wrote to stdout and stderr
	Err       error         // neither finished nor killed: it failed, or could not start
}

// Run starts the child once, applies k, and waits for it to end: for its
// exit, and at most a second more for a process that the pipeline started
// (a server, a go test) and that keeps its output open. Outcome.Output
// holds the child's output whole, lines of any length. The child's run
// directory holds whatever its records made durable; Run itself writes
// nothing there. Safe for concurrent use (on different
// directories, or on one directory to have several processes share a run,
// as Storm does).
func (c Child) Run(k Kill) Outcome {
	exe, err := os.Executable()
	if err != nil {
		return Outcome{Err: err}
	}
	counts, err := os.CreateTemp("", "runstatetest-counts-*")
	if err != nil {
		return Outcome{Err: err}
	}
	counts.Close()
	defer os.Remove(counts.Name())

	cmd := exec.Command(exe, "-test.run=^$")
	// A binary built with -race sleeps a second at exit unless told not to.
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	cmd.Env = append(cmd.Env, c.Env...)
	cmd.Env = append(cmd.Env, envChild+"="+c.Pipeline, envDir+"="+c.Dir, envCounts+"="+counts.Name())
	if k.At.Point != 0 {
		cmd.Env = append(cmd.Env, envKillAt+"="+formatAt(k.At))
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	// killer kills the child after d and reports whether it did; stop
	// cancels it, or waits until it has done its work.
	killer := func(d time.Duration, killed *atomic.Bool) (stop func()) {
		done := make(chan struct{})
		t := time.AfterFunc(d, func() {
			defer close(done)
			killed.Store(cmd.Process.Kill() == nil)
		})
		return func() {
			if !t.Stop() {
				<-done
			}
		}
	}
	var timedOut, parentKilled atomic.Bool
	var stopKill func() // set once, by the watch, when the pipeline started
	var stderr bytes.Buffer
	out := &lineWatch{onLine: func(w *lineWatch, line string) {
		switch {
		case line == startedLine && w.started.IsZero():
			w.started = time.Now()
			if k.After > 0 {
				stopKill = killer(k.After, &parentKilled)
			}
		case line == finishedLine:
			w.finished = time.Now()
		case strings.HasPrefix(line, killingLine):
			w.selfKilled = true
		}
	}}
	// The output is read as it comes, lines of any length; a process the
	// pipeline started that keeps the output open after the child exited
	// (a server) is not waited for longer than WaitDelay.
	cmd.Stdout, cmd.Stderr = out, &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return Outcome{Err: fmt.Errorf("runstatetest: start child: %w", err)}
	}
	stopTimeout := killer(timeout, &timedOut)
	werr := cmd.Wait()
	if errors.Is(werr, exec.ErrWaitDelay) {
		werr = nil // it exited 0; a process of its own kept the output open
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if stopKill != nil {
		stopKill()
	}
	stopTimeout()
	started, finished, selfKilled := out.started, out.finished, out.selfKilled
	o := Outcome{Output: out.buf.String() + stderr.String()}
	if !finished.IsZero() {
		o.Elapsed = finished.Sub(started)
	} else if !started.IsZero() {
		o.Elapsed = time.Since(started)
	}
	switch {
	case werr == nil && started.IsZero():
		o.Err = errors.New("runstatetest: the child never ran the pipeline: call runstatetest.Main from TestMain")
	case !finished.IsZero() && (werr == nil || parentKilled.Load()):
		// A kill that came after the pipeline returned: it finished.
		o.Finished = true
		o.Crossings = map[Point]int{}
		data, err := os.ReadFile(counts.Name())
		m := map[string]int{}
		if err == nil {
			err = json.Unmarshal(data, &m)
		}
		if err != nil {
			o.Err = fmt.Errorf("runstatetest: crossing counts: %v", err)
		}
		for name, n := range m {
			if p, err := ParsePoint(name); err == nil {
				o.Crossings[p] = n
			}
		}
	case timedOut.Load():
		o.Err = fmt.Errorf("runstatetest: child %s timed out after %s; output:\n%s", c.Pipeline, timeout, o.Output)
	case selfKilled || parentKilled.Load():
		o.Killed = true
	default:
		o.Err = fmt.Errorf("runstatetest: child %s failed: %v; output:\n%s", c.Pipeline, werr, o.Output)
	}
	return o
}

// Result counts what RunKilled or Storm did.
type Result struct {
	Runs     int // child processes started
	Kills    int // of them, killed before they finished
	Finished int // of them, finished

	Last Outcome // the last process that finished (its Crossings)
}

// RunKilled runs the child once with each kill in turn (a child that
// finishes before its kill counts as finished, not killed), then without a
// kill, restarting it until it finishes. A child that fails otherwise, or
// does not finish within MaxRuns processes, fails the test. Safe to call
// from parallel tests, on different directories.
func RunKilled(t testing.TB, c Child, kills ...Kill) Result {
	t.Helper()
	var res Result
	max := c.MaxRuns
	if max <= 0 {
		max = 100
	}
	for i := 0; ; i++ {
		if res.Runs >= max {
			t.Fatalf("runstatetest: %s did not finish in %d processes", c.Pipeline, max)
		}
		var k Kill
		if i < len(kills) {
			k = kills[i]
		}
		o := c.Run(k)
		res.Runs++
		if o.Err != nil {
			t.Fatalf("runstatetest: %s (%s): %v", c.Pipeline, k, o.Err)
		}
		if o.Killed {
			res.Kills++
		}
		if o.Finished {
			res.Finished++
			res.Last = o
			if i >= len(kills)-1 {
				return res
			}
		}
	}
}

// Storm runs procs children at once on the same run directory, each
// restarted until it finishes. Before each start next says how to kill
// that process (proc counts from 0, attempt from 0 for each proc); the
// zero Kill lets it finish. Failures are reported through t. Safe to call
// from parallel tests, on different directories; next is called from
// several goroutines at once.
func Storm(t testing.TB, c Child, procs int, next func(proc, attempt int) Kill) Result {
	t.Helper()
	max := c.MaxRuns
	if max <= 0 {
		max = 100
	}
	var mu sync.Mutex
	var res Result
	var wg sync.WaitGroup
	for p := 0; p < procs; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := 0; ; a++ {
				if a >= max {
					t.Errorf("runstatetest: %s process %d did not finish in %d runs", c.Pipeline, p, max)
					return
				}
				k := next(p, a)
				o := c.Run(k)
				mu.Lock()
				res.Runs++
				if o.Killed {
					res.Kills++
				}
				if o.Finished {
					res.Finished++
					res.Last = o
				}
				mu.Unlock()
				if o.Err != nil {
					t.Errorf("runstatetest: %s process %d (%s): %v", c.Pipeline, p, k, o.Err)
					return
				}
				if o.Finished {
					return
				}
			}
		}()
	}
	wg.Wait()
	return res
}

// lineWatch is the child's standard output: it keeps every byte and calls
// onLine, under mu, for each line that is short enough to be one of the
// child's own (startedLine ...); a longer line is kept, not looked at.
type lineWatch struct {
	mu     sync.Mutex
	buf    strings.Builder
	line   []byte // the current line's start, up to maxWatched bytes
	long   bool   // the current line is longer than that
	onLine func(w *lineWatch, line string)

	started, finished time.Time
	selfKilled        bool
}

// maxWatched is more than the longest line onLine looks for.
const maxWatched = 256

func (w *lineWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	w.buf.Write(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		part := p
		if i >= 0 {
			part = p[:i]
		}
		if !w.long && len(w.line)+len(part) <= maxWatched {
			w.line = append(w.line, part...)
		} else {
			w.long = true
		}
		if i < 0 {
			break
		}
		if !w.long {
			w.onLine(w, string(w.line))
		}
		w.line, w.long = w.line[:0], false
		p = p[i+1:]
	}
	return n, nil
}
