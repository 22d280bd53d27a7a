package runstatetest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

// Two sessions on one memory store, as two processes on one run: the
// first is killed in the middle of a stage, the next records it as
// interrupted and runs it again, and does not redo the stage before it.
// The ledger is in memory; the outputs are files in dir.
func ExampleNewMemStore() {
	dir, _ := os.MkdirTemp("", "memstore-example") // the sessions' outputs
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store := runstatetest.NewMemStore()
	opts := &runstate.Options{Request: "summarize the logs"}

	first, _ := store.Open(dir, opts)
	_ = first.Do(ctx, "fetch", func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/logs.txt", []byte("12 errors, 3 warnings\n"))
	})
	_, _ = first.Begin(ctx, "summarize", runstate.After("fetch"))
	runstatetest.Crash(first) // as if the process had been killed here

	next, _ := store.Open(dir, opts)
	fmt.Println(summarize(ctx, next)) // the pipeline of the other examples
	st, _ := next.Status()
	for _, name := range []string{"fetch", "summarize"} {
		s, _ := st.Stage(name)
		fmt.Println(name, s.State, "in attempt", s.Attempt)
	}
	_ = next.Close()
	entries, _ := os.ReadDir(filepath.Join(dir, "artifacts"))
	fmt.Println(len(entries), "artifacts;", len(store.Lines()), "ledger lines in memory")
	// Output:
	// <nil>
	// fetch complete in attempt 1
	// summarize complete in attempt 2
	// 2 artifacts; 11 ledger lines in memory
}

// A power loss: what a checkpoint made durable survives, a begin (which
// needs no fsync) may not, and the sessions die with it.
func ExampleMemStore_Crash() {
	dir, _ := os.MkdirTemp("", "memstore-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store := runstatetest.NewMemStore()
	opts := &runstate.Options{Request: "summarize the logs"}

	run, _ := store.Open(dir, opts)
	_ = run.Do(ctx, "fetch", func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/logs.txt", []byte("12 errors\n"))
	})
	_, _ = run.Begin(ctx, "summarize")
	fmt.Println("lines:", len(store.Lines()), "durable:", store.Durable())
	store.Crash()
	fmt.Println("after the power loss:", len(store.Lines()))
	fmt.Println("the old session appends:", run.Skip(ctx, "deploy", "no") == nil)
	_ = run.Close()

	run, _ = store.Open(dir, opts)
	st, _ := run.Status()
	fetch, _ := st.Stage("fetch")
	summ, _ := st.Stage("summarize")
	fmt.Println("fetch:", fetch.State, "- summarize:", summ.State == "")
	_ = run.Close()
	// Output:
	// lines: 5 durable: 4
	// after the power loss: 4
	// the old session appends: false
	// fetch: complete - summarize: true
}
