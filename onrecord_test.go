package runstate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// recorder is an OnRecord that keeps what it is given.
type recorder struct {
	mu   sync.Mutex
	recs []runstate.Record
}

func (rc *recorder) on(rec runstate.Record) {
	rc.mu.Lock()
	rc.recs = append(rc.recs, rec)
	rc.mu.Unlock()
}

func (rc *recorder) list() []runstate.Record {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]runstate.Record(nil), rc.recs...)
}

// Eight goroutines checkpoint at once, with fsyncs (group commit, begins
// written beside a batch's fsync): OnRecord gets every record of the
// ledger once, in ledger order, and never under the Run's locks (it
// reads the Run's Status and NextSteps, which would wait for them).
func TestOnRecordSeesEveryRecordInLedgerOrder(t *testing.T) {
	dir := t.TempDir()
	var rc recorder
	var r *runstate.Run
	var calling sync.Mutex
	on := func(rec runstate.Record) {
		if !calling.TryLock() {
			t.Error("OnRecord called by two goroutines at once")
			return
		}
		defer calling.Unlock()
		if r != nil && rec.Seq > 0 {
			s, err := r.Status()
			if err == nil && s.Seq < rec.Seq {
				t.Errorf("OnRecord(seq %d) before the state has it (seq %d)", rec.Seq, s.Seq)
			}
			_, _ = r.NextSteps()
		}
		rc.on(rec)
	}
	r, err := runstate.Open(dir, &runstate.Options{Request: testRequest, OnRecord: on})
	require.NoError(t, err)
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 15 {
				name := fmt.Sprintf("g%d/s%d", g, i)
				assert.NoError(t, r.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
					return st.WriteFile("artifacts/"+strings.ReplaceAll(name, "/", "-"), []byte(name))
				}))
			}
		})
	}
	wg.Wait()
	require.NoError(t, r.Close())

	var seqs []int64
	for _, rec := range rc.list() {
		seqs = append(seqs, rec.Seq)
	}
	lines := parseLedger(t, readLedgerBytes(t, dir))
	want := make([]int64, len(lines))
	for i, l := range lines {
		want[i] = l.rec.Seq
	}
	assert.Equal(t, want, seqs, "every record, once, in ledger order")
	got := rc.list()
	for i, l := range lines {
		if i < len(got) {
			assert.Equal(t, l.rec.Ev, got[i].Ev)
			assert.Equal(t, l.rec.Stage, got[i].Stage)
			assert.Equal(t, l.rec.Prev, got[i].Prev)
		}
	}
}

// OnRecord runs for a record once its call would return: the record is
// in the ledger file, and the handoff names its seq.
func TestOnRecordRunsOnceTheRecordIsWritten(t *testing.T) {
	dir := t.TempDir()
	checked := 0
	opts := testOptions()
	opts.OnRecord = func(rec runstate.Record) {
		if rec.Seq == 0 {
			return
		}
		checked++
		lines := parseLedger(t, readLedgerBytes(t, dir))
		assert.GreaterOrEqual(t, int64(len(lines)), rec.Seq, "seq %d (%s) is in the ledger", rec.Seq, rec.Ev)
		if rec.Ev == "complete" {
			next, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
			require.NoError(t, err)
			assert.Contains(t, string(next), "as of ledger seq "+strconv.FormatInt(rec.Seq, 10))
		}
	}
	r := openRun(t, dir, opts)
	require.NoError(t, r.Do(context.Background(), "a", noop))
	require.NoError(t, r.Close())
	assert.Equal(t, 5, checked, "create, open, begin, complete, close")
}

// Begin that finds a stage done writes nothing; OnRecord gets a notice
// (seq 0, ev skip) so that a progress display can say so. The run's
// Skip is a real skip record.
func TestOnRecordNoticesStagesFoundDone(t *testing.T) {
	var rc recorder
	opts := testOptions()
	opts.OnRecord = rc.on
	r, _ := newTestRunWith(t, opts)
	ctx := context.Background()
	require.NoError(t, r.Do(ctx, "a", noop))
	require.NoError(t, r.Skip(ctx, "b", "docs only"))
	n := len(rc.list())
	require.NoError(t, r.Do(ctx, "a", noop))
	_, err := r.Begin(ctx, "b")
	require.ErrorIs(t, err, runstate.ErrDone)
	got := rc.list()[n:]
	require.Len(t, got, 2)
	assert.Equal(t, runstate.Record{At: got[0].At, Ev: "skip", Session: r.Session(), Stage: "a", Attempt: 1, Reason: "done, evidence holds"}, got[0])
	assert.Equal(t, "skipped: docs only", got[1].Reason)
	assert.Equal(t, int64(0), got[1].Seq)
}

func newTestRunWith(t testing.TB, opts *runstate.Options) (*runstate.Run, string) {
	t.Helper()
	dir := t.TempDir()
	return openRun(t, dir, opts), dir
}

// What OnRecord is given is its own copy: changing it changes nothing.
func TestOnRecordGetsACopy(t *testing.T) {
	opts := testOptions()
	opts.OnRecord = func(rec runstate.Record) {
		for k := range rec.Inputs {
			rec.Inputs[k] = "sha256:changed"
		}
	}
	r, _ := newTestRunWith(t, opts)
	ctx := context.Background()
	require.NoError(t, r.Do(ctx, "a", noop, runstate.Value("v", 1)))
	_, err := r.Begin(ctx, "a", runstate.Value("v", 1))
	assert.ErrorIs(t, err, runstate.ErrDone)
}

// A Stage says why its attempt runs; so does its begin record.
func TestStageReasonSaysWhyTheAttemptRuns(t *testing.T) {
	r, dir := newTestRun(t)
	ctx := context.Background()
	begin := func(inputs ...runstate.Input) *runstate.Stage {
		t.Helper()
		st, err := r.Begin(ctx, "s", inputs...)
		require.NoError(t, err)
		return st
	}
	st := begin(runstate.Value("model", "small"))
	assert.Equal(t, "first attempt", st.Reason())
	require.NoError(t, st.WriteFile("artifacts/x.txt", []byte("x")))
	require.NoError(t, st.Complete())

	st = begin(runstate.Value("model", "large"))
	assert.Equal(t, "input model changed", st.Reason())
	require.NoError(t, st.Fail(errors.New("rate limited")))
	st = begin(runstate.Value("model", "large"))
	assert.Equal(t, "attempt 2 failed: rate limited; retrying", st.Reason())
	require.NoError(t, st.WriteFile("artifacts/x.txt", []byte("x")))
	require.NoError(t, st.Complete())

	require.NoError(t, os.WriteFile(filepath.Join(dir, "artifacts", "x.txt"), []byte("edited"), 0o644))
	st = begin(runstate.Value("model", "large"))
	assert.Contains(t, st.Reason(), "output artifacts/x.txt altered")
	require.NoError(t, st.Complete())

	require.NoError(t, r.Invalidate(ctx, "s", "ticket was re-scoped"))
	st = begin(runstate.Value("model", "large"))
	assert.Equal(t, "ticket was re-scoped", st.Reason())
	require.NoError(t, st.Complete())

	st = begin(runstate.Value("model", "large"), runstate.ValidFor(1))
	assert.Contains(t, st.Reason(), "evidence expired")

	// A session that dies mid-attempt: the next one says so.
	require.NoError(t, r.Close())
	r2, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	defer r2.Close()
	st2, err := r2.Begin(ctx, "s", runstate.Value("model", "large"))
	require.NoError(t, err)
	assert.Regexp(t, `^attempt 6 was interrupted: session [0-9a-f-]+ is gone$`, st2.Reason())

	var reasons []string
	for _, l := range parseLedger(t, readLedgerBytes(t, dir)) {
		if l.rec.Ev == "begin" {
			reasons = append(reasons, l.rec.Reason)
		}
	}
	require.Len(t, reasons, 7)
	assert.Equal(t, "first attempt", reasons[0], "the begin record says it too")
	assert.Equal(t, st2.Reason(), reasons[6])
}
