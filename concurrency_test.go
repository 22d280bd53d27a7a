package runstate_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/flock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// Child processes: a test re-runs the test binary with -test.run naming
// itself and childEnv set, and the test function, seeing childEnv, plays
// the child's part instead (cmd/go lockedfile's TestSpuriousEDEADLK).

const (
	childEnv    = "RUNSTATE_TEST_CHILD" // the child's role
	childDirEnv = "RUNSTATE_TEST_DIR"   // the directory it works in
	childArgEnv = "RUNSTATE_TEST_ARG"   // a role-specific argument
)

// childRole returns the role this process plays for the running test, or
// "" in the parent.
func childRole() string { return os.Getenv(childEnv) }

// childCommand returns a command that runs the test binary as a child
// playing role in the top-level test t.
func childCommand(t *testing.T, role, dir, arg string) *exec.Cmd {
	t.Helper()
	name := t.Name()
	if i := strings.IndexByte(name, '/'); i >= 0 {
		name = name[:i]
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), childEnv+"="+role, childDirEnv+"="+dir, childArgEnv+"="+arg,
		// Under -race a process sleeps a second at exit by default.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}

// childOutput parses the "key value" lines a child printed with report.
func childOutput(out []byte) map[string][]string {
	m := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && strings.HasPrefix(k, "@") {
			m[k[1:]] = append(m[k[1:]], v)
		}
	}
	return m
}

// report prints a line the parent reads with childOutput.
func report(key string, v any) { fmt.Printf("@%s %v\n", key, v) }

// childFail ends a child with a message the parent shows.
func childFail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "child %s: %s\n", childRole(), fmt.Sprintf(format, args...))
	os.Exit(3)
}

// waitFile polls until p exists.
func waitFile(p string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(p); err == nil {
			return true
		}
		time.Sleep(200 * time.Microsecond)
	}
	return false
}

// TestConcurrentOpenCreatesOneRun starts processes that Open the same new
// directory at the same moment, several rounds: each round, exactly one of
// them creates the run and the others resume it.
func TestConcurrentOpenCreatesOneRun(t *testing.T) {
	const procs, rounds = 4, 5
	if childRole() == "opener" {
		base, n := os.Getenv(childDirEnv), os.Getenv(childArgEnv)
		if err := os.WriteFile(filepath.Join(base, "ready-"+n), nil, 0o644); err != nil {
			childFail("%v", err)
		}
		for i := 0; i < rounds; i++ {
			if !waitFile(filepath.Join(base, fmt.Sprintf("go-%d", i)), time.Minute) {
				childFail("no go for round %d", i)
			}
			r, err := runstate.Open(filepath.Join(base, fmt.Sprintf("run-%d", i), "nested"), &runstate.Options{Request: testRequest, NoSync: true})
			if err != nil {
				childFail("round %d: %v", i, err)
			}
			report(fmt.Sprintf("id-%d", i), r.ID())
			if err := r.Close(); err != nil {
				childFail("round %d: close: %v", i, err)
			}
			if err := os.WriteFile(filepath.Join(base, fmt.Sprintf("done-%d-%s", i, n)), nil, 0o644); err != nil {
				childFail("%v", err)
			}
		}
		return
	}

	base := t.TempDir()
	wg, outs, errs := startChildren(t, "opener", base, procs)
rounds:
	for i := 0; i < rounds; i++ {
		for p := 0; p < procs; p++ {
			name := "ready-" + strconv.Itoa(p)
			if i > 0 {
				name = fmt.Sprintf("done-%d-%d", i-1, p)
			}
			if !waitFile(filepath.Join(base, name), time.Minute) {
				break rounds // a child died; its error is reported below
			}
		}
		require.NoError(t, os.WriteFile(filepath.Join(base, fmt.Sprintf("go-%d", i)), nil, 0o644))
	}
	wg.Wait()
	for p := 0; p < procs; p++ {
		require.NoError(t, errs[p], "child %d", p)
	}
	for i := 0; i < rounds; i++ {
		dir := filepath.Join(base, fmt.Sprintf("run-%d", i), "nested")
		lines := checkLedger(t, dir)
		assert.Len(t, events(lines, "create", ""), 1, "round %d: exactly one create", i)
		assert.Len(t, events(lines, "open", ""), procs, "round %d", i)
		assert.Len(t, events(lines, "close", ""), procs, "round %d", i)
		st, err := runstate.Inspect(dir)
		require.NoError(t, err)
		for p := 0; p < procs; p++ {
			ids := childOutput(outs[p])[fmt.Sprintf("id-%d", i)]
			require.Len(t, ids, 1, "child %d round %d", p, i)
			assert.Equal(t, st.ID, ids[0], "child %d round %d: every process is on the same run", p, i)
		}
		assert.Equal(t, procs, st.Metrics.Sessions)
		assert.Equal(t, procs-1, st.Metrics.ResumedSessions)
	}
}

// TestConcurrentProcesses runs 4 processes on one run, each doing the same
// 200 stages and, between them, 50 of its own, while this process reads
// the run with Inspect. Every stage is done exactly once, the ledger is
// gapless with no torn line, and Verify finds nothing wrong.
func TestConcurrentProcesses(t *testing.T) {
	// Every append rewrites logs/next-steps.txt under the lock, so
	// processes that all append at once run at the file system's pace:
	// the stages of their own are fewer to keep the test short.
	const procs, stages, own = 4, 200, 50
	if childRole() == "worker" {
		dir, me := os.Getenv(childDirEnv), os.Getenv(childArgEnv)
		r, err := runstate.Open(dir, &runstate.Options{Request: testRequest, NoSync: true})
		if err != nil {
			childFail("%v", err)
		}
		ctx := context.Background()
		ran, busy := 0, 0
		do := func(name string) {
			err := r.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
				ran++
				report("ran", name)
				return st.WriteFile("artifacts/"+name+".txt", []byte(name))
			})
			switch {
			case errors.Is(err, runstate.ErrBusy):
				busy++ // another process has it
			case err != nil:
				childFail("%s: %v", name, err)
			}
		}
		for i := 0; i < stages; i++ {
			do(fmt.Sprintf("shared-%03d", i))
			if i < own {
				do(fmt.Sprintf("own-%s-%03d", me, i))
			}
		}
		if err := r.Close(); err != nil {
			childFail("close: %v", err)
		}
		report("busy", busy)
		return
	}

	dir := t.TempDir()
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	require.NoError(t, r.Close())

	wg, outs, errs := startChildren(t, "worker", dir, procs)

	// Read the run while the workers write it: Inspect never fails (a
	// torn tail mid-write is ignored) and never goes back.
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() { wg.Wait(); close(stop) }()
	var inspects atomic.Int64
	var inspectErr error
	var lastSeq int64
	go func() {
		defer close(done)
		for {
			st, err := runstate.Inspect(dir)
			if err != nil {
				inspectErr = err
				return
			}
			if st.Seq < lastSeq {
				inspectErr = fmt.Errorf("Inspect went back from seq %d to %d", lastSeq, st.Seq)
				return
			}
			lastSeq = st.Seq
			inspects.Add(1)
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	<-done
	wg.Wait()
	require.NoError(t, inspectErr)
	t.Logf("%d Inspect calls while the workers ran", inspects.Load())

	runs := map[string]int{}
	busy := 0
	for p := 0; p < procs; p++ {
		require.NoError(t, errs[p], "child %d", p)
		out := childOutput(outs[p])
		for _, name := range out["ran"] {
			runs[name]++
		}
		n, _ := strconv.Atoi(out["busy"][0])
		busy += n
	}
	t.Logf("ErrBusy seen %d times", busy)
	assert.Equal(t, stages+procs*own, len(runs), "every stage ran")
	for name, n := range runs {
		assert.Equal(t, 1, n, "%s ran %d times", name, n)
	}

	lines := checkLedger(t, dir) // gapless, chained, no torn line
	completes := map[string]int{}
	begins := map[string]int{}
	for _, l := range lines {
		switch l.rec.Ev {
		case "complete":
			completes[l.rec.Stage]++
		case "begin":
			begins[l.rec.Stage]++
		}
	}
	assert.Equal(t, stages+procs*own, len(completes))
	for name, n := range completes {
		assert.Equal(t, 1, n, "%s: complete records", name)
		assert.Equal(t, 1, begins[name], "%s: begin records", name)
	}
	assertVerifies(t, dir)
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, 0, st.Metrics.DuplicatedWork)
	assert.Empty(t, st.Sessions, "every session closed")
}

// TestConcurrentGoroutinesDistinctStages: 8 goroutines of one process Do
// their own stages on one Run.
func TestConcurrentGoroutinesDistinctStages(t *testing.T) {
	const workers, each = 8, 25
	ctx := context.Background()
	r, dir := newTestRun(t)
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				name := fmt.Sprintf("g%d-%02d", w, i)
				errs <- r.Do(ctx, name, writeStage("artifacts/"+name, name), runstate.Value("i", i))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, r.Close())
	lines := checkLedger(t, dir)
	completes := map[string]int{}
	for _, c := range events(lines, "complete", "") {
		completes[c.Stage]++
	}
	assert.Len(t, completes, workers*each)
	for name, n := range completes {
		assert.Equal(t, 1, n, name)
	}
	assertVerifies(t, dir)
}

// TestConcurrentGoroutinesSameStage: while one goroutine runs a stage, the
// same stage from another goroutine is busy; once it is done, it is done.
func TestConcurrentGoroutinesSameStage(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)

	started := make(chan struct{})
	release := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- r.Do(ctx, "s", func(_ context.Context, st *runstate.Stage) error {
			close(started)
			<-release
			return st.WriteFile("artifacts/s", []byte("s"))
		})
	}()
	<-started
	called := false
	err := r.Do(ctx, "s", func(context.Context, *runstate.Stage) error { called = true; return nil })
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), "this session")
	assert.False(t, called)
	_, err = r.Begin(ctx, "s")
	require.ErrorIs(t, err, runstate.ErrBusy)
	close(release)
	require.NoError(t, <-first)
	require.NoError(t, r.Do(ctx, "s", func(context.Context, *runstate.Stage) error { called = true; return nil }))
	assert.False(t, called, "done: not run again")

	// Many goroutines at once, no barrier: one runs it, the others get
	// ErrBusy or find it done.
	var ran atomic.Int32
	var wg sync.WaitGroup
	results := make(chan error, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- r.Do(ctx, "race", func(_ context.Context, st *runstate.Stage) error {
				ran.Add(1)
				time.Sleep(5 * time.Millisecond)
				return st.WriteFile("artifacts/race", []byte("race"))
			})
		}()
	}
	wg.Wait()
	close(results)
	for err := range results {
		if err != nil {
			assert.ErrorIs(t, err, runstate.ErrBusy)
		}
	}
	assert.Equal(t, int32(1), ran.Load())
	lines := checkLedger(t, dir)
	assert.Len(t, events(lines, "complete", "race"), 1)
	assert.Len(t, events(lines, "begin", "race"), 1)
}

// TestTwoRunsOneProcess: two Runs on one directory in one process exclude
// each other like two processes do.
func TestTwoRunsOneProcess(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := openRun(t, dir, testOptions())
	b := openRun(t, dir, testOptions())
	st, err := a.Begin(ctx, "s")
	require.NoError(t, err)
	_, err = b.Begin(ctx, "s")
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), a.Session())
	require.NoError(t, st.Complete())
	_, err = b.Begin(ctx, "s")
	require.ErrorIs(t, err, runstate.ErrDone)
	require.NoError(t, b.Do(ctx, "t", writeStage("artifacts/t", "t")))
	require.NoError(t, a.Refresh(ctx))
	s, err := a.Status()
	require.NoError(t, err)
	ts, _ := s.Stage("t")
	assert.Equal(t, runstate.StateComplete, ts.State, "Refresh reads the other session's records")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	checkLedger(t, dir)
}

// TestInspectReadOnly: Inspect, ReadLedger and Verify answer while another
// holder has the writers' lock, and write nothing — not even where a
// writer would (a torn tail to cut, projections behind the ledger, a dead
// session's lock and temp file to remove).
func TestInspectReadOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Plan(ctx, "a", "b"))
	require.NoError(t, r.Do(ctx, "a", writeStage("artifacts/a", "a")))
	require.NoError(t, r.Close())
	// Leave everything a writer would fix.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "next-steps.txt"), []byte("stale"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "manifest.json"), []byte("{"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "sessions", "01890a5d-ac96-774b-bcce-b30209900009.lock"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "tmp", "01890a5d-ac96-774b-bcce-b30209900009-00ff"), []byte("x"), 0o644))
	f, err := os.OpenFile(ledgerPath(dir), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"seq":99,"at":"2025`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	before := fileStates(t, dir)

	lock := flock.New(filepath.Join(dir, "logs", "ledger.lock"))
	require.NoError(t, lock.Lock())
	defer lock.Unlock()

	done := make(chan error, 1)
	go func() {
		st, err := runstate.Inspect(dir)
		if err != nil {
			done <- err
			return
		}
		if a, _ := st.Stage("a"); a.State != runstate.StateComplete || st.Torn != 20 || st.Next != "b" {
			done <- fmt.Errorf("Inspect: stage a %s, torn %d, next %q", a.State, st.Torn, st.Next)
			return
		}
		if err := runstate.ReadLedger(dir, func(*runstate.Record) error { return nil }); err != nil {
			done <- err
			return
		}
		rep, err := runstate.Verify(dir)
		if err == nil && rep.OK() {
			err = errors.New("Verify found nothing wrong")
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a reader waits for the writers' lock")
	}
	assert.Equal(t, before, fileStates(t, dir), "readers changed the run")
}

// startChildren starts procs children running role on dir, each given its
// index; wg is done when all have exited, with their stdout in outs and an
// error that quotes their stderr in errs.
func startChildren(t *testing.T, role, dir string, procs int) (wg *sync.WaitGroup, outs [][]byte, errs []error) {
	t.Helper()
	wg = new(sync.WaitGroup)
	outs = make([][]byte, procs)
	errs = make([]error, procs)
	for p := 0; p < procs; p++ {
		cmd := childCommand(t, role, dir, strconv.Itoa(p))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		wg.Go(func() {
			outs[p], errs[p] = cmd.Output()
			if errs[p] != nil {
				errs[p] = fmt.Errorf("%w: %s", errs[p], stderr.String())
			}
		})
	}
	return wg, outs, errs
}
