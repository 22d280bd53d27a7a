// Command pipeline is a runnable multi-stage agent pipeline on runstate.
// Stop it with Ctrl-C or kill -9 at any moment and start it again: it
// resumes, printing each stage it skips and why, and ends with the same
// outputs as a run that was never interrupted.
//
//	go run ./examples/pipeline            # run (or resume) the pipeline
//	go run ./examples/pipeline -fresh     # start over
//
// Edit examples/pipeline/input/notes.txt between runs to watch the stages
// that depend on it redo themselves and the others stay done.
package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/runstate/runstate"
)

func main() {
	dir := flag.String("dir", filepath.Join(os.TempDir(), "runstate-example-pipeline"), "run directory")
	input := flag.String("input", "examples/pipeline/input/notes.txt", "the findings file the pipeline works from")
	delay := flag.Duration("delay", 700*time.Millisecond, "how long each stage works (time to press Ctrl-C or kill -9)")
	fresh := flag.Bool("fresh", false, "remove the run directory first")
	flag.Parse()
	if err := run(*dir, *input, *delay, *fresh); err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(1)
	}
}

// stage is one step of the pipeline: the evidence it starts from, the
// file it writes, and the stages it discovers (the plan stage's).
type stage struct {
	name   string
	inputs []runstate.Input
	output string
	data   string
	plan   []string
}

// pipeline lists the stages for these findings: inspect, plan, one
// execute stage per finding (which plan discovers), verify, report.
func pipeline(input string, findings []string) []stage {
	var execute []stage
	var names []string
	for i, f := range findings {
		name := fmt.Sprintf("execute/finding-%d", i+1)
		sum := sha256.Sum256([]byte(f))
		names = append(names, name)
		execute = append(execute, stage{
			name:   name,
			inputs: []runstate.Input{runstate.After("plan"), runstate.Value("finding", f)},
			output: fmt.Sprintf("artifacts/patches/finding-%d.patch", i+1),
			data:   fmt.Sprintf("# patch for: %s\n# id %x\n", f, sum[:6]),
		})
	}
	var plan strings.Builder
	for i, f := range findings {
		fmt.Fprintf(&plan, "%d. fix: %s\n", i+1, f)
	}
	var verified []runstate.Input
	for _, name := range names {
		verified = append(verified, runstate.After(name))
	}

	stages := []stage{{
		name:   "inspect",
		inputs: []runstate.Input{runstate.File(input)},
		output: "artifacts/inspect.txt",
		data:   fmt.Sprintf("%d findings in %s\n", len(findings), input),
	}, {
		name:   "plan",
		inputs: []runstate.Input{runstate.After("inspect"), runstate.File(input)},
		output: "artifacts/plan.md",
		data:   plan.String(),
		plan:   names,
	}}
	stages = append(stages, execute...)
	return append(stages, stage{
		name:   "verify",
		inputs: verified,
		output: "artifacts/verify.txt",
		data:   fmt.Sprintf("%d patches checked: ok\n", len(findings)),
	}, stage{
		name:   "report",
		inputs: []runstate.Input{runstate.After("verify")},
		output: "artifacts/report.md",
		data:   fmt.Sprintf("# billing parser triage\n%d findings, %d patches, verified.\n", len(findings), len(findings)),
	})
}

func run(dir, input string, delay time.Duration, fresh bool) error {
	if fresh {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	r, err := runstate.Open(dir, &runstate.Options{
		Request:  "triage the billing parser findings",
		Revision: "example",
		OnRecord: progress,
	})
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Printf("run %s in %s (session %s)\n", r.ID(), dir, r.Session())

	notes, err := os.ReadFile(input)
	if err != nil {
		return fmt.Errorf("read the input (run from the repository root, or pass -input): %w", err)
	}
	findings := strings.Split(strings.TrimSpace(string(notes)), "\n")

	// The run's own plan; the plan stage adds the execute stages it finds.
	if err := r.Plan(ctx, "inspect", "plan", "verify", "report"); err != nil {
		return err
	}
	for _, s := range pipeline(input, findings) {
		err := step(ctx, r, s, delay)
		if errors.Is(err, context.Canceled) {
			fmt.Println("\ninterrupted: run the same command again to resume")
			return nil
		}
		if err != nil {
			return err
		}
	}
	next, err := r.NextSteps()
	if err != nil {
		return err
	}
	fmt.Printf("\n%s", next)
	return nil
}

// step runs one stage unless it is done and its evidence holds. It uses
// Begin and Complete rather than Do: an interrupted stage (Ctrl-C) is left
// begun, so the next session records it as interrupted and runs it again,
// instead of counting a failure against its retries.
func step(ctx context.Context, r *runstate.Run, s stage, delay time.Duration) error {
	st, err := r.Begin(ctx, s.name, s.inputs...)
	if errors.Is(err, runstate.ErrDone) {
		return nil
	}
	if err != nil {
		return err
	}
	select {
	case <-time.After(delay): // the work
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.plan != nil {
		if err := st.Plan(s.plan...); err != nil {
			return errors.Join(err, st.Fail(err))
		}
	}
	if err := st.WriteFile(s.output, []byte(s.data)); err != nil {
		return errors.Join(err, st.Fail(err))
	}
	return st.Complete()
}

// progress prints what the run does, from the records it writes and the
// notices of stages found done.
func progress(rec runstate.Record) {
	switch {
	case rec.Ev == "skip" && rec.Seq == 0:
		fmt.Printf("skip  %-22s already %s\n", rec.Stage, rec.Reason)
	case rec.Ev == "begin" && rec.Attempt == 1:
		fmt.Printf("run   %s\n", rec.Stage)
	case rec.Ev == "begin":
		fmt.Printf("redo  %-22s attempt %d: %s\n", rec.Stage, rec.Attempt, rec.Reason)
	}
}
