package runstatetest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

// summarize is the pipeline of the examples: two stages, each writing one
// artifact. A real pipeline would call a model, run tests, open a pull
// request; what matters is that it is deterministic and can be called
// again on a resumed run.
func summarize(ctx context.Context, run *runstate.Run) error {
	if err := run.Plan(ctx, "fetch", "summarize"); err != nil {
		return err
	}
	err := run.Do(ctx, "fetch", func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/logs.txt", []byte("12 errors, 3 warnings\n"))
	})
	if err != nil {
		return err
	}
	return run.Do(ctx, "summarize", func(_ context.Context, st *runstate.Stage) error {
		logs, err := os.ReadFile(filepath.Join(run.Dir(), "artifacts", "logs.txt"))
		if err != nil {
			return err
		}
		return st.WriteFile("artifacts/summary.md", append([]byte("# Summary\n\n"), logs...))
	}, runstate.After("fetch"))
}

// A session that dies right after a checkpoint, before the handoff files
// are written: the next session resumes without redoing the stage.
func ExampleCrashAt() {
	dir, _ := os.MkdirTemp("", "runstatetest-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	opts := &runstate.Options{Request: "summarize the logs"}

	run, _ := runstate.Open(dir, opts)
	runstatetest.CrashAt(run, runstatetest.At{Point: runstatetest.AfterComplete, Name: "fetch"})
	err := summarize(ctx, run)
	fmt.Println("first session crashed:", errors.Is(err, runstatetest.ErrCrashed))

	run, _ = runstate.Open(dir, opts) // the next session
	st, _ := run.Status()
	fetch, _ := st.Stage("fetch")
	fmt.Println("fetch is", fetch.State)
	err = summarize(ctx, run)
	run.Close()
	fmt.Println("second session:", err)

	f, _ := runstatetest.Examine(dir, "")
	fmt.Println("stages redone:", len(f.Redone), "- all checks pass:", f.OK())
	// Output:
	// first session crashed: true
	// fetch is complete
	// second session: <nil>
	// stages redone: 0 - all checks pass: true
}

// A session killed in the middle of a stage: its lock is gone, so the next
// session records the stage as interrupted and runs it again.
func ExampleCrash() {
	dir, _ := os.MkdirTemp("", "runstatetest-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	opts := &runstate.Options{Request: "summarize the logs"}

	run, _ := runstate.Open(dir, opts)
	_, _ = run.Begin(ctx, "fetch")
	runstatetest.Crash(run) // as if the process had been killed here

	run, _ = runstate.Open(dir, opts)
	st, _ := run.Status()
	fetch, _ := st.Stage("fetch")
	fmt.Println("fetch is", fetch.State)
	fmt.Println(summarize(ctx, run), run.Close())
	// Output:
	// fetch is interrupted
	// <nil> <nil>
}

// Register the pipelines that child processes run in an init function (or
// in TestMain before Main), so that the child, the same test binary, has
// them too.
func init() {
	runstatetest.Register("summarize", func(ctx context.Context, dir string) error {
		run, err := runstate.Open(dir, &runstate.Options{Request: "summarize the logs"})
		if err != nil {
			return err
		}
		if err := summarize(ctx, run); err != nil {
			run.Close()
			return err
		}
		return run.Close()
	})
}

// The test binary runs the pipeline in a child process and kills it with
// SIGKILL after the summarize stage began; the next child resumes it.
// TestMain must call runstatetest.Main. (In a test, RunKilled does this
// loop and reports failures through t.)
func ExampleChild_Run() {
	dir, _ := os.MkdirTemp("", "runstatetest-example")
	defer os.RemoveAll(dir)
	c := runstatetest.Child{Pipeline: "summarize", Dir: dir}
	o := c.Run(runstatetest.Kill{At: runstatetest.At{Point: runstatetest.AfterBegin, Name: "summarize"}})
	fmt.Println("first child killed:", o.Killed)
	o = c.Run(runstatetest.Kill{})
	fmt.Println("second child finished:", o.Finished)
	f, _ := runstatetest.Examine(dir, "")
	fmt.Println("interrupted:", f.Metrics.Interrupted, "- all checks pass:", f.OK())
	// Output:
	// first child killed: true
	// second child finished: true
	// interrupted: 1 - all checks pass: true
}

// How to test a pipeline's resumption in a few lines: crash it at every
// crossing of every crash point, resume it, and compare each result with
// an uninterrupted run, byte for byte.
func TestExampleCrashEverywhere(t *testing.T) {
	runstatetest.CheckLeaks(t)
	sum := runstatetest.CrashEverywhere(t, &runstate.Options{Request: "summarize the logs"}, summarize)
	if sum.Crashes == 0 || sum.Resumed != sum.Crashes {
		t.Errorf("%d crashes, %d resumed correctly", sum.Crashes, sum.Resumed)
	}
}

// How to test it with real processes: kill a child at every crossing of
// every crash point (counted in an uninterrupted child), resume it, check.
func TestExampleKillEverywhere(t *testing.T) {
	ref := t.TempDir()
	o := runstatetest.Child{Pipeline: "summarize", Dir: ref}.Run(runstatetest.Kill{})
	if !o.Finished {
		t.Fatalf("the uninterrupted child: %v", o.Err)
	}
	kills := 0
	for _, p := range runstatetest.Points {
		for i := 0; i < o.Crossings[p]; i++ {
			dir := t.TempDir()
			res := runstatetest.RunKilled(t, runstatetest.Child{Pipeline: "summarize", Dir: dir},
				runstatetest.Kill{At: runstatetest.At{Point: p, Skip: i}})
			kills += res.Kills
			runstatetest.CheckResumed(t, dir, ref)
		}
	}
	if kills == 0 {
		t.Error("no child was killed")
	}
}
