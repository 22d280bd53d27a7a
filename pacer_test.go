package runstate_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pacedStore is a memory store that paces its projections (a
// runstate.Pacer): PublishDue says the handoff is due only while due is
// set, and every batch counts the handoffs and manifests it is given.
type pacedStore struct {
	runstate.Store
	mu        sync.Mutex
	due       bool
	handoffs  int
	manifests int
}

func (s *pacedStore) PublishDue() (manifest, handoff bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return true, s.due
}

func (s *pacedStore) setDue(due bool) {
	s.mu.Lock()
	s.due = due
	s.mu.Unlock()
}

// given returns the handoffs and manifests published so far.
func (s *pacedStore) given() (handoffs, manifests int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handoffs, s.manifests
}

func (s *pacedStore) Lock(ctx context.Context, from runstate.Position) (runstate.Batch, error) {
	b, err := s.Store.Lock(ctx, from)
	if err != nil {
		return nil, err
	}
	return &countingBatch{Batch: b, s: s}, nil
}

type countingBatch struct {
	runstate.Batch
	s *pacedStore
}

func (b *countingBatch) Publish(at runstate.Position, manifest, handoff []byte) {
	b.s.mu.Lock()
	if handoff != nil {
		b.s.handoffs++
	}
	if manifest != nil {
		b.s.manifests++
	}
	b.s.mu.Unlock()
	b.Batch.Publish(at, manifest, handoff)
}

// handoffSeq is the seq the first line of a handoff names.
func handoffSeq(handoff []byte) string {
	line, _, _ := strings.Cut(string(handoff), "\n")
	_, after, _ := strings.Cut(line, "as of ledger seq ")
	seq, _, _ := strings.Cut(after, " ")
	return seq
}

// TestPacedStoreGetsOnlyTheHandoffsItWrites: a store that paces its
// projections (runstate.Pacer) is given a handoff only when it says one
// is due: stages that complete while it is not due render none; once it
// is due again, the handoff timer publishes the newest state without
// another call; and a clean Close publishes the final state (the close
// record's) whatever the store says.
func TestPacedStoreGetsOnlyTheHandoffsItWrites(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	s := &pacedStore{Store: m.Session()}
	r, err := runstate.OpenStore(s, t.TempDir(), &runstate.Options{Request: "paced"})
	require.NoError(t, err)
	opened, _ := s.given()

	const n = 20
	for i := range n {
		require.NoError(t, r.Do(ctx, fmt.Sprintf("s%d", i), func(context.Context, *runstate.Stage) error { return nil }))
	}
	handoffs, _ := s.given()
	assert.Equal(t, opened, handoffs, "no handoff rendered for %d completes while the store said none was due", n)

	want, err := r.NextSteps()
	require.NoError(t, err)
	s.setDue(true)
	deadline := time.Now().Add(10 * time.Second) // handoffLag, on a loaded machine
	for time.Now().Before(deadline) && string(m.Handoff()) != want {
		time.Sleep(5 * time.Millisecond)
	}
	assert.Equal(t, want, string(m.Handoff()), "once due, the handoff timer publishes the newest handoff")
	handoffs, _ = s.given()
	assert.LessOrEqual(t, handoffs-opened, 2, "the lagging handoff is rendered once (or twice, racing the timer), not per complete")

	s.setDue(false)
	require.NoError(t, r.Do(ctx, "last", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, r.Close())
	lines := m.Lines()
	assert.Equal(t, fmt.Sprint(len(lines)), handoffSeq(m.Handoff()), "a clean Close publishes the handoff as of the close record")
	assert.Contains(t, string(lines[len(lines)-1]), `"ev":"close"`)
	assert.Contains(t, string(m.Handoff()), "last complete")
}

// TestUnpacedStoreGetsEveryHandoff: a store that is no Pacer (the file
// store, the memory store) is given the handoff after every complete, so
// that it is current when Do returns.
func TestUnpacedStoreGetsEveryHandoff(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	r, err := m.Open(t.TempDir(), &runstate.Options{Request: "unpaced"})
	require.NoError(t, err)
	defer r.Close()
	for i := range 5 {
		require.NoError(t, r.Do(ctx, fmt.Sprintf("s%d", i), func(context.Context, *runstate.Stage) error { return nil }))
		want, err := r.NextSteps()
		require.NoError(t, err)
		assert.Equal(t, want, string(m.Handoff()), "the handoff is current when Do %d returns", i)
	}
}
