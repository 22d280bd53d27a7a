package runstate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blockRun leaves three blockers in r: stage review awaits a person,
// stage deploy failed fatally, effect ticket is unconfirmed. It returns
// the errors a caller then gets: Begin of review, Begin of deploy, and
// the failed Effect.
func blockRun(t *testing.T, r *runstate.Run) (awaiting, fatal, effect error) {
	t.Helper()
	ctx := context.Background()
	st, err := r.Begin(ctx, "review")
	require.NoError(t, err)
	require.ErrorIs(t, st.Await("read the diff"), runstate.ErrNeedsPerson)
	st, err = r.Begin(ctx, "deploy")
	require.NoError(t, err)
	require.NoError(t, st.Fail(runstate.Fatal(errors.New("the schema is gone"))))
	_, effect = r.Effect(ctx, "ticket", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, errors.New("timeout")
	}})
	require.ErrorIs(t, effect, runstate.ErrUnconfirmed)
	_, awaiting = r.Begin(ctx, "review")
	require.ErrorIs(t, awaiting, runstate.ErrNeedsPerson)
	_, fatal = r.Begin(ctx, "deploy")
	require.ErrorIs(t, fatal, runstate.ErrFatal)
	return awaiting, fatal, effect
}

// actions are the Actions of st's blockers, by stage or effect key.
func actions(st *runstate.Status) map[string]string {
	out := map[string]string{}
	for _, b := range st.Blockers {
		out[b.Stage+b.Key] = b.Action
	}
	return out
}

// TestAdviceNamesTheRunDirectory: the commands that a person is told to
// run — in the errors of Begin (an awaiting or a fatal stage) and of a
// failed Effect, in Status's and Inspect's blocker Actions, in the
// handoff and in Verify's fix for a changed output — name the run
// directory by its absolute path, quoted for a shell, not the placeholder
// DIR that no shell can run.
func TestAdviceNamesTheRunDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my run")
	r, err := runstate.Open(dir, &runstate.Options{Request: "advice"})
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Do(context.Background(), "make", func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("out/made.txt", []byte("made\n"))
	}))
	awaiting, fatal, effect := blockRun(t, r)
	at := "'" + dir + "'" // a space: quoted for a shell

	assert.Contains(t, awaiting.Error(), "approve it with: runstate approve "+at+" review -by NAME")
	assert.Contains(t, fatal.Error(), "fix the cause, then: runstate invalidate "+at+" deploy -reason TEXT")
	assert.Contains(t, effect.Error(), "resolve it with: runstate resolve "+at+" ticket -sent RECEIPT|-not-sent -by NAME")
	want := map[string]string{
		"review": "runstate approve " + at + " review -by NAME -note TEXT",
		"deploy": "fix the cause, then: runstate invalidate " + at + " deploy -reason TEXT",
		"ticket": "check the receiving system, then: runstate resolve " + at + " ticket -sent RECEIPT -by NAME (or -not-sent); a later Effect call for this key asks its Check again first, if it has one",
	}
	st, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, want, actions(st), "Run.Status")
	st, err = runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, want, actions(st), "Inspect")
	page, err := r.NextSteps()
	require.NoError(t, err)
	for _, a := range want {
		assert.Contains(t, page, "    do: "+a+"\n")
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "out", "made.txt"), []byte("changed\n"), 0o644))
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	var fix string
	for _, p := range rep.Problems {
		if p.File == filepath.Join(dir, "out", "made.txt") {
			fix = p.Fix
		}
	}
	assert.Equal(t, "the next run of make redoes it; or runstate invalidate "+at+" make -reason TEXT", fix, "%+v", rep.Problems)
	for _, text := range []string{awaiting.Error(), fatal.Error(), effect.Error(), page, fix} {
		assert.NotContains(t, text, " DIR ")
	}
}

// TestRepairAdviceNamesTheRunDirectory: Verify's fix for a torn last line
// and Repair's advice for mid-file damage name the run directory by its
// absolute path, quoted for a shell, not the placeholder DIR.
func TestRepairAdviceNamesTheRunDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my run")
	r, err := runstate.Open(dir, &runstate.Options{Request: "advice"})
	require.NoError(t, err)
	require.NoError(t, r.Do(context.Background(), "a", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, r.Close())
	at := "'" + dir + "'"
	lp := filepath.Join(dir, "logs", "ledger.jsonl")
	good, err := os.ReadFile(lp)
	require.NoError(t, err)

	require.NoError(t, os.WriteFile(lp, append(bytes.Clone(good), `{"seq":99,"ev":"beg`...), 0o644))
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	require.NotEmpty(t, rep.Problems)
	assert.Equal(t, "runstate repair "+at+" moves it aside (the next writer would too)", rep.Problems[0].Fix)

	lines := bytes.SplitAfter(good, []byte("\n"))
	lines[2] = bytes.Replace(lines[2], []byte(`"ev":"`), []byte(`"ev":"X`), 1)
	require.NoError(t, os.WriteFile(lp, bytes.Join(lines, nil), 0o644))
	_, err = runstate.Repair(dir, nil)
	require.ErrorIs(t, err, runstate.ErrCorrupt)
	assert.Regexp(t, `with: runstate repair -truncate-at \d+ -force `+regexp.QuoteMeta(at)+` \(a copy`, err.Error())
	assert.NotContains(t, err.Error(), " DIR")
}

// TestCorruptErrorNamesTheRunToVerify: the error for a damaged ledger
// (a *CorruptError) tells a person to run 'runstate verify' on the run
// directory, by its absolute path quoted for a shell, also when the run
// was opened by a relative path, not on the placeholder DIR.
func TestCorruptErrorNamesTheRunToVerify(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "my run")
	r, err := runstate.Open(dir, &runstate.Options{Request: "advice"})
	require.NoError(t, err)
	require.NoError(t, r.Do(context.Background(), "a", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, r.Close())
	lp := filepath.Join(dir, "logs", "ledger.jsonl")
	good, err := os.ReadFile(lp)
	require.NoError(t, err)
	lines := bytes.SplitAfter(good, []byte("\n"))
	lines[1] = bytes.Replace(lines[1], []byte(`"ev":"`), []byte(`"ev":"X`), 1)
	require.NoError(t, os.WriteFile(lp, bytes.Join(lines, nil), 0o644))

	t.Chdir(parent)
	for _, at := range []string{dir, "my run"} {
		_, err = runstate.Open(at, nil)
		var ce *runstate.CorruptError
		require.ErrorAs(t, err, &ce, at)
		assert.Contains(t, err.Error(), "; runstate verify '"+dir+"' lists every problem, runstate repair only cuts a torn tail", at)
		assert.NotContains(t, err.Error(), "DIR", at)
	}
}
