package runstate_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// memBlobs is a Blobs in memory, shared by the sessions of a test (as
// pgstore's blob tables are): a MemStore keeps no bytes of its own.
type memBlobs struct {
	mu   sync.Mutex
	data map[string][]byte
	gets atomic.Int64
}

func (b *memBlobs) Missing(_ context.Context, sums []string) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, s := range sums {
		if _, ok := b.data[s]; !ok {
			out = append(out, s)
		}
	}
	return out, nil
}

func (b *memBlobs) Put(_ context.Context, sum string, size int64, r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if int64(len(data)) != size {
		return fmt.Errorf("size %d, not %d", len(data), size)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.data[sum] = data
	return nil
}

func (b *memBlobs) Get(_ context.Context, sum string) (io.ReadCloser, error) {
	b.gets.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	data, ok := b.data[sum]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", sum, fs.ErrNotExist)
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}

// blobStore is a MemStore session that keeps outputs' bytes in blobs, and
// counts its Locks.
type blobStore struct {
	runstate.Store
	blobs *memBlobs
	locks *atomic.Int64
}

func (s blobStore) Blobs() runstate.Blobs { return s.blobs }

func (s blobStore) Lock(ctx context.Context, from runstate.Position) (runstate.Batch, error) {
	s.locks.Add(1)
	return s.Store.Lock(ctx, from)
}

type blobRuns struct {
	m     *runstatetest.MemStore
	blobs *memBlobs
	locks atomic.Int64
}

func newBlobRuns() *blobRuns {
	return &blobRuns{m: runstatetest.NewMemStore(), blobs: &memBlobs{data: map[string][]byte{}}}
}

func (b *blobRuns) open(t *testing.T, dir string) *runstate.Run {
	t.Helper()
	r, err := runstate.OpenStore(blobStore{Store: b.m.Session(), blobs: b.blobs, locks: &b.locks}, dir, &runstate.Options{Request: "after fetch"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func sumHex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// aDone makes a run whose stage a wrote data to out/a.txt in a new
// directory, with one session on it there; it returns the runs, the
// directory and that session.
func aDone(t *testing.T, data string) (*blobRuns, string, *runstate.Run) {
	t.Helper()
	br := newBlobRuns()
	dir := t.TempDir()
	r1 := br.open(t, dir)
	writeOut(t, r1, data)
	return br, dir, r1
}

// writeOut runs stage "a", writing data to out/a.txt as a command would
// (os.WriteFile, then Stage.Output).
func writeOut(t *testing.T, r *runstate.Run, data string) {
	t.Helper()
	st, err := r.Begin(context.Background(), "a")
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(r.Dir(), "out"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(r.Dir(), "out", "a.txt"), []byte(data), 0o644))
	require.NoError(t, st.Output("out/a.txt"))
	require.NoError(t, st.Complete())
}

// Two sessions share one working directory (two `runstate exec` of one
// run on one machine, as the conformance suite's memHarness has them).
// Session 1 runs stage a again: its attempt has written the new bytes of
// out/a.txt. Session 2's view of the run is older (a complete, with the
// old bytes): a Begin of b After a must not write a's old bytes over the
// running attempt's new ones (under the lock a is running: ErrNotReady),
// or a's complete records the old bytes as its new attempt's output.
func TestStaleViewBeginAfterLeavesARunningAttemptsBytes(t *testing.T) {
	ctx := context.Background()
	br, dir, r1 := aDone(t, "old\n")
	r2 := br.open(t, dir) // its view: a complete, "old"

	require.NoError(t, r1.Invalidate(ctx, "a", "redo"))
	st, err := r1.Begin(ctx, "a")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "out", "a.txt"), []byte("new\n"), 0o644))
	require.NoError(t, st.Output("out/a.txt"))

	_, err = r2.Begin(ctx, "b", runstate.After("a"))
	require.ErrorIs(t, err, runstate.ErrNotReady)
	got, err := os.ReadFile(filepath.Join(dir, "out", "a.txt"))
	require.NoError(t, err)
	assert.Equal(t, "new\n", string(got), "the running attempt's bytes stay")

	require.NoError(t, st.Complete())
	status, err := r1.Status()
	require.NoError(t, err)
	a, _ := status.Stage("a")
	require.Len(t, a.Outputs, 1)
	assert.Equal(t, sumHex([]byte("new\n")), a.Outputs[0].SHA256, "a's second attempt records the bytes it wrote")
}

// A Begin of b After a and c, c not done: ErrNotReady, as before the
// fetch came first; it leaves the local copy of a's output alone (no
// fetch from the store, no write into the directory) for a stage that
// does not begin. runstate exec -wait calls Begin every few seconds.
func TestNotReadyBeginFetchesNothing(t *testing.T) {
	ctx := context.Background()
	br, dir, r1 := aDone(t, "old\n")
	require.NoError(t, os.Remove(filepath.Join(dir, "out", "a.txt")))

	gets := br.blobs.gets.Load()
	for range 3 {
		_, err := r1.Begin(ctx, "b", runstate.After("a"), runstate.After("c"))
		require.ErrorIs(t, err, runstate.ErrNotReady)
	}
	assert.Equal(t, gets, br.blobs.gets.Load(), "no fetch for a Begin that is not ready")
}

// Session 2 saw a complete with an output; a ran again elsewhere and now
// has none. The decision under the lock finds other After outputs (none)
// than were looked at: Begin must not take the run's lock eleven times
// for it.
func TestBeginAfterAStageThatLostItsOutputsLocksOnceOrTwice(t *testing.T) {
	ctx := context.Background()
	br, dir, r1 := aDone(t, "old\n")
	r2 := br.open(t, dir) // its view: a complete, with out/a.txt
	require.NoError(t, r1.Invalidate(ctx, "a", "redo"))
	st, err := r1.Begin(ctx, "a")
	require.NoError(t, err)
	require.NoError(t, st.Complete()) // no outputs now

	before := br.locks.Load()
	stB, err := r2.Begin(ctx, "b", runstate.After("a"))
	require.NoError(t, err)
	assert.LessOrEqual(t, br.locks.Load()-before, int64(2), "Locks taken by one Begin")
	require.NoError(t, stB.Complete())
}

// A Begin of b After a whose outputs are in place in the directory, as
// the session's view and the run record them (its session wrote them), takes the run's lock once
// and fetches nothing: what the look outside the lock hashed is what the
// decision under it asks for.
func TestBeginAfterOutputsInPlaceLocksOnce(t *testing.T) {
	ctx := context.Background()
	br, _, r := aDone(t, "in place\n")

	locks, gets := br.locks.Load(), br.blobs.gets.Load()
	st, err := r.Begin(ctx, "b", runstate.After("a"))
	require.NoError(t, err)
	assert.Equal(t, int64(1), br.locks.Load()-locks, "Locks taken by one Begin")
	assert.Equal(t, gets, br.blobs.gets.Load(), "nothing fetched")
	require.NoError(t, st.Complete())
}
