package runstate

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runstate/runstate/internal/faultfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func handoffText(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(nextStepsFile)))
	require.NoError(t, err)
	return string(data)
}

// doLine returns the do: line under the blocker line that contains what.
func doLine(t *testing.T, page, what string) string {
	t.Helper()
	lines := strings.Split(page, "\n")
	for i, l := range lines {
		if strings.Contains(l, what) && i+1 < len(lines) {
			require.True(t, strings.HasPrefix(lines[i+1], "    do: "), "%q is followed by a do: line", l)
			return strings.TrimPrefix(lines[i+1], "    do: ")
		}
	}
	t.Fatalf("no blocker line holds %q in:\n%s", what, page)
	return ""
}

// diedAfterIntent leaves, in dir, the effect key with an intent whose
// session died before Do returned.
func diedAfterIntent(t *testing.T, dir, key string) {
	t.Helper()
	r, err := Open(dir, &Options{Request: "handoff", NoSync: true})
	require.NoError(t, err)
	_, err = r.Effect(context.Background(), key, Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		r.crash() // killed while the request was on its way
		return json.RawMessage(`"sent"`), nil
	}})
	require.Error(t, err)
}

// An effect whose session died between its intent and a confirmation is in
// doubt: the handoff says that the next Effect call asks Check and settles
// it, and what a person does only if there is no Check or it fails. Only
// when Check could not settle it is the effect unconfirmed, a person's.
func TestHandoffSaysTheNextRunChecksAnInDoubtEffect(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		check func(context.Context, string) (json.RawMessage, bool, error)
	}{
		{"Check finds it", func(context.Context, string) (json.RawMessage, bool, error) {
			return json.RawMessage(`"found"`), true, nil
		}},
		{"no Check", nil},
		{"Check fails", func(context.Context, string) (json.RawMessage, bool, error) {
			return nil, false, errors.New("tracker down")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			diedAfterIntent(t, dir, "ticket")
			r, err := Open(dir, &Options{NoSync: true})
			require.NoError(t, err)
			defer r.Close()

			st, err := r.Status()
			require.NoError(t, err)
			require.Len(t, st.Effects, 1)
			assert.Equal(t, EffectInDoubt, st.Effects[0].State, "not unconfirmed before anything asked the receiving system")
			assert.Equal(t, 1, st.Metrics.EffectsInDoubt)
			assert.Zero(t, st.Metrics.EffectsUnconfirmed, "no person is needed yet")
			require.Len(t, st.Blockers, 1)
			assert.Equal(t, "in-doubt", st.Blockers[0].Kind)
			page := handoffText(t, dir)
			do := doLine(t, page, "effect ticket in-doubt")
			assert.True(t, strings.HasPrefix(do, "run the pipeline again: its next Effect call for this key asks the receiving system (Check) and settles it"), do)
			assert.Contains(t, do, "only if it has no Check, or Check fails, must a person check the receiving system, then: runstate resolve "+dirArg(dir)+" ticket")

			_, err = r.Effect(ctx, "ticket", Effect{Do: func(context.Context, string) (json.RawMessage, error) {
				return json.RawMessage(`"again"`), nil
			}, Check: tc.check})
			page = handoffText(t, dir)
			st, serr := r.Status()
			require.NoError(t, serr)
			if tc.check != nil && tc.name == "Check finds it" {
				require.NoError(t, err)
				assert.Equal(t, EffectConfirmed, st.Effects[0].State)
				assert.Empty(t, st.Blockers)
				assert.Contains(t, page, "blockers: none\n")
				return
			}
			require.ErrorIs(t, err, ErrUnconfirmed)
			assert.Equal(t, EffectUnconfirmed, st.Effects[0].State, "now it needs a person")
			assert.Equal(t, 1, st.Metrics.EffectsUnconfirmed)
			assert.Zero(t, st.Metrics.EffectsInDoubt)
			do = doLine(t, page, "effect ticket unconfirmed")
			assert.True(t, strings.HasPrefix(do, "check the receiving system, then: runstate resolve "+dirArg(dir)+" ticket -sent RECEIPT -by NAME (or -not-sent)"), do)
		})
	}
}

// next-steps.txt names the run directory in its commands: the absolute
// path, quoted for a shell, where the handoff once printed DIR.
func TestHandoffNamesTheRunDirectory(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	t.Chdir(parent)
	r, err := Open("my run", &Options{Request: "handoff", NoSync: true, MaxAttempts: 1})
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Plan(ctx, "execute", "my stage"))
	require.Error(t, r.Do(ctx, "execute", func(context.Context, *Stage) error { return Fatal(errors.New("bad input")) }))
	require.Error(t, r.Do(ctx, "my stage", func(context.Context, *Stage) error { return errors.New("flaky") }))

	abs := filepath.Join(parent, "my run")
	quoted := "'" + abs + "'"
	page := handoffText(t, abs)
	assert.NotContains(t, page, "DIR")
	assert.Equal(t, "fix the cause, then: runstate invalidate "+quoted+" execute -reason TEXT", doLine(t, page, "execute fatal"))
	assert.Equal(t, "runstate approve "+quoted+" 'my stage' -by NAME -note TEXT", doLine(t, page, "my stage awaiting"))
	assert.Contains(t, page, "          runstate status "+quoted+"; runstate log "+quoted+"\n")

	// Inspect's rendering, from another directory, names the same path.
	t.Chdir(t.TempDir())
	text, err := NextSteps(abs)
	require.NoError(t, err)
	assert.Equal(t, page, text)
}

// A stage that fails because the disk (or the quota) is full is not at
// fault: the failure does not count toward MaxAttempts, so the stage never
// ends up awaiting a person for it, and runs again once there is space.
func TestFullDiskIsNotTheStagesFault(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "disk full", NoSync: true, MaxAttempts: 2})
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Plan(ctx, "build", "ask"))
	full := true
	stage := func(_ context.Context, st *Stage) error {
		if full {
			return &fs.PathError{Op: "write", Path: "artifacts/big.bin", Err: syscall.ENOSPC}
		}
		return st.WriteFile("artifacts/big.bin", []byte("data"))
	}
	for i := 0; i < 4; i++ {
		err := r.Do(ctx, "build", stage)
		require.ErrorIs(t, err, syscall.ENOSPC, "attempt %d: the stage runs and fails, it is not refused", i+1)
		assert.NotErrorIs(t, err, ErrNeedsPerson)
	}
	st, err := r.Status()
	require.NoError(t, err)
	b, _ := st.Stage("build")
	assert.Equal(t, StateFailed, b.State)
	assert.Zero(t, b.Failures, "full disks do not count")
	assert.Equal(t, ClassRetryable, b.Class)
	assert.Empty(t, st.Blockers)
	page := handoffText(t, dir)
	assert.NotContains(t, page, "awaiting")
	assert.Contains(t, page, "failed on a full disk, not counted toward MaxAttempts; free space, then run the pipeline again")

	// EDQUOT too; a stage's own failures still count after them.
	quota := errors.Join(errors.New("upload"), syscall.EDQUOT)
	require.ErrorIs(t, r.Do(ctx, "build", func(context.Context, *Stage) error { return quota }), syscall.EDQUOT)
	require.Error(t, r.Do(ctx, "build", func(context.Context, *Stage) error { return errors.New("compile error") }))
	b, _ = mustStatus(t, r).Stage("build")
	assert.Equal(t, 1, b.Failures)
	assert.Equal(t, StateFailed, b.State)
	assert.Empty(t, b.Reason, "a later failure clears the disk-full reason")

	full = false
	require.NoError(t, r.Do(ctx, "build", stage), "space is free again: it runs without a person")

	// A person's or a fatal class chosen by the stage is kept.
	err = r.Do(ctx, "ask", func(context.Context, *Stage) error {
		return NeedsPerson(&fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}, "which volume?")
	})
	require.ErrorIs(t, err, syscall.ENOSPC)
	a, _ := mustStatus(t, r).Stage("ask")
	assert.Equal(t, StateAwaiting, a.State)
}

func mustStatus(t *testing.T, r *Run) *Status {
	t.Helper()
	st, err := r.Status()
	require.NoError(t, err)
	return st
}

// A Complete whose record finds the disk full ends the attempt (as a
// failure that does not count) where that still fits, so that the same
// session runs the stage again once there is space, instead of finding it
// "running in this session" for ever.
func TestCompleteOnFullDiskRunsAgainWithoutAPerson(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	ffs := faultfs.New()
	o := faultOptions(ffs, nil)
	o.MaxAttempts = 1
	r, err := Open(dir, o)
	require.NoError(t, err)
	defer r.Close()
	calls := 0
	err = r.Do(ctx, "build", func(_ context.Context, st *Stage) error {
		calls++
		ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "ledger.jsonl", Err: syscall.ENOSPC, Times: 1})
		return st.WriteFile("artifacts/out.txt", []byte("out"))
	})
	require.ErrorIs(t, err, syscall.ENOSPC)
	b, _ := mustStatus(t, r).Stage("build")
	assert.Equal(t, StateFailed, b.State)
	assert.Zero(t, b.Failures)

	require.NoError(t, doWrite(r, "build", "out"), "the disk has room again: the stage runs again, no person, no ErrBusy")
	assert.Equal(t, 1, calls)
	b, _ = mustStatus(t, r).Stage("build")
	assert.Equal(t, StateComplete, b.State)
}

// An effect the receiving system accepted without confirming (ErrPending)
// is settled by a later Effect call's Check: the handoff says so first,
// and what a person does only without a Check.
func TestHandoffSaysAPendingEffectIsCheckedLater(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "handoff", NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	_, err = r.Effect(context.Background(), "deploy", Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, ErrPending
	}})
	require.ErrorIs(t, err, ErrPending)
	do := doLine(t, handoffText(t, dir), "effect deploy unconfirmed")
	assert.True(t, strings.HasPrefix(do, "run the pipeline again later: its next Effect call for this key asks the receiving system (Check) whether the accepted request landed; "), do)
	assert.Contains(t, do, "without a Check, or if it fails, a person must check the receiving system, then: runstate resolve "+dirArg(dir)+" deploy")
}
