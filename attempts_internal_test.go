package runstate

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate/internal/faultfs"
)

// The fsync of a stage's end record fails (the file store over the fault
// file system): the Run turns read-only, as it always did, and now also
// stops the stage that runs beside it: its ctx is cancelled, the cause
// wrapping ErrReadOnly and the fsync's error. The failed stage is not
// "running in this session" for good either: its next Do is ErrReadOnly
// (open the run again), and a new session interrupts the stage beside and
// runs it again.
func TestFailedEndFsyncStopsTheRunsOtherStages(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ffs := faultfs.New()
	r, err := Open(dir, faultOptions(ffs, nil))
	require.NoError(t, err)
	running := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- r.Do(ctx, "beside", func(ctx context.Context, _ *Stage) error {
			close(running)
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(10 * time.Second):
				return nil
			}
		})
	}()
	<-running
	st, err := r.Begin(ctx, "a")
	require.NoError(t, err)
	ffs.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "ledger.wal", Err: syscall.EIO, Times: 1})
	ffs.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "ledger.jsonl", Err: syscall.EIO, Times: 1})
	require.ErrorIs(t, st.Complete(), syscall.EIO)
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrReadOnly, "the stage beside it was stopped")
		assert.ErrorIs(t, err, syscall.EIO)
	case <-time.After(5 * time.Second):
		t.Fatal("the stage beside the failed fsync was not cancelled")
	}
	assert.ErrorIs(t, context.Cause(st.Context()), ErrReadOnly)
	err = r.Do(ctx, "a", func(context.Context, *Stage) error { return nil })
	assert.ErrorIs(t, err, ErrReadOnly, "not ErrBusy: the Run is read-only, open the run again")
	_ = r.Close()

	r, err = Open(dir, &Options{Request: "fault injection"})
	require.NoError(t, err)
	for _, name := range []string{"a", "beside"} {
		require.NoError(t, r.Do(ctx, name, func(context.Context, *Stage) error { return nil }))
	}
	require.NoError(t, r.Close())
	var got []string
	for _, rec := range records(t, dir) {
		if rec.Stage != "" {
			got = append(got, rec.Ev+" "+rec.Stage)
		}
	}
	// a's complete was written before its fsync failed, and survived
	// (no power was lost): it counts once; beside was begun again.
	assert.Equal(t, []string{"begin beside", "begin a", "complete a", "interrupted beside", "begin beside", "complete beside"}, got)
	requireVerified(t, dir)
}
