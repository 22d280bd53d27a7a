package runstate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// Tests for the opening, liveness, file-identity and Close paths (issue 13,
// items 1, 3, 4 and 10). The lock-wait tests (item 7) are in
// lockwait_internal_test.go.

// ledgerEvents returns the ev of every record of the ledger in dir.
func ledgerEvents(t testing.TB, dir string) []string {
	t.Helper()
	var evs []string
	require.NoError(t, runstate.ReadLedger(dir, func(rec *runstate.Record) error {
		evs = append(evs, rec.Ev)
		return nil
	}))
	return evs
}

// TestOpenNeverReplacesARun: a ledger emptied, deleted or left with an
// unparsable first line beside the files a run leaves is corruption, not a
// directory to create a new run in (which would send a confirmed effect
// again under a new run id).
func TestOpenNeverReplacesARun(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string)
	}{
		{"emptied", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(ledgerPath(dir), nil, 0o644))
		}},
		{"deleted", func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(ledgerPath(dir)))
		}},
		{"first line does not parse", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(ledgerPath(dir), []byte(`{"seq":1,"at":"garbage`), 0o644))
		}},
		{"emptied, only artifacts left", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(ledgerPath(dir), nil, 0o644))
			require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
			require.NoError(t, os.Remove(filepath.Join(dir, "logs", "next-steps.txt")))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			sent := 0
			eff := runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
				sent++
				return json.RawMessage(`{"id":1}`), nil
			}}
			r, err := runstate.Open(dir, testOptions())
			require.NoError(t, err)
			_, err = r.Effect(ctx, "ticket", eff)
			require.NoError(t, err)
			require.NoError(t, r.Do(ctx, "a", func(_ context.Context, st *runstate.Stage) error {
				return st.WriteFile("artifacts/a.txt", []byte("a"))
			}))
			require.NoError(t, r.Close())
			c.damage(t, dir)
			damaged, _ := os.ReadFile(ledgerPath(dir))

			r, err = runstate.Open(dir, testOptions())
			if err == nil {
				_, _ = r.Effect(ctx, "ticket", eff)
				r.Close()
			}
			var cerr *runstate.CorruptError
			require.ErrorAs(t, err, &cerr, "Open over a lost ledger")
			assert.ErrorIs(t, err, runstate.ErrCorrupt)
			assert.Equal(t, ledgerPath(dir), cerr.Path)
			assert.Contains(t, err.Error(), "restore the ledger")
			after, _ := os.ReadFile(ledgerPath(dir))
			assert.Equal(t, damaged, after, "nothing is written, not even a torn line cut")
			assert.Equal(t, 1, sent, "the confirmed effect is not sent again")
			if damaged != nil {
				// The readers say so too, rather than "never created".
				_, err = runstate.Inspect(dir)
				assert.ErrorAs(t, err, &cerr, "Inspect")
				rep, err := runstate.Verify(dir)
				require.NoError(t, err)
				assert.Contains(t, fmt.Sprint(rep.Problems), "show that a run was here")
			}
		})
	}
}

// TestOpenCreatesWhereNoRunWas: what a creator killed before its create
// record leaves (a torn first line, the journal, logs/tmp) is no run, and
// Open creates one there; so does a directory of other files.
func TestOpenCreatesWhereNoRunWas(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs", "sessions"), 0o755))
	require.NoError(t, os.WriteFile(ledgerPath(dir), []byte(`{"seq":1,"at":"2026-`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644))
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	require.NoError(t, r.Close())
	assert.Equal(t, []string{"create", "open", "close"}, ledgerEvents(t, dir))
}

// TestAppendFailsClosedWhenItsFileIsReplaced: once logs/ledger.jsonl is no
// longer the file the session has open, the next append that acknowledges
// a record fails, naming the file, and the Run is read-only: nothing is
// acknowledged into a file nobody reads (the journal's cases are in
// TestRingBatchFailsClosedWhenTheJournalIsReplaced).
func TestAppendFailsClosedWhenItsFileIsReplaced(t *testing.T) {
	cases := []struct {
		name, file string
		change     func(p string) error
	}{
		{"ledger deleted", "logs/ledger.jsonl", os.Remove},
		{"ledger renamed", "logs/ledger.jsonl", func(p string) error { return os.Rename(p, p+".old") }},
		{"ledger replaced by a copy", "logs/ledger.jsonl", replaceByCopy},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			r, err := runstate.Open(dir, &runstate.Options{Request: testRequest})
			require.NoError(t, err)
			defer r.Close()
			require.NoError(t, r.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }))
			p := filepath.Join(dir, filepath.FromSlash(c.file))
			require.NoError(t, c.change(p))

			err = r.Do(ctx, "b", func(context.Context, *runstate.Stage) error { return nil })
			var werr *runstate.WriteError
			require.ErrorAs(t, err, &werr, "an append after %s", c.name)
			assert.True(t, werr.Sticky)
			assert.Equal(t, p, werr.Path)
			assert.Contains(t, err.Error(), "no longer the file this session opened")
			assert.ErrorIs(t, r.Plan(ctx, "c"), runstate.ErrReadOnly, "the Run stays read-only")
			assert.ErrorIs(t, r.Close(), runstate.ErrReadOnly)
		})
	}
}

func replaceByCopy(p string) error {
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p+".new", data, 0o644); err != nil {
		return err
	}
	return os.Rename(p+".new", p)
}

// TestLivenessSurvivesChdir: a session that opened a relative directory
// and then changed its working directory still sees the other live
// sessions as alive: their running stage is busy, not interrupted.
func TestLivenessSurvivesChdir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "run")
	ctx := context.Background()
	a := openRun(t, dir, testOptions())
	_, err := a.Begin(ctx, "long")
	require.NoError(t, err)

	t.Chdir(base)
	b := openRun(t, "run", testOptions())
	t.Chdir(t.TempDir())
	_, err = b.Begin(ctx, "long")
	assert.ErrorIs(t, err, runstate.ErrBusy, "a stage running in a live session, seen after os.Chdir")
	require.NoError(t, b.Do(ctx, "other", func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/other.txt", []byte("x"))
	}), "outputs are written in the run directory, not the new working directory")
	assert.FileExists(t, filepath.Join(dir, "artifacts", "other.txt"))
	assert.NotContains(t, ledgerEvents(t, dir), "interrupted")
}

// TestLivenessSurvivesRemovedLockFiles: rm logs/sessions/*.lock proves no
// session gone. A stage running in a live session stays busy, and an
// effect whose Do is in flight is not sent a second time.
func TestLivenessSurvivesRemovedLockFiles(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a := openRun(t, dir, testOptions())
	_, err := a.Begin(ctx, "long")
	require.NoError(t, err)
	var calls atomic.Int32
	inDo, release := make(chan struct{}), make(chan struct{})
	eff := runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		if calls.Add(1) == 1 {
			close(inDo)
			<-release
		}
		return json.RawMessage(`"sent"`), nil
	}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := a.Effect(ctx, "mail", eff)
		assert.NoError(t, err)
	}()
	<-inDo
	removeLockFiles(t, dir)

	b := openRun(t, dir, testOptions())
	_, err = b.Begin(ctx, "long")
	assert.ErrorIs(t, err, runstate.ErrBusy, "the stage's session is alive")
	_, err = b.Effect(ctx, "mail", eff)
	assert.ErrorIs(t, err, runstate.ErrBusy, "the effect's Do is in flight")
	close(release)
	wg.Wait()
	assert.Equal(t, int32(1), calls.Load(), "Do ran once")
	assert.NotContains(t, ledgerEvents(t, dir), "interrupted")
}

func removeLockFiles(t *testing.T, dir string) {
	t.Helper()
	locks, err := filepath.Glob(filepath.Join(dir, "logs", "sessions", "*.lock"))
	require.NoError(t, err)
	require.NotEmpty(t, locks)
	for _, l := range locks {
		require.NoError(t, os.Remove(l))
	}
}

// TestCloseIsSafeUnderConcurrency: Close waits for the batches under way,
// writes one close record however many goroutines call it, and every call
// that races it or comes after gets nil or ErrClosed, never a file error.
func TestCloseIsSafeUnderConcurrency(t *testing.T) {
	for round := 0; round < 5; round++ {
		dir := t.TempDir()
		ctx := context.Background()
		r, err := runstate.Open(dir, &runstate.Options{Request: testRequest})
		require.NoError(t, err)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var bad atomic.Value
		for g := 0; g < 6; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					name := "s" + string(rune('a'+g)) + string(rune('a'+i%26))
					err := r.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
						return st.WriteFile("artifacts/"+name, []byte(name))
					})
					if err != nil && !errors.Is(err, runstate.ErrClosed) {
						bad.Store(err)
					}
					if errors.Is(err, runstate.ErrClosed) {
						return
					}
				}
			}()
		}
		time.Sleep(20 * time.Millisecond)
		var closers sync.WaitGroup
		for c := 0; c < 3; c++ {
			closers.Add(1)
			go func() {
				defer closers.Done()
				assert.NoError(t, r.Close())
			}()
		}
		closers.Wait()
		close(stop)
		wg.Wait()
		if err, _ := bad.Load().(error); err != nil {
			t.Fatalf("a call racing Close: %v", err)
		}
		assert.ErrorIs(t, r.Plan(ctx, "x"), runstate.ErrClosed)
		assert.NoError(t, r.Close(), "Close is idempotent")
		n := 0
		for _, ev := range ledgerEvents(t, dir) {
			if ev == "close" {
				n++
			}
		}
		assert.Equal(t, 1, n, "close records")
	}
}

// A working directory whose run is kept elsewhere (pgstore names it in
// logs/run.json) is not made a run directory: Open returns ErrMismatch
// naming the address, and leaves no ledger behind.
func TestOpenRefusesAWorkingDirectoryOfARunKeptElsewhere(t *testing.T) {
	dir := t.TempDir()
	addr := "postgres://agent@db:5432/agents?run=billing"
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "run.json"),
		[]byte(`{"store": "postgres", "address": "`+addr+`"}`), 0o644))
	run, err := runstate.Open(dir, nil)
	if err == nil {
		run.Close()
	}
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), addr)
	assert.Contains(t, err.Error(), "runstate status")
	_, err = os.Stat(filepath.Join(dir, "logs", "ledger.jsonl"))
	assert.ErrorIs(t, err, os.ErrNotExist, "Open left a ledger in the working directory")
}
