package runstate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/runstate/runstate"
)

// A pipeline that runs in two sessions: the second one skips what the first
// finished and redoes only the stage whose evidence changed.
func Example() {
	dir, _ := os.MkdirTemp("", "runstate-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	src := filepath.Join(dir, "parser.go") // the evidence the stages work from
	os.WriteFile(src, []byte("package parser\n"), 0o644)

	pipeline := func() {
		run, err := runstate.Open(dir, &runstate.Options{Request: "add tests for the billing parser"})
		if err != nil {
			fmt.Println(err)
			return
		}
		defer run.Close()
		run.Plan(ctx, "inspect", "plan")
		for _, stage := range []struct {
			name   string
			inputs []runstate.Input
		}{
			{"inspect", []runstate.Input{runstate.File(src)}},
			{"plan", []runstate.Input{runstate.After("inspect")}},
		} {
			ran := false
			err := run.Do(ctx, stage.name, func(ctx context.Context, st *runstate.Stage) error {
				ran = true
				body, _ := os.ReadFile(src)
				return st.WriteFile("artifacts/"+stage.name+".txt", body)
			}, stage.inputs...)
			fmt.Printf("%s: ran=%v err=%v\n", stage.name, ran, err)
		}
	}

	pipeline() // session 1 does the work
	pipeline() // session 2 finds it done
	os.WriteFile(src, []byte("package parser // changed\n"), 0o644)
	pipeline() // session 3 redoes inspect, and plan after it

	st, _ := runstate.Inspect(dir)
	inspect, _ := st.Stage("inspect")
	fmt.Println("inspect attempts:", inspect.Attempt)
	fmt.Println("sessions:", st.Metrics.Sessions, "duplicated work:", st.Metrics.DuplicatedWork)
	// Output:
	// inspect: ran=true err=<nil>
	// plan: ran=true err=<nil>
	// inspect: ran=false err=<nil>
	// plan: ran=false err=<nil>
	// inspect: ran=true err=<nil>
	// plan: ran=true err=<nil>
	// inspect attempts: 2
	// sessions: 3 duplicated work: 0
}

// Begin and Complete are the primitives under Do: Begin says ErrDone when
// there is nothing to do.
func ExampleRun_Begin() {
	dir, _ := os.MkdirTemp("", "runstate-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	run, _ := runstate.Open(dir, &runstate.Options{Request: "primitives"})
	defer run.Close()

	st, err := run.Begin(ctx, "execute", runstate.Value("model", "small"))
	fmt.Println("first begin:", err, "attempt", st.Attempt())
	st.WriteFile("artifacts/diff.patch", []byte("--- a\n+++ b\n"))
	fmt.Println("complete:", st.Complete())

	_, err = run.Begin(ctx, "execute", runstate.Value("model", "small"))
	fmt.Println("same evidence:", errors.Is(err, runstate.ErrDone))

	st, err = run.Begin(ctx, "execute", runstate.Value("model", "large"))
	fmt.Println("other evidence:", err, "attempt", st.Attempt())
	s, _ := run.Status()
	execute, _ := s.Stage("execute")
	fmt.Println("why:", execute.Reason)
	// Output:
	// first begin: <nil> attempt 1
	// complete: <nil>
	// same evidence: true
	// other evidence: <nil> attempt 2
	// why: input model changed
}

// An external side effect happens once: the second call returns the stored
// receipt without calling Do again.
func ExampleRun_Effect() {
	dir, _ := os.MkdirTemp("", "runstate-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	run, _ := runstate.Open(dir, &runstate.Options{Request: "file a ticket"})
	defer run.Close()

	sent := 0
	ticket := runstate.Effect{
		Request: map[string]string{"title": "billing parser rejects negative amounts"},
		Do: func(ctx context.Context, key string) (json.RawMessage, error) {
			sent++ // a real Do sends the request with Idempotency-Key: key
			return json.RawMessage(`{"ticket":"T-1"}`), nil
		},
	}
	for range 2 {
		receipt, err := run.Effect(ctx, "ticket:billing", ticket)
		fmt.Println(string(receipt), err)
	}
	fmt.Println("sent:", sent)
	// Output:
	// {"ticket":"T-1"} <nil>
	// {"ticket":"T-1"} <nil>
	// sent: 1
}

// A stage that needs a person stops the pipeline until someone approves it.
func ExampleRun_Approve() {
	dir, _ := os.MkdirTemp("", "runstate-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	run, _ := runstate.Open(dir, &runstate.Options{Request: "review"})
	defer run.Close()

	review := func(ctx context.Context, st *runstate.Stage) error {
		st.WriteFile("artifacts/review.md", []byte("diff looks right?\n"))
		return st.Await("read artifacts/review.md")
	}
	err := run.Do(ctx, "await-review", review)
	fmt.Println(errors.Is(err, runstate.ErrNeedsPerson))
	s, _ := run.Status()
	fmt.Println(s.Blockers[0].Kind, s.Blockers[0].Stage+":", s.Blockers[0].Reason)

	run.Approve(ctx, "await-review", "reviewer@example.com", "diff looks right")
	fmt.Println(run.Do(ctx, "await-review", review)) // done now: fn is not called
	// Output:
	// true
	// awaiting await-review: read artifacts/review.md
	// <nil>
}

// triage is the program in README.md (readme_test.go keeps the two the
// same): two stages and a side effect. Run it twice and the second run
// skips what the first finished; kill it at any moment and the next run
// redoes only what was interrupted, and notifies once.
func triage(ctx context.Context, dir string) error {
	run, err := runstate.Open(dir, &runstate.Options{Request: "triage the parser findings"})
	if err != nil {
		return err // a damaged run is refused, naming the file, line and offset
	}
	defer run.Close()
	if err := run.Plan(ctx, "inspect", "plan"); err != nil {
		return err
	}

	// Do skips a stage that is done and whose evidence (its inputs, and
	// its recorded outputs) still holds; otherwise it runs fn and records
	// the outputs fn wrote. When Do returns nil, that record is durable.
	err = run.Do(ctx, "inspect", func(ctx context.Context, st *runstate.Stage) error {
		fmt.Println("inspect: running")
		return st.WriteFile("artifacts/findings.txt", []byte("negative amounts\nrounding\n"))
	}, runstate.Value("parser", "v1"))
	if err != nil {
		return err
	}
	err = run.Do(ctx, "plan", func(ctx context.Context, st *runstate.Stage) error {
		fmt.Println("plan: running")
		findings, err := os.ReadFile(filepath.Join(dir, "artifacts/findings.txt"))
		if err != nil {
			return err
		}
		return st.WriteFile("artifacts/plan.md", append([]byte("# fix\n"), findings...))
	}, runstate.After("inspect")) // redone when inspect's output bytes change
	if err != nil {
		return err
	}
	// A side effect happens once, across sessions and crashes.
	_, err = run.Effect(ctx, "notify:plan", runstate.Effect{
		Do: func(ctx context.Context, key string) (json.RawMessage, error) {
			fmt.Println("notify: sending") // send it with Idempotency-Key: key
			return json.RawMessage(`{"sent":true}`), nil
		},
	})
	if err != nil {
		return err
	}
	fmt.Println("done: cat logs/next-steps.txt in", filepath.Base(dir))
	return nil
}

// The program in README.md, run three times: the second run skips every
// stage and sends nothing; after inspect's output is deleted, the third
// redoes inspect only: its output bytes come out the same, so plan, which
// depends on them through After, still holds.
func Example_readme() {
	parent, _ := os.MkdirTemp("", "runstate-example")
	defer os.RemoveAll(parent)
	dir := filepath.Join(parent, "triage-run")
	ctx := context.Background()

	fmt.Println(triage(ctx, dir))
	fmt.Println(triage(ctx, dir))
	os.Remove(filepath.Join(dir, "artifacts/findings.txt"))
	fmt.Println(triage(ctx, dir))
	// Output:
	// inspect: running
	// plan: running
	// notify: sending
	// done: cat logs/next-steps.txt in triage-run
	// <nil>
	// done: cat logs/next-steps.txt in triage-run
	// <nil>
	// inspect: running
	// done: cat logs/next-steps.txt in triage-run
	// <nil>
}

// OnRecord sees each record as it lands, and a notice for each stage that
// Begin finds done: enough to print what a run does and why.
func ExampleOptions_onRecord() {
	dir, _ := os.MkdirTemp("", "runstate-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	src := filepath.Join(dir, "checkout") // File paths are relative to it
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "parser.go"), []byte("package parser\n"), 0o644)

	progress := func(rec runstate.Record) {
		switch {
		case rec.Ev == "begin" && rec.Attempt == 1:
			fmt.Printf("run  %s (%s)\n", rec.Stage, rec.Reason)
		case rec.Ev == "begin":
			fmt.Printf("redo %s (%s)\n", rec.Stage, rec.Reason)
		case rec.Ev == "skip":
			fmt.Printf("skip %s (%s)\n", rec.Stage, rec.Reason)
		}
	}
	pipeline := func() {
		run, err := runstate.Open(filepath.Join(dir, "run"), &runstate.Options{
			Request:   "add tests for the billing parser",
			SourceDir: src,
			OnRecord:  progress,
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		defer run.Close()
		run.Do(ctx, "inspect", func(ctx context.Context, st *runstate.Stage) error {
			body, _ := os.ReadFile(filepath.Join(src, "parser.go"))
			return st.WriteFile("artifacts/inspect.txt", body)
		}, runstate.File("parser.go"))
		run.Do(ctx, "plan", func(ctx context.Context, st *runstate.Stage) error {
			body, _ := os.ReadFile(filepath.Join(dir, "run", "artifacts", "inspect.txt"))
			return st.WriteFile("artifacts/plan.md", body)
		}, runstate.After("inspect"))
	}

	pipeline()
	pipeline()
	os.WriteFile(filepath.Join(src, "parser.go"), []byte("package parser // changed\n"), 0o644)
	pipeline()
	// Output:
	// run  inspect (first attempt)
	// run  plan (first attempt)
	// skip inspect (done, evidence holds)
	// skip plan (done, evidence holds)
	// redo inspect (input parser.go changed)
	// redo plan (input after:inspect changed (stage inspect was redone with other results))
}

// A plan stage declares the stages it discovered; they are recorded with
// its completion, in the same write, and take their place in the plan.
func ExampleStage_Plan() {
	dir, _ := os.MkdirTemp("", "runstate-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	run, _ := runstate.Open(dir, &runstate.Options{Request: "fix the findings"})
	defer run.Close()

	run.Plan(ctx, "plan", "verify")
	run.Do(ctx, "plan", func(ctx context.Context, st *runstate.Stage) error {
		findings := []string{"execute/negative-amounts", "execute/rounding"} // what the plan found
		if err := st.Plan(findings...); err != nil {
			return err
		}
		return st.WriteFile("artifacts/plan.md", []byte("1. negative amounts\n2. rounding\n"))
	})
	s, _ := run.Status()
	fmt.Println("plan:", s.Plan)
	fmt.Println("next:", s.Next)
	// Output:
	// plan: [plan execute/negative-amounts execute/rounding verify]
	// next: execute/negative-amounts
}
