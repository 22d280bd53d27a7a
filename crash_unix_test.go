//go:build unix

package runstate_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

const crashRequest = "crash test: a pipeline killed at random moments"

var crashStages = []string{"fetch", "parse", "index", "optional", "plan", "execute-1", "execute-2", "execute-3", "verify", "report"}

// crashPipeline is the pipeline the crash test kills: each stage reads the
// previous stage's output (a File input, and After), works a little, and
// writes its output atomically with WriteFile or by hand with Output.
func crashPipeline(dir, src string) error {
	ctx := context.Background()
	r, err := runstate.Open(dir, &runstate.Options{Request: crashRequest, Revision: "r1"})
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Plan(ctx, crashStages...); err != nil {
		return err
	}
	prev, prevStage := src, ""
	for i, name := range crashStages {
		if name == "optional" {
			if err := r.Skip(ctx, name, "not needed for this input"); err != nil {
				return err
			}
			continue
		}
		inputs := []runstate.Input{runstate.File(prev), runstate.Value("stage", i)}
		if prevStage != "" {
			inputs = append(inputs, runstate.After(prevStage))
		}
		out := "artifacts/" + name + ".out"
		err := r.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
			report("step", name) // the parent times some kills by these
			in, err := os.ReadFile(prev)
			if err != nil {
				return err
			}
			data := transform(in, name)
			time.Sleep(3 * time.Millisecond) // work
			if i%3 == 1 {
				// Written by other means, not atomically: a kill may
				// leave half of it, and the next attempt rewrites it.
				p := filepath.Join(dir, filepath.FromSlash(out))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(p, data, 0o644); err != nil {
					return err
				}
				return st.Output(out)
			}
			if err := st.WriteFile(out, data); err != nil {
				return err
			}
			return st.WriteFile("artifacts/sums/"+name+".sum", []byte(fmt.Sprintf("%x\n", sha256.Sum256(data))))
		}, inputs...)
		if err != nil {
			return fmt.Errorf("stage %s: %w", name, err)
		}
		prev, prevStage = filepath.Join(dir, filepath.FromSlash(out)), name
	}
	return r.Close()
}

// transform derives a stage's output from its input: deterministic, a few
// tens of KiB.
func transform(in []byte, name string) []byte {
	var buf bytes.Buffer
	h := sha256.Sum256(append([]byte(name), in...))
	for i := 0; i < 600; i++ {
		fmt.Fprintf(&buf, "%s %04d %x\n", name, i, h[:8])
		h = sha256.Sum256(h[:])
	}
	return buf.Bytes()
}

// TestCrashResume kills the pipeline with SIGKILL at random moments and
// starts it again until it completes. The outputs must be byte-equal to an
// uninterrupted run's, the ledger must verify, and no stage may be
// completed twice.
func TestCrashResume(t *testing.T) {
	if childRole() == "pipeline" {
		if err := crashPipeline(os.Getenv(childDirEnv), os.Getenv(childArgEnv)); err != nil {
			childFail("%v", err)
		}
		return
	}
	src := filepath.Join(t.TempDir(), "findings.txt")
	require.NoError(t, os.WriteFile(src, []byte("finding 1: the parser drops the last line\nfinding 2: totals overflow\n"), 0o644))

	// The reference: one uninterrupted run, in a child like the others.
	ref := t.TempDir()
	start := time.Now()
	out, err := childCommand(t, "pipeline", ref, src).CombinedOutput()
	require.NoError(t, err, "%s", out)
	full := time.Since(start)

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d; an uninterrupted run takes %v", seed, full)

	for trial := 0; trial < 3; trial++ {
		crashTrial(t, ref, src, full, rng)
	}
}

// startReporting starts a child playing role and streams the values of
// the "@key value" lines it prints (report) until it exits. Its standard
// error is gathered in the returned buffer.
func startReporting(t *testing.T, role, dir, arg, key string) (*exec.Cmd, *bytes.Buffer, <-chan string) {
	t.Helper()
	cmd := childCommand(t, role, dir, arg)
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	values := make(chan string, 256)
	go func() {
		defer close(values)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "@"+key+" "); ok {
				values <- v
			}
		}
	}()
	return cmd, stderr, values
}

// crashTrial runs the pipeline in a new directory, killing it until it
// completes, and compares the result with the reference run in ref.
func crashTrial(t *testing.T, ref, src string, full time.Duration, rng *rand.Rand) {
	dir := t.TempDir()
	kills, runs := 0, 0
	for ; ; runs++ {
		cmd, stderr, steps := startReporting(t, "pipeline", dir, src, "step")
		if kills < 10 {
			// Kill at a random time, or a random time after a random
			// number of stages began (to land inside the work, not just
			// in the process start).
			if rng.IntN(3) == 0 {
				time.Sleep(time.Duration(rng.Int64N(int64(full))))
			} else {
				for n := 1 + rng.IntN(4); n > 0; n-- {
					if _, ok := <-steps; !ok {
						break
					}
				}
				time.Sleep(time.Duration(rng.IntN(6000)) * time.Microsecond)
			}
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
		for range steps {
		}
		err := cmd.Wait()
		if err == nil {
			break
		}
		ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
		require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "run %d failed by itself: %v: %s", runs, err, stderr.String())
		kills++
	}
	runs++
	t.Logf("%d runs, %d killed", runs, kills)

	assert.Equal(t, readTree(t, filepath.Join(ref, "artifacts")), readTree(t, filepath.Join(dir, "artifacts")),
		"the outputs of the interrupted runs equal the uninterrupted run's")
	assertVerifies(t, dir)
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, 0, st.Metrics.DuplicatedWork)
	assert.Equal(t, len(crashStages), st.Done)
	lines := checkLedger(t, dir)
	closes := events(lines, "close", "")
	require.NotEmpty(t, closes, "the last run closed")
	for _, name := range crashStages {
		if name == "optional" {
			assert.Len(t, events(lines, "skip", name), 1)
			continue
		}
		assert.Len(t, events(lines, "complete", name), 1, "%s completed once", name)
	}
	assert.LessOrEqual(t, st.Metrics.Sessions, runs, "at most one session per run")
	for _, ss := range st.Sessions {
		assert.NotEqual(t, closes[len(closes)-1].Session, ss.ID, "the closed session is not listed")
	}
	assertNoTempFiles(t, dir)
	ents, err := os.ReadDir(filepath.Join(dir, "logs", "sessions"))
	require.NoError(t, err)
	assert.Empty(t, ents, "no session lock left behind")
}

// readTree reads every file under dir.
func readTree(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = fmt.Sprintf("%d bytes sha256:%x", len(data), sha256.Sum256(data))
		return err
	}))
	return out
}

// TestCrashInterruptedStage kills a process in the middle of a stage: the
// next session records the attempt as interrupted, removes the dead
// session's lock and temp files, and begins the stage again.
func TestCrashInterruptedStage(t *testing.T) {
	ctx := context.Background()
	if childRole() == "hang" {
		dir := os.Getenv(childDirEnv)
		r, err := runstate.Open(dir, testOptions())
		if err != nil {
			childFail("%v", err)
		}
		if _, err := r.Begin(ctx, "stuck", runstate.Value("v", 1)); err != nil {
			childFail("%v", err)
		}
		// A temp file as a write killed half-way leaves it.
		if err := os.WriteFile(filepath.Join(dir, "logs", "tmp", r.Session()+"-0123456789abcdef"), []byte("half"), 0o644); err != nil {
			childFail("%v", err)
		}
		report("begun", r.Session())
		time.Sleep(time.Minute)
		childFail("not killed")
	}
	dir := t.TempDir()
	cmd := childCommand(t, "hang", dir, "")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	session := ""
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "@begun "); ok {
			session = v
			break
		}
	}
	require.NotEmpty(t, session, "the child did not begin the stage")

	// While it lives, the stage is busy for everyone else.
	r := openRun(t, dir, testOptions())
	_, err = r.Begin(ctx, "stuck", runstate.Value("v", 1))
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), session)
	require.NoError(t, r.Close())

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	r = openRun(t, dir, testOptions())
	lines := checkLedger(t, dir)
	intr := events(lines, "interrupted", "stuck")
	require.Len(t, intr, 1, "Open records the dead session's attempt")
	assert.Contains(t, intr[0].Reason, session)
	assert.Equal(t, 1, intr[0].Attempt)
	assert.NoFileExists(t, filepath.Join(dir, "logs", "sessions", session+".lock"), "the dead session's lock is removed")
	assertNoTempFiles(t, dir)

	s, err := r.Status()
	require.NoError(t, err)
	ss, _ := s.Stage("stuck")
	assert.Equal(t, runstate.StateInterrupted, ss.State)
	assert.Equal(t, 1, s.Metrics.Interrupted)
	text, err := r.NextSteps()
	require.NoError(t, err)
	assert.Contains(t, text, "stuck")
	assert.Contains(t, text, "interrupted")

	st, err := r.Begin(ctx, "stuck", runstate.Value("v", 1))
	require.NoError(t, err)
	assert.Equal(t, 2, st.Attempt())
	require.NoError(t, st.Complete())
	s, err = r.Status()
	require.NoError(t, err)
	assert.Equal(t, 0, s.Metrics.DuplicatedWork)
}

// TestInspectWhileWriterStopped stops a writing process (SIGSTOP) at random
// moments — perhaps holding the ledger lock, perhaps mid-append — and reads
// the run with Inspect, ReadLedger and Verify: they must not wait for the
// lock, must not fail on a torn tail, and must not change a single file.
func TestInspectWhileWriterStopped(t *testing.T) {
	if childRole() == "writer" {
		dir := os.Getenv(childDirEnv)
		r, err := runstate.Open(dir, &runstate.Options{Request: testRequest, ManifestInterval: 5 * time.Millisecond})
		if err != nil {
			childFail("%v", err)
		}
		ctx := context.Background()
		report("open", r.Session())
		for i := 0; ; i++ {
			name := fmt.Sprintf("s%05d", i)
			big := bytes.Repeat([]byte(name), 1+i%300)
			if err := r.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
				return st.WriteFile("artifacts/"+name, big)
			}, runstate.Value("note", string(big[:min(len(big), 2000)]))); err != nil {
				childFail("%v", err)
			}
		}
	}
	dir := t.TempDir()
	cmd := childCommand(t, "writer", dir, "")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	sc := bufio.NewScanner(stdout)
	require.True(t, sc.Scan(), "the writer did not start: %s", stderr.String())

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var lastSeq int64
	torn := 0
	for i := 0; i < 25; i++ {
		time.Sleep(time.Duration(rng.IntN(8000)) * time.Microsecond)
		pid := cmd.Process.Pid
		require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil)
		require.NoError(t, err)
		require.True(t, ws.Stopped(), "the writer died: %s", stderr.String())

		before := fileStates(t, dir)
		done := make(chan error, 1)
		go func() {
			st, err := runstate.Inspect(dir)
			if err != nil {
				done <- err
				return
			}
			if st.Seq < lastSeq {
				done <- fmt.Errorf("seq went back from %d to %d", lastSeq, st.Seq)
				return
			}
			lastSeq = st.Seq
			if st.Torn > 0 {
				torn++
			}
			if err := runstate.ReadLedger(dir, func(*runstate.Record) error { return nil }); err != nil {
				done <- err
				return
			}
			_, err = runstate.Verify(dir)
			done <- err
		}()
		select {
		case err := <-done:
			require.NoError(t, err, "round %d", i)
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: Inspect blocks while the writer is stopped (does it take the lock?)", i)
		}
		assert.Equal(t, before, fileStates(t, dir), "round %d: readers changed the run", i)
		require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	}
	t.Logf("last seq %d; %d reads saw a torn tail", lastSeq, torn)
	assert.Greater(t, lastSeq, int64(2), "the writer made progress")
}

// groupCommitChild checkpoints from 8 goroutines at once, so that batches
// are group-committed and begins are written beside a running fsync, and
// reports each stage whose Do returned (acknowledged).
func groupCommitChild(dir string) error {
	ctx := context.Background()
	r, err := runstate.Open(dir, &runstate.Options{Request: crashRequest})
	if err != nil {
		return err
	}
	defer r.Close()
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 25 {
				name := fmt.Sprintf("g%d/s%02d", g, i)
				err := r.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
					return st.WriteFile("artifacts/"+name+".txt", []byte("output of "+name+"\n"))
				})
				if err != nil {
					errs <- fmt.Errorf("%s: %w", name, err)
					return
				}
				report("ack", name)
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			return err
		}
	}
	return r.Close()
}

// TestCrashGroupCommit kills, with SIGKILL at random moments, a process
// that checkpoints from 8 goroutines, then resumes it until it finishes.
// After every kill the ledger is sound (a torn last line at most) and
// holds a complete record for every stage whose Do had returned; at the
// end every stage is complete exactly once, with its output, and Verify
// finds nothing wrong.
func TestCrashGroupCommit(t *testing.T) {
	if childRole() == "group" {
		if err := groupCommitChild(os.Getenv(childDirEnv)); err != nil {
			childFail("%v", err)
		}
		return
	}
	dir := t.TempDir()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	acked := map[string]bool{}
	lp := filepath.Join(dir, "logs", "ledger.jsonl")
	kills := 0
	for run := 0; ; run++ {
		require.Less(t, run, 100, "the child never finished")
		cmd, stderr, lines := startReporting(t, "group", dir, "", "ack")
		if kills < 12 {
			// Kill after a random number of acknowledgements (or at once),
			// a random moment later.
			for n := rng.IntN(40); n > 0; n-- {
				v, ok := <-lines
				if !ok {
					break
				}
				acked[v] = true
			}
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
		for v := range lines {
			acked[v] = true
		}
		err := cmd.Wait()
		if _, serr := os.Stat(lp); errors.Is(serr, fs.ErrNotExist) && err != nil {
			// Killed at once, before Open created the run: nothing can
			// have been acknowledged (a 1-in-40 draw of the first run).
			require.Empty(t, acked, "stages acknowledged without a ledger")
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "run %d failed by itself: %v: %s", run, err, stderr.String())
			kills++
			continue
		}

		complete := map[string]int{}
		require.NoError(t, runstate.ReadLedger(dir, func(rec *runstate.Record) error {
			if rec.Ev == "complete" {
				complete[rec.Stage]++
			}
			return nil
		}))
		for name := range acked {
			assert.Equal(t, 1, complete[name], "acknowledged stage %s is complete once in the ledger", name)
		}
		t.Logf("run %d: %d stages complete, %d acknowledged so far", run, len(complete), len(acked))
		rep, verr := runstate.Verify(dir)
		require.NoError(t, verr)
		for _, p := range rep.Problems {
			if p.File == lp {
				assert.Contains(t, p.What, "torn last line", "the ledger after a kill: %v", p)
			}
		}
		if err == nil {
			assert.Len(t, complete, 200, "every stage complete")
			for name, n := range complete {
				assert.Equal(t, 1, n, "%s completed once", name)
				data, rerr := os.ReadFile(filepath.Join(dir, "artifacts", filepath.FromSlash(name)+".txt"))
				require.NoError(t, rerr)
				assert.Equal(t, "output of "+name+"\n", string(data))
			}
			assert.True(t, rep.OK(), "%v", rep.Problems)
			break
		}
		ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
		require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "run %d failed by itself: %v: %s", run, err, stderr.String())
		kills++
	}
	t.Logf("%d kills, %d stages acknowledged before a kill or at the end", kills, len(acked))
}
