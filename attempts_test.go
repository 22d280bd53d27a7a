package runstate_test

// The attempts a session runs (attempts.go): a lost session cancels its
// running stages' contexts; an attempt whose end record could not be
// written does not stay running in the session for good.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/flock"
	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stageEvents lists the records of stage in the ledger of dir, in order:
// "ev attempt".
func stageEvents(t *testing.T, dir, stage string) []string {
	t.Helper()
	var evs []string
	for _, l := range parseLedger(t, readLedgerBytes(t, dir)) {
		if l.rec.Stage == stage {
			evs = append(evs, fmt.Sprintf("%s %d", l.rec.Ev, l.rec.Attempt))
		}
	}
	return evs
}

// lockTimeoutRun opens a run with a short LockTimeout, and the run's
// ledger lock as another process would take it.
func lockTimeoutRun(t *testing.T) (*runstate.Run, string, *flock.Flock) {
	t.Helper()
	dir := t.TempDir()
	opts := testOptions()
	opts.LockTimeout = 200 * time.Millisecond
	return openRun(t, dir, opts), dir, flock.New(filepath.Join(dir, "logs", "ledger.lock"))
}

// The Complete of a Do cannot take the run's lock within LockTimeout
// (another process holds logs/ledger.lock): Do fails, nothing recorded.
// The next Do of the stage in the same Run records the attempt as
// interrupted, naming why, and runs attempt 2 (before: ErrBusy, "attempt 1
// is running in this session", for good).
func TestDoAfterAnEndRecordThatCouldNotBeWrittenBeginsTheNextAttempt(t *testing.T) {
	r, dir, lock := lockTimeoutRun(t)
	ctx := context.Background()
	var stageCtx context.Context
	err := r.Do(ctx, "s", func(_ context.Context, st *runstate.Stage) error {
		stageCtx = st.Context()
		require.NoError(t, lock.Lock()) // another process's batch, for longer than LockTimeout
		return st.WriteFile("out.txt", []byte("one"))
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, runstate.ErrLockTimeout)
	require.NoError(t, lock.Unlock())
	assert.NoError(t, stageCtx.Err(), "attempt 1 is still open: its context goes on until it is interrupted")

	runs := 0
	require.NoError(t, r.Do(ctx, "s", func(_ context.Context, st *runstate.Stage) error {
		runs++
		assert.Equal(t, 2, st.Attempt())
		return st.WriteFile("out.txt", []byte("two"))
	}), "the next Do ends attempt 1 and runs attempt 2")
	assert.Equal(t, 1, runs)
	assert.ErrorIs(t, context.Cause(stageCtx), runstate.ErrStale, "attempt 1's handle is ended")

	assert.Equal(t, []string{"begin 1", "interrupted 1", "begin 2", "complete 2"}, stageEvents(t, dir, "s"))
	for _, l := range parseLedger(t, readLedgerBytes(t, dir)) {
		if l.rec.Ev == "interrupted" {
			assert.Contains(t, l.rec.Reason, "its end record could not be written in session "+r.Session())
			assert.Contains(t, l.rec.Reason, "gave up waiting for")
		}
	}
	stat, err := r.Status()
	require.NoError(t, err)
	s, _ := stat.Stage("s")
	assert.Equal(t, runstate.StateComplete, s.State)
	assert.Zero(t, s.Failures, "an end the store could not record is no failure of the stage")
}

// The same through Begin and a Stage: a Fail that could not be written
// leaves the handle open (the caller may try again); a Begin of the stage
// instead interrupts it, after which the old handle's Complete is ErrStale,
// so attempt 1 can never complete beside attempt 2.
func TestBeginAfterAFailedEndInterruptsTheOldHandle(t *testing.T) {
	r, dir, lock := lockTimeoutRun(t)
	ctx := context.Background()
	old, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	require.NoError(t, lock.Lock())
	assert.ErrorIs(t, old.Fail(errors.New("boom")), runstate.ErrLockTimeout)
	require.NoError(t, lock.Unlock())

	st, err := r.Begin(ctx, "s")
	require.NoError(t, err, "not ErrBusy: attempt 1's end could not be written")
	assert.Equal(t, 2, st.Attempt())
	assert.ErrorIs(t, old.Complete(), runstate.ErrStale)
	require.NoError(t, st.Complete())
	assert.Equal(t, []string{"begin 1", "interrupted 1", "begin 2", "complete 2"}, stageEvents(t, dir, "s"))
}

// Skip of a stage whose attempt's end record (here an Await's) could not
// be written skips it, as for an attempt of a dead session (before:
// ErrBusy, "attempt 1 is running").
func TestSkipAfterAFailedEndSkipsTheStage(t *testing.T) {
	r, dir, lock := lockTimeoutRun(t)
	ctx := context.Background()
	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	require.NoError(t, lock.Lock())
	err = st.Await("review it")
	assert.ErrorIs(t, err, runstate.ErrLockTimeout)
	assert.NotErrorIs(t, err, runstate.ErrNeedsPerson, "the await was not recorded")
	require.NoError(t, lock.Unlock())
	require.NoError(t, r.Skip(ctx, "s", "not needed after all"))
	assert.ErrorIs(t, context.Cause(st.Context()), runstate.ErrStale)
	assert.Equal(t, []string{"begin 1", "skip 0"}, stageEvents(t, dir, "s"))
}

// An effect whose confirm could not be written (the run's lock was held
// past LockTimeout after Do returned): the next Effect of the key asks
// Check, which finds it, and confirms it with Check's receipt, Do not
// called again; without a Check it is unconfirmed, for a person (before:
// ErrBusy, "being attempted by this session", for every later call).
func TestEffectAfterAConfirmThatCouldNotBeWrittenAsksCheck(t *testing.T) {
	for _, withCheck := range []bool{true, false} {
		t.Run(fmt.Sprintf("check=%v", withCheck), func(t *testing.T) {
			r, _, lock := lockTimeoutRun(t)
			ctx := context.Background()
			sent := 0
			e := runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
				sent++
				require.NoError(t, lock.Lock()) // another process's batch, past LockTimeout
				return json.RawMessage(`{"id":1}`), nil
			}}
			if withCheck {
				e.Check = func(context.Context, string) (json.RawMessage, bool, error) {
					return json.RawMessage(`{"id":"checked"}`), true, nil
				}
			}
			_, err := r.Effect(ctx, "k", e)
			assert.ErrorIs(t, err, runstate.ErrLockTimeout)
			require.NoError(t, lock.Unlock())
			got, err := r.Effect(ctx, "k", e)
			if withCheck {
				require.NoError(t, err)
				assert.JSONEq(t, `{"id":"checked"}`, string(got))
				got, err = r.Effect(ctx, "k", e)
				require.NoError(t, err, "confirmed: the stored receipt")
				assert.JSONEq(t, `{"id":"checked"}`, string(got))
			} else {
				assert.ErrorIs(t, err, runstate.ErrUnconfirmed)
				assert.NotErrorIs(t, err, runstate.ErrBusy)
			}
			assert.Equal(t, 1, sent, "Do is never called again for an effect that may have landed")
		})
	}
}

// A running stage's Stage.Context ends when the attempt ends, with
// context.Canceled; Do's context for fn is the caller's until fn returns.
func TestStageContextEndsWithTheAttempt(t *testing.T) {
	r, _ := newTestRun(t)
	st, err := r.Begin(context.Background(), "s")
	require.NoError(t, err)
	require.NoError(t, st.Context().Err())
	require.NoError(t, st.Complete())
	assert.ErrorIs(t, context.Cause(st.Context()), context.Canceled)
}

// A memory store's sessions die with MemStore.Crash; the Run learns it at
// its next append (ErrSessionLost) and cancels its running stages: the
// ctx that Do gave fn and the Stage's context, with ErrSessionLost as the
// cause.
func TestSessionLostAtAnAppendCancelsRunningStages(t *testing.T) {
	m := runstatetest.NewMemStore()
	dir := t.TempDir()
	r, err := m.Open(dir, testOptions())
	require.NoError(t, err)
	defer r.Close()
	ctx := context.Background()
	running := make(chan *runstate.Stage)
	done := make(chan error, 1)
	go func() {
		done <- r.Do(ctx, "s", func(ctx context.Context, st *runstate.Stage) error {
			running <- st
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	st := <-running
	m.Crash()
	assert.ErrorIs(t, r.Refresh(ctx), runstate.ErrSessionLost)
	select {
	case err := <-done:
		assert.ErrorIs(t, err, runstate.ErrSessionLost, "fn's ctx was cancelled with the session's loss as the cause")
	case <-time.After(5 * time.Second):
		t.Fatal("the stage's ctx was not cancelled after the session was lost")
	}
	assert.ErrorIs(t, context.Cause(st.Context()), runstate.ErrSessionLost)
	_, err = r.Begin(ctx, "t")
	assert.ErrorIs(t, err, runstate.ErrReadOnly)
}

// A Store that is a LeaseWatcher reports the loss without an append: the
// running stages' contexts are cancelled at once, the Run is read-only,
// and a stage begun afterwards would start cancelled.
func TestLeaseWatcherLossCancelsRunningStagesWithoutAnAppend(t *testing.T) {
	m := runstatetest.NewMemStore()
	ws := &watchedStore{Store: m.Session(), lost: make(chan error, 1)}
	r, err := runstate.OpenStore(ws, t.TempDir(), testOptions())
	require.NoError(t, err)
	defer r.Close()
	ctx := context.Background()
	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	fnCtx := make(chan context.Context, 1)
	release := make(chan struct{})
	go func() {
		_ = r.Do(ctx, "d", func(ctx context.Context, _ *runstate.Stage) error {
			fnCtx <- ctx
			<-release
			return nil
		})
	}()
	fc := <-fnCtx
	defer close(release)
	start := time.Now()
	ws.lost <- errors.Join(runstate.ErrSessionLost, errors.New("the lease ran out"))
	select {
	case <-fc.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Do's ctx was not cancelled")
	}
	<-st.Context().Done()
	t.Logf("cancelled %v after the store's word", time.Since(start))
	assert.ErrorIs(t, context.Cause(fc), runstate.ErrSessionLost)
	assert.True(t, strings.Contains(context.Cause(st.Context()).Error(), "the lease ran out"))
	assert.ErrorIs(t, st.Complete(), runstate.ErrReadOnly)
}

// watchedStore is a memory store session that says when its lease is
// lost (runstate.LeaseWatcher).
type watchedStore struct {
	runstate.Store
	lost chan error
}

func (w *watchedStore) LeaseLost() <-chan error { return w.lost }

// OpenStoreContext's ctx bounds the opening's wait for the run's lock:
// at its deadline Open fails with ErrLockTimeout, when it is cancelled
// with context.Canceled, each at once and having written nothing; with
// the lock free, the run opens and the ctx's end afterwards does not
// touch it.
func TestOpenStoreContextBoundsTheLockWait(t *testing.T) {
	dir := t.TempDir()
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Close())
	before := readLedgerBytes(t, dir)
	lock := flock.New(filepath.Join(dir, "logs", "ledger.lock"))
	require.NoError(t, lock.Lock())
	open := func(ctx context.Context) error {
		done := make(chan error, 1)
		go func() {
			r, err := runstate.OpenStoreContext(ctx, runstate.NewFileStore(dir, nil), dir, testOptions())
			if r != nil {
				_ = r.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Open waited for the lock past its context's end")
			return nil
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, open(ctx), runstate.ErrLockTimeout)
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	require.ErrorIs(t, open(ctx), context.Canceled)
	assert.Equal(t, before, readLedgerBytes(t, dir), "nothing written")

	require.NoError(t, lock.Unlock())
	ctx, cancel = context.WithCancel(context.Background())
	r, err := runstate.OpenStoreContext(ctx, runstate.NewFileStore(dir, nil), dir, testOptions())
	require.NoError(t, err)
	cancel()
	require.NoError(t, r.Do(context.Background(), "after", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, r.Close())
}
