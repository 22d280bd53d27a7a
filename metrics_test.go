package runstate_test

import (
	"context"
	"encoding/json"
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

// TestMetricsFromScriptedHistory plays three sessions with a known history
// and checks every metric derived from the ledger against it.
func TestMetricsFromScriptedHistory(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeValue := func(v int) func(context.Context, *runstate.Stage) error {
		return func(_ context.Context, st *runstate.Stage) error {
			return st.WriteFile("artifacts/a.txt", fmt.Appendf(nil, "v%d\n", v))
		}
	}
	ok := func(name string) func(context.Context, *runstate.Stage) error {
		return func(_ context.Context, st *runstate.Stage) error {
			return st.WriteFile("artifacts/"+name+".txt", []byte(name))
		}
	}
	sent := func(context.Context, string) (json.RawMessage, error) { return json.RawMessage(`{"id":1}`), nil }

	// Session 1: a, b done; e1 sent; e2's Do fails; c fails once.
	r := i3Open(t, dir, nil)
	require.NoError(t, r.Plan(ctx, "a", "b", "c"))
	require.NoError(t, r.Do(ctx, "a", writeValue(1), runstate.Value("v", 1)))
	require.NoError(t, r.Do(ctx, "b", ok("b"), runstate.After("a")))
	_, err := r.Effect(ctx, "e1", runstate.Effect{Do: sent})
	require.NoError(t, err)
	_, err = r.Effect(ctx, "e2", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, errors.New("timeout")
	}})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	require.Error(t, r.Do(ctx, "c", failing(errors.New("flaky"))))
	require.NoError(t, r.Close())

	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, runstate.Metrics{Sessions: 1, Failures: 1, EffectsUnconfirmed: 1}, st.Metrics)
	require.Len(t, st.Blockers, 1)
	assert.Equal(t, "e2", st.Blockers[0].Key)

	// Session 2 (resumed): a, b skipped; c done; e1 deduplicated twice;
	// a's input changes (stale), so b's does (stale); c invalidated by an
	// operator; e2 confirmed by Check.
	r = i3Open(t, dir, nil)
	time.Sleep(30 * time.Millisecond) // before the first stage record
	require.NoError(t, r.Do(ctx, "a", writeValue(1), runstate.Value("v", 1)))
	require.NoError(t, r.Do(ctx, "b", ok("b"), runstate.After("a")))
	require.NoError(t, r.Do(ctx, "c", ok("c")))
	for range 2 {
		_, err = r.Effect(ctx, "e1", runstate.Effect{Do: sent})
		require.NoError(t, err)
	}
	require.NoError(t, r.Do(ctx, "a", writeValue(2), runstate.Value("v", 2)))
	require.NoError(t, r.Do(ctx, "b", ok("b"), runstate.After("a")))
	require.NoError(t, r.Invalidate(ctx, "c", "re-scoped"))
	_, err = r.Effect(ctx, "e2", runstate.Effect{Do: sent, Check: func(context.Context, string) (json.RawMessage, bool, error) {
		return json.RawMessage(`{"id":2}`), true, nil
	}})
	require.NoError(t, err)
	require.NoError(t, r.Close())

	// Session 3 (resumed): b skipped; a's output altered by hand (stale).
	r = i3Open(t, dir, nil)
	require.NoError(t, r.Do(ctx, "b", ok("b"), runstate.After("a")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "artifacts", "a.txt"), []byte("edited\n"), 0o644))
	require.NoError(t, r.Do(ctx, "a", writeValue(2), runstate.Value("v", 2)))
	require.NoError(t, r.Close())

	st, err = runstate.Inspect(dir)
	require.NoError(t, err)
	m := st.Metrics
	assert.GreaterOrEqual(t, m.TimeToFirstRecord, 30*time.Millisecond)
	assert.Less(t, m.TimeToFirstRecord, time.Minute)
	m.TimeToFirstRecord = 0
	assert.Equal(t, runstate.Metrics{
		Sessions:            3,
		ResumedSessions:     2,
		SkippedOnResume:     3, // a, b in session 2; b in session 3
		StaleRejections:     3, // a's input, b's After, a's output
		Invalidations:       1,
		Failures:            1,
		EffectsDeduplicated: 3, // e1 twice, e2 by Check
	}, m)
	assert.Empty(t, st.Blockers)

	// The same figures from a full replay, without the snapshot.
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	replayed, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, st.Metrics, replayed.Metrics)
}
