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

	stages := []string{"inspect", "plan"}
	for i := range findings {
		stages = append(stages, fmt.Sprintf("execute/finding-%d", i+1))
	}
	stages = append(stages, "verify", "report")
	if err := r.Plan(ctx, stages...); err != nil {
		return err
	}

	work := func() error {
		select {
		case <-time.After(delay):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	steps := []struct {
		name   string
		inputs []runstate.Input
		fn     func(st *runstate.Stage) error
	}{
		{"inspect", []runstate.Input{runstate.File(input)}, func(st *runstate.Stage) error {
			return st.WriteFile("artifacts/inspect.txt", []byte(fmt.Sprintf("%d findings in %s\n", len(findings), input)))
		}},
		{"plan", []runstate.Input{runstate.After("inspect"), runstate.File(input)}, func(st *runstate.Stage) error {
			var b strings.Builder
			for i, f := range findings {
				fmt.Fprintf(&b, "%d. fix: %s\n", i+1, f)
			}
			return st.WriteFile("artifacts/plan.md", []byte(b.String()))
		}},
	}
	for i, f := range findings {
		f := f
		steps = append(steps, struct {
			name   string
			inputs []runstate.Input
			fn     func(st *runstate.Stage) error
		}{fmt.Sprintf("execute/finding-%d", i+1), []runstate.Input{runstate.After("plan"), runstate.Value("finding", f)}, func(st *runstate.Stage) error {
			sum := sha256.Sum256([]byte(f))
			return st.WriteFile(fmt.Sprintf("artifacts/patches/finding-%d.patch", i+1),
				[]byte(fmt.Sprintf("# patch for: %s\n# id %x\n", f, sum[:6])))
		}})
	}
	verifyInputs := []runstate.Input{}
	for i := range findings {
		verifyInputs = append(verifyInputs, runstate.After(fmt.Sprintf("execute/finding-%d", i+1)))
	}
	steps = append(steps, struct {
		name   string
		inputs []runstate.Input
		fn     func(st *runstate.Stage) error
	}{"verify", verifyInputs, func(st *runstate.Stage) error {
		return st.WriteFile("artifacts/verify.txt", []byte(fmt.Sprintf("%d patches checked: ok\n", len(findings))))
	}}, struct {
		name   string
		inputs []runstate.Input
		fn     func(st *runstate.Stage) error
	}{"report", []runstate.Input{runstate.After("verify")}, func(st *runstate.Stage) error {
		return st.WriteFile("artifacts/report.md", []byte(fmt.Sprintf("# billing parser triage\n%d findings, %d patches, verified.\n", len(findings), len(findings))))
	}})

	for _, s := range steps {
		st, err := r.Begin(ctx, s.name, s.inputs...)
		if errors.Is(err, runstate.ErrDone) {
			fmt.Printf("skip  %-22s already done, evidence holds\n", s.name)
			continue
		}
		if err != nil {
			return err
		}
		if st.Attempt() > 1 {
			fmt.Printf("redo  %-22s attempt %d: %s\n", s.name, st.Attempt(), why(r, s.name))
		} else {
			fmt.Printf("run   %s\n", s.name)
		}
		if err := work(); err != nil {
			fmt.Println("\ninterrupted: run the same command again to resume")
			return nil // the stage stays begun; the next session records it as interrupted
		}
		if err := s.fn(st); err != nil {
			return errors.Join(err, st.Fail(err))
		}
		if err := st.Complete(); err != nil {
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

// why says why a stage is running again, from the run's status.
func why(r *runstate.Run, name string) string {
	s, err := r.Status()
	if err != nil {
		return err.Error()
	}
	if st, ok := s.Stage(name); ok && st.Reason != "" {
		return st.Reason
	}
	return "the last attempt did not finish"
}
