package runstate_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
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

// plainStore is the file store seen only through the exported Store and
// Batch interfaces, as another module's store is: no TryLock, no side
// writes, no state handed over at Open. A Run on it takes the committer's
// generic paths (leadLater for every batch, the snapshot decoded and the
// tail read through Read).
type plainStore struct{ runstate.Store }

func (s plainStore) Lock(ctx context.Context, from runstate.Position) (runstate.Batch, error) {
	b, err := s.Store.Lock(ctx, from)
	if err != nil {
		return nil, err
	}
	return plainBatch{b}, nil
}

type plainBatch struct{ runstate.Batch }

// TestOpenStoreThroughTheInterfaceAlone runs stages, an effect, a crash and
// a resume on a Store that only has the exported methods: what another
// module's store gets. The run it leaves verifies, and Open of the same
// directory reads the same state.
func TestOpenStoreThroughTheInterfaceAlone(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := &runstate.Options{Request: testRequest, ManifestInterval: -1}
	open := func() *runstate.Run {
		r, err := runstate.OpenStore(plainStore{runstate.NewFileStore(dir, opts)}, dir, opts)
		require.NoError(t, err)
		return r
	}
	r := open()
	require.NoError(t, r.Do(ctx, "parse", writeStage("out/a.txt", "a")))
	receipt, err := r.Effect(ctx, "ticket", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) { return json.RawMessage(`"T-1"`), nil }})
	require.NoError(t, err)
	assert.JSONEq(t, `"T-1"`, string(receipt))
	st, err := r.Begin(ctx, "test")
	require.NoError(t, err)
	require.NoError(t, st.WriteFile("out/b.txt", []byte("b")))
	runstatetest.Crash(r)

	r = open() // from the snapshot, through Read
	s, err := r.Status()
	require.NoError(t, err)
	parse, _ := s.Stage("parse")
	assert.Equal(t, runstate.StateComplete, parse.State)
	test, _ := s.Stage("test")
	assert.Equal(t, runstate.StateInterrupted, test.State, "the crashed session is proven gone through Batch.Alive")
	called := false
	receipt, err = r.Effect(ctx, "ticket", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		called = true
		return json.RawMessage(`"T-2"`), nil
	}})
	require.NoError(t, err)
	assert.False(t, called, "a confirmed effect is never repeated")
	assert.JSONEq(t, `"T-1"`, string(receipt))
	require.NoError(t, r.Do(ctx, "test", writeStage("out/b.txt", "b")))
	want, err := r.Status()
	require.NoError(t, err)
	require.NoError(t, r.Close())

	assertVerifies(t, dir)
	r2, err := runstate.Open(dir, &runstate.Options{Request: testRequest})
	require.NoError(t, err)
	got, err := r2.Status()
	require.NoError(t, err)
	require.Len(t, got.Stages, len(want.Stages))
	for i, w := range want.Stages {
		g := got.Stages[i]
		assert.Equal(t, [3]any{w.Name, w.State, w.Attempt}, [3]any{g.Name, g.State, g.Attempt})
		assert.Equal(t, w.Outputs, g.Outputs)
	}
	require.NoError(t, r2.Close())
}

// The store-generic readers write nothing to the file store's directory,
// not even a lock file or a temp directory: a torn tail stays, and no
// file is created, changed or removed.
func TestStoreReadersWriteNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := runstate.Open(dir, &runstate.Options{Request: "readers"}) // with its journal
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "a", writeStage("out/a.txt", "a")))
	require.NoError(t, r.Close())
	for _, p := range []string{"logs/ledger.lock", "logs/tmp", "logs/sessions"} {
		require.NoError(t, os.RemoveAll(filepath.Join(dir, filepath.FromSlash(p))))
	}
	f, err := os.OpenFile(filepath.Join(dir, "logs", "ledger.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"seq":99`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	before := fileStates(t, dir)

	s := runstate.NewFileStore(dir, nil)
	st, err := runstate.InspectStore(ctx, s)
	require.NoError(t, err)
	assert.Equal(t, int64(9), st.Torn)
	_, err = runstate.NextStepsStore(ctx, s, dir)
	require.NoError(t, err)
	require.NoError(t, runstate.ReadStore(ctx, s, func(*runstate.Record) error { return nil }))
	_, err = runstate.VerifyStore(ctx, s, dir)
	require.NoError(t, err)
	assert.Equal(t, before, fileStates(t, dir))
}

// checkingStore is plainStore that is a runstate.WorkDirChecker: it notes
// each call and refuses with refuse when set.
type checkingStore struct {
	plainStore
	calls  *[]string // "dir|runID" of each call
	refuse error
}

func (s checkingStore) CheckWorkDir(dir, runID string) error {
	*s.calls = append(*s.calls, dir+"|"+runID)
	return s.refuse
}

// OpenStore asks a WorkDirChecker about the working directory before the
// session records anything: with "" for a run it is about to create, with
// the run's id for one it resumes; a refusal fails OpenStore with
// nothing recorded, neither the create record of a new run nor the open
// record of an existing one.
func TestOpenStoreChecksTheWorkDirBeforeRecording(t *testing.T) {
	dir := t.TempDir()
	opts := &runstate.Options{Request: testRequest}
	var calls []string
	open := func(refuse error) (*runstate.Run, error) {
		return runstate.OpenStore(checkingStore{plainStore{runstate.NewFileStore(dir, opts)}, &calls, refuse}, dir, opts)
	}
	refusal := errors.New("not this directory")
	_, err := open(refusal)
	require.ErrorIs(t, err, refusal)
	assert.Equal(t, []string{dir + "|"}, calls, "a new run is checked with no id")
	_, err = os.Stat(filepath.Join(dir, "logs", "ledger.jsonl"))
	if err == nil {
		n := 0
		require.NoError(t, runstate.ReadLedger(dir, func(*runstate.Record) error { n++; return nil }))
		assert.Zero(t, n, "the refused OpenStore created the run")
	}

	r, err := open(nil)
	require.NoError(t, err)
	id := r.ID()
	require.NoError(t, r.Close())
	var before int
	require.NoError(t, runstate.ReadLedger(dir, func(*runstate.Record) error { before++; return nil }))

	calls = nil
	_, err = open(refusal)
	require.ErrorIs(t, err, refusal)
	assert.Equal(t, []string{dir + "|" + id}, calls, "an existing run is checked with its id")
	after := 0
	require.NoError(t, runstate.ReadLedger(dir, func(*runstate.Record) error { after++; return nil }))
	assert.Equal(t, before, after, "the refused OpenStore recorded nothing")
}

// TestFileStoreServesOneRun: a second OpenStore on the Store that
// NewFileStore returned, while a Run uses it, is refused with ErrInvalid
// saying what to do, and the first Run goes on: its stages complete, its
// Close writes its close record, the ledger verifies. The second OpenStore
// took over the store's session, lock and files: the first Run's next
// call failed with "use of closed file" once the second closed, and the
// two Runs shared one lock that did not exclude them from each other.
func TestFileStoreServesOneRun(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := runstate.NewFileStore(dir, testOptions())
	r1, err := runstate.OpenStore(s, dir, testOptions())
	require.NoError(t, err)
	_, err = runstate.OpenStore(s, dir, testOptions())
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "serves one Run only: call NewFileStore again for another")

	require.NoError(t, r1.Do(ctx, "a", writeStage("artifacts/a", "a")))
	require.NoError(t, r1.Close())
	lines := checkLedger(t, dir)
	last := lines[len(lines)-1].rec
	assert.Equal(t, "close", last.Ev)
	assert.Equal(t, r1.Session(), last.Session)
	assert.Len(t, events(lines, "open", ""), 1, "one session opened")
	assert.Len(t, events(lines, "complete", "a"), 1)
}
