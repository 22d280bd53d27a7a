package runstate

import (
	"context"
	"os"
	"testing"
)

func TestSmoke(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	r, err := Open(dir, &Options{Request: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Plan(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	err = r.Do(ctx, "a", func(ctx context.Context, st *Stage) error {
		return st.WriteFile("artifacts/a.txt", []byte("hello"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r, err = Open(dir, &Options{Request: "x"})
	if err != nil {
		t.Fatal(err)
	}
	called := false
	err = r.Do(ctx, "a", func(ctx context.Context, st *Stage) error { called = true; return nil })
	if err != nil || called {
		t.Fatal(err, called)
	}
	os.WriteFile(dir+"/artifacts/a.txt", []byte("changed"), 0o644)
	err = r.Do(ctx, "a", func(ctx context.Context, st *Stage) error {
		called = true
		return st.WriteFile("artifacts/a.txt", []byte("hello"))
	})
	if err != nil || !called {
		t.Fatal(err, called)
	}
	r.Close()
	b, _ := os.ReadFile(dir + "/logs/ledger.jsonl")
	t.Log(string(b))
	b, _ = os.ReadFile(dir + "/logs/next-steps.txt")
	t.Log(string(b))
	b, _ = os.ReadFile(dir + "/manifest.json")
	t.Log(string(b))
}
