package runstate_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// betStore is a memory store whose batches bet (runstate.Optimist): its
// LockOptimistic takes the memory store's lock without waiting, and the
// batch loses its bet (ErrConflict, nothing written) when lose is set. It
// counts the store's Reads.
type betStore struct {
	runstate.Store
	lose  atomic.Bool
	lost  atomic.Int64
	reads atomic.Int64
}

func (s *betStore) Read(ctx context.Context, from runstate.Position, fn func([]byte) error) (int64, error) {
	s.reads.Add(1)
	return s.Store.Read(ctx, from, fn)
}

func (s *betStore) LockOptimistic(from runstate.Position) (runstate.OptimisticBatch, bool) {
	b, ok, err := s.Store.(runstate.TryLocker).TryLock(from)
	if err != nil || !ok {
		return nil, false
	}
	return &betBatch{Batch: b, s: s}, true
}

type betBatch struct {
	runstate.Batch
	s *betStore
}

func (b *betBatch) bet() error {
	if b.s.lose.Swap(false) {
		b.s.lost.Add(1)
		return fmt.Errorf("%w: the test's store lost the bet", runstate.ErrConflict)
	}
	return nil
}

func (b *betBatch) Sync(ctx context.Context) error {
	if err := b.bet(); err != nil {
		return err
	}
	return b.Batch.Sync(ctx)
}

func (b *betBatch) Confirm(ctx context.Context) error { return b.Sync(ctx) }

// TestLostBetIsTakenBackWithoutAReread: when an optimistic batch loses its
// bet (ErrConflict), the committer takes its records back from the state
// in memory, without reading the run's records again from the first, and
// decides them again: the call succeeds, and the session's state is the
// one read afresh from the store.
func TestLostBetIsTakenBackWithoutAReread(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	s := &betStore{Store: m.Session()}
	r, err := runstate.OpenStore(s, t.TempDir(), &runstate.Options{Request: "bet"})
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.Plan(ctx, "a", "b", "c"))
	require.NoError(t, r.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }))

	for _, stage := range []string{"b", "c"} {
		reads := s.reads.Load()
		s.lose.Store(true)
		require.NoError(t, r.Do(ctx, stage, func(context.Context, *runstate.Stage) error { return nil }))
		require.False(t, s.lose.Load(), "a batch of %s bet, and lost", stage)
		assert.Equal(t, reads, s.reads.Load(), "%s: the lost bet is taken back without reading the store", stage)
	}
	assert.EqualValues(t, 2, s.lost.Load())

	got, err := r.Status()
	require.NoError(t, err)
	want, err := runstate.InspectStore(ctx, m.Session())
	require.NoError(t, err)
	for _, st := range [][]runstate.StageStatus{want.Stages, got.Stages} {
		for i := range st {
			if len(st[i].Inputs) == 0 {
				st[i].Inputs = nil // a record decoded has nil for the writer's empty map
			}
		}
	}
	assert.Equal(t, want.Stages, got.Stages, "the session's state is the store's")
	assert.Equal(t, want.Seq, got.Seq)
	assert.Equal(t, want.Metrics, got.Metrics)
}
