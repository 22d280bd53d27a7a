package runstate_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// The store-generic readers see, on the file store, what the run-directory
// readers see: the same records, the same status, the same verdict.
func TestStoreReadersMatchDirectoryReaders(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, r.Do(ctx, "parse", writeStage("out/a.txt", "a")))
	require.NoError(t, r.Do(ctx, "test", writeStage("out/b.txt", "b")))
	require.NoError(t, r.Close())
	s := runstate.NewFileStore(dir, nil)

	var want, got []runstate.Record
	require.NoError(t, runstate.ReadLedger(dir, func(rec *runstate.Record) error { want = append(want, *rec); return nil }))
	require.NoError(t, runstate.ReadStore(ctx, s, func(rec *runstate.Record) error { got = append(got, *rec); return nil }))
	assert.Equal(t, want, got)

	ws, err := runstate.Inspect(dir)
	require.NoError(t, err)
	gs, err := runstate.InspectStore(ctx, s)
	require.NoError(t, err)
	assert.Equal(t, ws.Stages, gs.Stages)
	assert.Equal(t, ws.Seq, gs.Seq)

	wn, err := runstate.NextSteps(dir)
	require.NoError(t, err)
	gn, err := runstate.NextStepsStore(ctx, s, dir)
	require.NoError(t, err)
	assert.Equal(t, wn, gn)

	rep, err := runstate.VerifyStore(ctx, s, dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)

	// A torn last line is reported, not returned.
	f, err := os.OpenFile(filepath.Join(dir, "logs", "ledger.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"seq":99`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	gs, err = runstate.InspectStore(ctx, s)
	require.NoError(t, err)
	assert.Equal(t, int64(9), gs.Torn)
}
