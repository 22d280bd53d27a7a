package runstate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

func i3Stage(t testing.TB, r *runstate.Run, name string) runstate.StageStatus {
	t.Helper()
	st, err := r.Status()
	require.NoError(t, err)
	s, ok := st.Stage(name)
	require.True(t, ok, "stage %s unknown", name)
	return s
}

func failing(err error) func(context.Context, *runstate.Stage) error {
	return func(context.Context, *runstate.Stage) error { return err }
}

func TestFailClasses(t *testing.T) {
	base := errors.New("exit status 1")
	for _, tc := range []struct {
		name      string
		err       error
		class     string
		state     string
		beginErr  error
		reasonHas string
	}{
		{"unclassified is retryable", base, runstate.ClassRetryable, runstate.StateFailed, nil, ""},
		{"Retryable", runstate.Retryable(base), runstate.ClassRetryable, runstate.StateFailed, nil, ""},
		{"NeedsPerson", runstate.NeedsPerson(base, "the API key was revoked: issue a new one"), runstate.ClassPerson, runstate.StateAwaiting, runstate.ErrNeedsPerson, "the API key was revoked"},
		{"Fatal", runstate.Fatal(base), runstate.ClassFatal, runstate.StateFatal, runstate.ErrFatal, "exit status 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			r := i3Open(t, dir, nil)
			err := r.Do(ctx, "build", failing(tc.err))
			require.ErrorIs(t, err, base, "Do returns fn's error, unwrappable")

			recs := i3Records(t, dir)
			var fail *runstate.Record
			for _, rec := range recs {
				if rec.Ev == "fail" {
					fail = rec
				}
			}
			require.NotNil(t, fail)
			assert.Equal(t, tc.class, fail.Class)
			assert.Equal(t, "exit status 1", fail.Error)
			assert.Equal(t, tc.state, i3Stage(t, r, "build").State)

			_, err = r.Begin(ctx, "build")
			if tc.beginErr == nil {
				require.NoError(t, err, "a retryable failure may be begun again")
				return
			}
			require.ErrorIs(t, err, tc.beginErr)
			assert.Contains(t, err.Error(), tc.reasonHas)
		})
	}

	assert.NoError(t, runstate.Retryable(nil))
	assert.NoError(t, runstate.Fatal(nil))
	np := runstate.NeedsPerson(nil, "approve the migration")
	require.Error(t, np)
	assert.Equal(t, "approve the migration", np.Error())
	assert.ErrorIs(t, runstate.Fatal(runstate.Retryable(base)), base)
}

func TestMaxAttemptsThenApprove(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil) // MaxAttempts zero: 3
	flaky := errors.New("dial tcp 10.0.0.7:5432: connection refused")
	for i := 1; i <= 3; i++ {
		require.ErrorIs(t, r.Do(ctx, "migrate", failing(flaky)), flaky)
		s := i3Stage(t, r, "migrate")
		assert.Equal(t, i, s.Attempt)
		if i < 3 {
			assert.Equal(t, runstate.StateFailed, s.State, "attempt %d", i)
			assert.Equal(t, i, s.Failures)
		}
	}
	s := i3Stage(t, r, "migrate")
	assert.Equal(t, runstate.StateAwaiting, s.State, "retries exhausted: a person decides")
	assert.Contains(t, s.Reason, "retries exhausted")

	called := false
	err := r.Do(ctx, "migrate", func(context.Context, *runstate.Stage) error { called = true; return nil })
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
	assert.False(t, called)
	assert.Contains(t, err.Error(), "retries exhausted: 3 attempts failed")
	assert.Contains(t, err.Error(), "connection refused")
	assert.Contains(t, err.Error(), "runstate approve")

	// The blocker is in Status and in the handoff, and survives a restart.
	st, err := r.Status()
	require.NoError(t, err)
	require.Len(t, st.Blockers, 1)
	assert.Equal(t, "migrate", st.Blockers[0].Stage)
	assert.Contains(t, st.Blockers[0].Reason, "retries exhausted")
	assert.Contains(t, st.Blockers[0].Action, "runstate approve")
	next, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(next), "retries exhausted")
	require.NoError(t, r.Close())
	r = i3Open(t, dir, nil)
	_, err = r.Begin(ctx, "migrate")
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)

	// Approve checks its arguments, then clears it with a fresh budget.
	require.ErrorIs(t, r.Approve(ctx, "migrate", " ", ""), runstate.ErrInvalid)
	require.ErrorIs(t, r.Approve(ctx, "nope", "ann", ""), runstate.ErrInvalid)
	require.NoError(t, r.Approve(ctx, "migrate", "ann@example.com", "database is back"))
	require.ErrorIs(t, r.Approve(ctx, "migrate", "ann", ""), runstate.ErrInvalid, "no longer awaiting")
	s = i3Stage(t, r, "migrate")
	assert.Equal(t, runstate.StatePending, s.State)
	assert.Zero(t, s.Failures)
	require.ErrorIs(t, r.Do(ctx, "migrate", failing(flaky)), flaky)
	assert.Equal(t, runstate.StateFailed, i3Stage(t, r, "migrate").State, "one failure after approval does not exhaust it")
	require.NoError(t, r.Do(ctx, "migrate", func(context.Context, *runstate.Stage) error { return nil }))
	_, err = r.Begin(ctx, "migrate")
	require.ErrorIs(t, err, runstate.ErrDone)

	recs := i3Records(t, dir)
	assert.Equal(t, []string{
		"begin", "fail", "begin", "fail", "begin", "fail", "await",
		"approve", "begin", "fail", "begin", "complete",
	}, i3Evs(recs, "migrate"))
	for _, rec := range recs {
		if rec.Ev == "approve" {
			assert.Equal(t, "ann@example.com", rec.By)
			assert.Equal(t, "database is back", rec.Note)
		}
	}
	st, err = r.Status()
	require.NoError(t, err)
	assert.Empty(t, st.Blockers)
	assert.Equal(t, 4, st.Metrics.Failures)
}

// TestCanceledIsNotAFailure: a Do whose caller's context is cancelled (or
// runs out) while fn runs, and fn returns that, is recorded as a
// retryable failure that does not count toward MaxAttempts: any number of
// interruptions leave the stage to run again, not awaiting a person, and
// a real failure after them is the first one counted. It reads so after a
// restart too.
func TestCanceledIsNotAFailure(t *testing.T) {
	dir := t.TempDir()
	opts := i3Options()
	opts.MaxAttempts = 2
	r := i3Open(t, dir, opts)
	require.NoError(t, r.Plan(context.Background(), "build"))
	for i := range 4 {
		ctx, cancel := context.WithCancel(context.Background())
		if i%2 == 1 {
			ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
		}
		err := r.Do(ctx, "build", func(ctx context.Context, _ *runstate.Stage) error {
			if i%2 == 0 {
				cancel()
			}
			<-ctx.Done()
			return ctx.Err()
		})
		cancel()
		require.Error(t, err)
		assert.True(t, errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded), err)
		s := i3Stage(t, r, "build")
		assert.Equal(t, runstate.StateFailed, s.State, "interruption %d", i+1)
		assert.Zero(t, s.Failures, "interruption %d", i+1)
	}
	st, err := r.Status()
	require.NoError(t, err)
	assert.Empty(t, st.Blockers)
	assert.Contains(t, i3Stage(t, r, "build").Reason, "not counted toward MaxAttempts")
	next, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(next), "canceled by its caller, not counted toward MaxAttempts")

	// fn's own error while the caller's context lives counts, as before.
	flaky := errors.New("connection refused")
	require.ErrorIs(t, r.Do(context.Background(), "build", failing(flaky)), flaky)
	require.NoError(t, r.Close())
	r = i3Open(t, dir, opts)
	s := i3Stage(t, r, "build")
	assert.Equal(t, runstate.StateFailed, s.State)
	assert.Equal(t, 1, s.Failures)
	require.NoError(t, r.Do(context.Background(), "build", func(context.Context, *runstate.Stage) error { return nil }))
}

// The primitives tell the caller's cancellation as Do does: Stage.Fail
// of the error that Begin's ctx ended with is not counted; the same error
// while that ctx lives (a call of the work's own that was cancelled) is.
func TestFailOfBeginsCanceledContextIsNotCounted(t *testing.T) {
	opts := i3Options()
	opts.MaxAttempts = 2
	r := i3Open(t, t.TempDir(), opts)
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		st, err := r.Begin(ctx, "build")
		require.NoError(t, err, "attempt %d", i+1)
		cancel()
		require.NoError(t, st.Fail(fmt.Errorf("build: %w", ctx.Err())))
		s := i3Stage(t, r, "build")
		assert.Equal(t, runstate.StateFailed, s.State)
		assert.Zero(t, s.Failures, "cancellation %d", i+1)
	}
	for i := range 2 {
		st, err := r.Begin(context.Background(), "build")
		require.NoError(t, err)
		require.NoError(t, st.Fail(context.Canceled))
		assert.Equal(t, i+1, i3Stage(t, r, "build").Failures, "the caller's ctx lives: a failure of the work")
	}
	_, err := r.Begin(context.Background(), "build")
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
}

func TestMaxAttemptsOption(t *testing.T) {
	ctx := context.Background()
	opts := i3Options()
	opts.MaxAttempts = 1
	r := i3Open(t, t.TempDir(), opts)
	require.Error(t, r.Do(ctx, "s", failing(errors.New("no"))))
	_, err := r.Begin(ctx, "s")
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
	assert.Contains(t, err.Error(), "1 attempts failed")
}

func TestNeedsPersonThenApprove(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil)
	err := r.Do(ctx, "deploy", failing(runstate.NeedsPerson(errors.New("403 Forbidden"), "grant the deploy role to the agent")))
	require.Error(t, err)
	_, err = r.Begin(ctx, "deploy")
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
	assert.Contains(t, err.Error(), "grant the deploy role")
	require.NoError(t, r.Approve(ctx, "deploy", "bob", "role granted"))
	require.NoError(t, r.Do(ctx, "deploy", func(context.Context, *runstate.Stage) error { return nil }))
	assert.Equal(t, []string{"begin", "fail", "await", "approve", "begin", "complete"}, i3Evs(i3Records(t, dir), "deploy"))
}

func TestFatalThenInvalidate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil)
	require.Error(t, r.Do(ctx, "parse", failing(runstate.Fatal(errors.New("unsupported file format")))))
	_, err := r.Begin(ctx, "parse")
	require.ErrorIs(t, err, runstate.ErrFatal)
	assert.Contains(t, err.Error(), "unsupported file format")
	assert.Contains(t, err.Error(), "runstate invalidate")
	st, err := r.Status()
	require.NoError(t, err)
	require.Len(t, st.Blockers, 1)
	assert.Equal(t, "fatal", st.Blockers[0].Kind)
	require.ErrorIs(t, r.Approve(ctx, "parse", "ann", ""), runstate.ErrInvalid, "a fatal failure is not approved, it is invalidated")

	require.NoError(t, r.Invalidate(ctx, "parse", "converter upgraded"))
	require.NoError(t, r.Do(ctx, "parse", func(context.Context, *runstate.Stage) error { return nil }))
	assert.Equal(t, []string{"begin", "fail", "invalidate", "begin", "complete"}, i3Evs(i3Records(t, dir), "parse"))
}

func TestInvalidateForcesRedo(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil)
	runs := 0
	plan := func(_ context.Context, st *runstate.Stage) error {
		runs++
		return st.WriteFile("artifacts/plan.md", []byte("1. fix the parser\n"))
	}
	require.NoError(t, r.Do(ctx, "plan", plan))
	require.NoError(t, r.Do(ctx, "plan", plan))
	assert.Equal(t, 1, runs)

	require.ErrorIs(t, r.Invalidate(ctx, "plan", " "), runstate.ErrInvalid, "a reason is required")
	require.ErrorIs(t, r.Invalidate(ctx, "nope", "x"), runstate.ErrInvalid)
	require.NoError(t, r.Invalidate(ctx, "plan", "ticket was re-scoped"))
	s := i3Stage(t, r, "plan")
	assert.Equal(t, runstate.StatePending, s.State)
	assert.Equal(t, "ticket was re-scoped", s.Reason)
	require.NoError(t, r.Do(ctx, "plan", plan))
	assert.Equal(t, 2, runs, "redone although its evidence held")

	recs := i3Records(t, dir)
	assert.Equal(t, []string{"begin", "complete", "invalidate", "begin", "complete"}, i3Evs(recs, "plan"))
	for _, rec := range recs {
		if rec.Ev == "invalidate" {
			assert.Equal(t, "ticket was re-scoped", rec.Reason)
			assert.NotEmpty(t, rec.By, "names who asked")
		}
	}
	st, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, 1, st.Metrics.Invalidations)
	assert.Zero(t, st.Metrics.StaleRejections)
	assert.Zero(t, st.Metrics.DuplicatedWork)
}

func TestAwaitReviewThenApprove(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil)
	err := r.Do(ctx, "await-review", func(_ context.Context, st *runstate.Stage) error {
		if err := st.WriteFile("artifacts/review.md", []byte("diff: +12 -3\n")); err != nil {
			return err
		}
		return st.Await("review artifacts/review.md")
	})
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
	s := i3Stage(t, r, "await-review")
	assert.Equal(t, runstate.StateAwaiting, s.State)
	assert.True(t, s.Review)
	assert.Zero(t, i3Stage(t, r, "await-review").Failures)
	st, err := r.Status()
	require.NoError(t, err)
	require.Len(t, st.Blockers, 1)
	assert.Equal(t, "awaiting", st.Blockers[0].Kind)
	assert.Equal(t, "review artifacts/review.md", st.Blockers[0].Reason)
	require.Len(t, st.Artifacts, 1, "the outputs under review are listed")

	_, err = r.Begin(ctx, "await-review")
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
	require.NoError(t, r.Approve(ctx, "await-review", "carol", "looks right"))
	_, err = r.Begin(ctx, "await-review")
	require.ErrorIs(t, err, runstate.ErrDone, "an approved review is complete")
	s = i3Stage(t, r, "await-review")
	assert.Equal(t, runstate.StateComplete, s.State)
	assert.Equal(t, "approved by carol", s.Reason)
	assert.Equal(t, []string{"begin", "await", "approve"}, i3Evs(i3Records(t, dir), "await-review"))

	require.NoError(t, r.Close())
	require.ErrorIs(t, r.Approve(ctx, "await-review", "carol", ""), runstate.ErrClosed)
	require.ErrorIs(t, r.Invalidate(ctx, "await-review", "x"), runstate.ErrClosed)
}
