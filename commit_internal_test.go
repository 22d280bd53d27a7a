package runstate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A panic while deciding a record must not leave the group commit's
// leader flag set: every later append would wait for ever.
func TestCommitSurvivesPanickingDecision(t *testing.T) {
	r, err := Open(t.TempDir(), &Options{Request: "panic", NoSync: true})
	require.NoError(t, err)
	defer r.Close()

	_, err = r.commit(false, func(*state) ([]*Record, error) { panic("bug") })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "internal error")

	done := make(chan error, 1)
	go func() { done <- r.Plan(context.Background(), "a") }()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("append after a panicking decision hangs")
	}
}

// A slow manifest rewrite (a run with many stages) stretches the interval
// so that rewriting the snapshot takes about 2% of the time at most.
func TestManifestIntervalStretchesWithCost(t *testing.T) {
	r, err := Open(t.TempDir(), &Options{Request: "interval", NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	r.c.mu.Lock()
	r.c.manifestCost = time.Millisecond
	r.c.mu.Unlock()
	assert.Equal(t, time.Second, r.manifestInterval(), "a cheap rewrite: the configured interval")
	r.c.mu.Lock()
	r.c.manifestCost = 100 * time.Millisecond
	r.c.mu.Unlock()
	assert.Equal(t, 5*time.Second, r.manifestInterval())

	// The cost is measured by writeManifest itself.
	r.stMu.Lock()
	r.writeManifest(fileStoreOf(r).begin(r.st.position()))
	r.stMu.Unlock()
	r.c.mu.Lock()
	cost := r.c.manifestCost
	r.c.mu.Unlock()
	assert.Positive(t, cost)
	assert.Less(t, cost, 5*time.Second)
}

// A begin alone does not republish the handoff: the stage's end does, or
// the lag timer once the stage has run for handoffLag. Verify accepts a
// handoff that lags by begins only (a session killed mid-stage leaves
// one), and flags one that lags by anything else.
func TestHandoffLagsByBeginsOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := newCountFS()
	r := openCounted(t, dir, c, Options{ManifestInterval: -1}) // only the handoff lags
	require.NoError(t, r.Plan(ctx, "short", "short2", "long"))
	require.NoError(t, smallDo(ctx, r, "short"))
	// Every handoff rewrite is a complete's or the lag timer's: on a
	// loaded machine a "short" stage may outlast handoffLag, and the
	// timer then rewrites it too (counted in lagFlushes).
	lags := r.c.lag.flushes.Load
	h0, l0 := c.handoffs.Load(), lags()

	// A short stage: one handoff rewrite, by its complete.
	require.NoError(t, smallDo(ctx, r, "short2"))
	assert.Equal(t, h0+1+lags()-l0, c.handoffs.Load(), "a Do rewrites the handoff once (and the timer, if it outlasted handoffLag)")

	// A long stage: the timer shows it running.
	l1 := lags()
	st, err := r.Begin(ctx, "long")
	require.NoError(t, err)
	assert.Equal(t, h0+1+lags()-l0, c.handoffs.Load(), "Begin does not rewrite the handoff at once")
	require.Eventually(t, func() bool { return lags() == l1+1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, h0+1+lags()-l0, c.handoffs.Load())
	seq, text := readHandoff(t, dir)
	assert.Equal(t, r.st.pos.seq, seq)
	assert.Contains(t, text, "next:     long (running, attempt 1)")
	require.NoError(t, st.Complete())
	assert.Equal(t, h0+2+lags()-l0, c.handoffs.Load())

	// Killed right after a Begin: the handoff lags by the begin (unless
	// the timer ran first), and Verify says nothing about it.
	l2 := lags()
	_, err = r.Begin(ctx, "killed")
	require.NoError(t, err)
	r.crash()
	l3 := lags()
	time.Sleep(2 * handoffLag)
	assert.Equal(t, l3, lags(), "no republishing after the process died")
	seq, _ = readHandoff(t, dir)
	rep, err := Verify(dir)
	require.NoError(t, err)
	if l3 == l2 {
		assert.Equal(t, rep.Records-1, seq, "the handoff lags by the begin")
	} else {
		assert.Equal(t, rep.Records, seq, "the timer ran before the crash: the handoff shows the begin")
	}
	assert.True(t, rep.OK(), "%v", rep.Problems)

	// A handoff behind a complete is a problem.
	r2, err := Open(dir, &Options{Request: "perf", ManifestInterval: -1})
	require.NoError(t, err)
	require.NoError(t, smallDo(ctx, r2, "killed"))
	stale, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(nextStepsFile)))
	require.NoError(t, err)
	require.NoError(t, smallDo(ctx, r2, "after"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.FromSlash(nextStepsFile)), stale, 0o644))
	rep, err = Verify(dir)
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1, "%v", rep.Problems)
	assert.Contains(t, rep.Problems[0].What, "reflects seq")

	// Close waits for a timer under way and stops it: nothing after.
	_, err = r2.Begin(ctx, "at-close")
	require.NoError(t, err)
	require.NoError(t, r2.Close())
	r2.c.mu.Lock()
	assert.Nil(t, r2.c.lag.timer)
	r2.c.mu.Unlock()
	rep, err = Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}

func readHandoff(t *testing.T, dir string) (int64, string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(nextStepsFile))
	seq, err := nextStepsSeq(dir)
	require.NoError(t, err)
	text, err := os.ReadFile(p)
	require.NoError(t, err)
	return seq, string(text)
}

// The handoff files are rewritten in place and cut only when the new text
// is shorter than the file: whatever the order of lengths, next-steps.txt
// holds exactly the last text published.
func TestHandoffRewrittenInPlace(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "inplace", NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	p := filepath.Join(dir, filepath.FromSlash(nextStepsFile))
	for i, n := range []int{900, 900, 10, 500, 20, 20, 1000, 1, 0, 700} {
		text := strings.Repeat(string(rune('a'+i)), n)
		r.stMu.Lock()
		require.NoError(t, fileStoreOf(r).handoff.publish(fileStoreOf(r), []byte(text)))
		r.stMu.Unlock()
		got, err := os.ReadFile(p)
		require.NoError(t, err)
		require.Equal(t, text, string(got), "publish %d (%d bytes)", i, n)
	}
}

// A Begin that also records another session's attempt as interrupted
// republishes the handoff at once: it lags by begin records only.
func TestHandoffCurrentAfterInterruptedBegin(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r1, err := Open(dir, &Options{Request: "lag"})
	require.NoError(t, err)
	defer r1.Close()
	r2, err := Open(dir, &Options{Request: "lag"})
	require.NoError(t, err)
	_, err = r2.Begin(ctx, "x")
	require.NoError(t, err)
	r2.crash() // the session dies with x running

	_, err = r1.Begin(ctx, "x")
	require.NoError(t, err)
	recs := records(t, dir)
	require.GreaterOrEqual(t, len(recs), 2)
	assert.Equal(t, []string{"interrupted", "begin"}, evs(recs[len(recs)-2:]))
	seq, _ := readHandoff(t, dir)
	assert.Equal(t, recs[len(recs)-1].Seq, seq, "the interrupted record is in the handoff when Begin returns")
	rep, err := Verify(dir)
	require.NoError(t, err)
	for _, p := range rep.Problems {
		assert.NotContains(t, p.File, "next-steps", "%v", p)
	}
}

// The lag timer's transaction republishes a lagging handoff even when it
// shares its batch with more begins (which alone would leave it behind).
func TestHandoffFlushInABatchOfBegins(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "flush", NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	_, err = r.Begin(ctx, "x")
	require.NoError(t, err)
	r.stopFlush(false) // no timer: this test sends the flush itself
	r.stMu.RLock()
	behind := r.c.lag.behind
	r.stMu.RUnlock()
	require.True(t, behind, "a begin alone leaves the handoff behind")

	begin := &tx{lazy: true, done: make(chan struct{}), fn: func(*state) ([]*Record, error) {
		return []*Record{{Ev: evBegin, Stage: "y", Attempt: 1}}, nil
	}}
	flush := &tx{flush: true, done: make(chan struct{}), fn: func(*state) ([]*Record, error) { return nil, nil }}
	r.runBatch([]*tx{begin, flush})
	require.NoError(t, begin.err)
	recs := records(t, dir)
	seq, text := readHandoff(t, dir)
	assert.Equal(t, recs[len(recs)-1].Seq, seq, "the flush published the handoff, with the begin beside it")
	assert.NotContains(t, text, "(not started)")
}

// The leader fails only the transaction whose record it cannot encode, or
// whose line the reader would refuse (longer than maxLine): the others of
// the batch commit, the state holds only what was written, and later calls
// work. (A bad value used to panic in the leader and wedge the Run.)
func TestLeaderFailsOnlyTheTransactionItCannotEncode(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "leader", NoSync: true})
	require.NoError(t, err)
	mk := func(recs ...*Record) *tx {
		return &tx{sync: true, done: make(chan struct{}), fn: func(*state) ([]*Record, error) { return recs, nil }}
	}
	good1 := mk(&Record{Ev: evSkip, Stage: "a", Reason: "first"})
	notJSON := mk(&Record{Ev: evSkip, Stage: "b"}, &Record{Ev: evConfirm, Key: "k", Data: json.RawMessage("OK")})
	tooLong := mk(&Record{Ev: evConfirm, Key: "k2", Data: json.RawMessage(`"` + strings.Repeat("x", maxLine) + `"`)})
	good2 := mk(&Record{Ev: evSkip, Stage: "c", Reason: "last"})
	seq := r.st.pos.seq

	done := make(chan struct{})
	go func() {
		defer close(done)
		r.runBatch([]*tx{good1, notJSON, tooLong, good2})
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the batch hangs")
	}
	assert.NoError(t, good1.err)
	assert.NoError(t, good2.err)
	require.ErrorIs(t, notJSON.err, ErrInvalid)
	assert.Contains(t, notJSON.err.Error(), `effect "k"`)
	require.ErrorIs(t, tooLong.err, ErrInvalid)
	assert.Contains(t, tooLong.err.Error(), fmt.Sprint(maxLine))
	assert.Equal(t, seq+2, r.st.pos.seq, "two records written")
	assert.Nil(t, r.st.stages["b"], "nothing of a failed transaction is applied")
	assert.Nil(t, r.st.effects["k"])

	require.NoError(t, r.Plan(context.Background(), "a", "b", "c"))
	require.NoError(t, r.Close())
	rep, err := Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	st, err := Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, 2, st.Done, "a and c skipped, b not")
}

// fileStoreOf is the file store behind r (the tests that look inside it).
func fileStoreOf(r *Run) *dirStore { return r.store.(*dirStore) }
