package runstatetest_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/runstate/runstate/runstatetest/storetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// memHarness runs the conformance suite on a MemStore: every session opens
// the same store with one working directory, as the processes of one
// machine share a run directory.
type memHarness struct {
	m   *runstatetest.MemStore
	dir string
}

func (h memHarness) Open(_ testing.TB, opts *runstate.Options) (*runstate.Run, error) {
	return h.m.Open(h.dir, opts)
}

func (h memHarness) Crash(_ testing.TB, run *runstate.Run) { runstatetest.Crash(run) }

func (h memHarness) Lines(testing.TB) [][]byte { return h.m.Lines() }

func (h memHarness) PowerLoss(testing.TB) { h.m.Crash() }

func (h memHarness) Store(testing.TB) runstate.Store { return h.m.Session() }

// TestMemStoreConformance: the memory store keeps every guarantee the
// conformance suite checks, the power loss included.
func TestMemStoreConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) storetest.Harness {
		return memHarness{m: runstatetest.NewMemStore(), dir: t.TempDir()}
	})
}

// TestMemStoreCrashDropsWhatWasNotSynced: a power loss keeps the lines
// that a Sync covered and drops the rest (here a begin, which needs no
// fsync); the sessions it killed cannot append, and the next one resumes.
func TestMemStoreCrashDropsWhatWasNotSynced(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	run, err := m.Open(t.TempDir(), &runstate.Options{Request: "r"})
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	if err := run.Do(ctx, "fetch", func(context.Context, *runstate.Stage) error { return nil }); err != nil {
		t.Fatal(err)
	}
	synced := len(m.Lines())
	if m.Durable() != synced {
		t.Fatalf("after Do returned, %d of %d lines are durable", m.Durable(), synced)
	}
	if _, err := run.Begin(ctx, "build"); err != nil {
		t.Fatal(err)
	}
	if len(m.Lines()) != synced+1 || m.Durable() != synced {
		t.Fatalf("after a Begin: %d lines, %d durable; want %d and %d", len(m.Lines()), m.Durable(), synced+1, synced)
	}
	m.Crash()
	if got := len(m.Lines()); got != synced {
		t.Errorf("after the power loss %d lines, want the %d synced", got, synced)
	}
	err = run.Skip(ctx, "deploy", "no")
	if !errors.Is(err, runstate.ErrSessionLost) && !errors.Is(err, runstate.ErrReadOnly) {
		t.Errorf("a session killed by the power loss appended, or failed with %v; want ErrSessionLost or ErrReadOnly", err)
	}
	next, err := m.Open(t.TempDir(), &runstate.Options{Request: "r"})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	st, err := next.Begin(ctx, "build")
	if err != nil {
		t.Fatalf("Begin after the power loss: %v", err)
	}
	if st.Attempt() != 1 {
		t.Errorf("build begun as attempt %d after its lost begin, want 1", st.Attempt())
	}
	_, err = next.Begin(ctx, "fetch")
	if !errors.Is(err, runstate.ErrDone) {
		t.Errorf("Begin of the stage completed before the power loss: %v, want ErrDone", err)
	}
}

// TestMemStoreLockIsExclusive: while one session's batch holds the writer
// lock, another's Lock waits, and gives up at its context's deadline with
// ErrLockTimeout naming the holder.
func TestMemStoreLockIsExclusive(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	a, b := m.Session(), m.Session()
	for i, s := range []runstate.Store{a, b} {
		if _, _, err := s.Open(ctx, fmt.Sprintf("session-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	held, err := a.Lock(ctx, runstate.Position{})
	if err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = b.Lock(wait, runstate.Position{})
	if !errors.Is(err, runstate.ErrLockTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock while another batch holds it: %v, want ErrLockTimeout", err)
	}
	if err == nil || !strings.Contains(err.Error(), "session-0") {
		t.Errorf("the lock timeout does not name the holder: %v", err)
	}
	if err := held.Unlock(); err != nil {
		t.Fatal(err)
	}
	got, err := b.Lock(ctx, runstate.Position{})
	if err != nil {
		t.Fatalf("Lock after the holder unlocked: %v", err)
	}
	if err := got.Unlock(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []runstate.Store{a, b} {
		if err := s.Close(true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Lock(ctx, runstate.Position{}); !errors.Is(err, runstate.ErrSessionLost) {
		t.Errorf("Lock after Close: %v, want ErrSessionLost", err)
	}
}

// chained returns lines ("a", "b" ...) as a batch's bytes and the
// Position after the last of them, following from.
func chained(from runstate.Position, lines ...string) ([]byte, runstate.Position) {
	var b []byte
	to := from
	for _, l := range lines {
		b = append(b, l+"\n"...)
		sum := sha256.Sum256([]byte(l))
		to = runstate.Position{Seq: to.Seq + 1, Hash: hex.EncodeToString(sum[:]), End: to.End + int64(len(l)) + 1, LastLen: int64(len(l)) + 1}
	}
	return b, to
}

// lockedSession opens session id on m and takes the writer lock from the
// start of the run.
func lockedSession(t *testing.T, m *runstatetest.MemStore, id string) (runstate.Store, runstate.Batch) {
	t.Helper()
	ctx := context.Background()
	s := m.Session()
	if _, _, err := s.Open(ctx, id); err != nil {
		t.Fatal(err)
	}
	b, err := s.Lock(ctx, runstate.Position{})
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

// TestMemStoreCrashKeepsOnlySynced drives the Store directly: a synced
// batch survives MemStore.Crash, an unsynced one and a snapshot that
// reflects it do not, the session is dead, and a new one goes on from the
// synced position.
func TestMemStoreCrashKeepsOnlySynced(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	s, b := lockedSession(t, m, "one")
	lines, p1 := chained(runstate.Position{}, "a", "b")
	if err := b.Append(nil, lines, p1); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	b.Publish(p1, []byte("snapshot 1"), []byte("handoff 1"))
	if err := b.Unlock(); err != nil {
		t.Fatal(err)
	}
	b, err := s.Lock(ctx, p1)
	if err != nil {
		t.Fatal(err)
	}
	lines, p2 := chained(p1, "c")
	if err := b.Append(nil, lines, p2); err != nil {
		t.Fatal(err)
	}
	b.Publish(p2, []byte("snapshot 2"), []byte("handoff 2"))
	if err := b.Unlock(); err != nil {
		t.Fatal(err)
	}
	if got := len(m.Lines()); got != 3 || m.Durable() != 2 {
		t.Fatalf("before the crash: %d lines, %d durable; want 3 and 2", got, m.Durable())
	}

	m.Crash()
	if got := m.Lines(); len(got) != 2 || string(got[0]) != "a" || string(got[1]) != "b" {
		t.Errorf("after the crash the lines are %q, want the synced a, b", got)
	}
	if got := string(m.Handoff()); got != "" {
		t.Errorf("after the crash the handoff is %q, which reflects a lost line", got)
	}
	if _, err := s.Lock(ctx, p1); !errors.Is(err, runstate.ErrSessionLost) {
		t.Errorf("Lock of a session the crash killed: %v, want ErrSessionLost", err)
	}
	next := m.Session()
	snap, at, err := next.Open(ctx, "two")
	if err != nil {
		t.Fatal(err)
	}
	if snap != nil || at != (runstate.Position{}) {
		t.Errorf("Open after the crash returned snapshot %q at %+v; the newest reflects a lost line, so none", snap, at)
	}
	live, err := next.Live(ctx, []string{"one", "two", "never-seen"})
	if err != nil {
		t.Fatal(err)
	}
	if live["one"] || !live["two"] || !live["never-seen"] {
		t.Errorf("Live = %v, want one gone (crashed), two alive, an unknown session alive", live)
	}
	if _, err := next.Lock(ctx, p2); !errors.Is(err, runstate.ErrCorrupt) {
		t.Errorf("Lock from a position the crash dropped: %v, want ErrCorrupt", err)
	}
	b, err = next.Lock(ctx, p1)
	if err != nil {
		t.Fatal(err)
	}
	var tail []string
	if err := b.Tail(func(line []byte) error { tail = append(tail, string(line)); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(tail) != 0 {
		t.Errorf("Tail from the last synced position: %q, want nothing", tail)
	}
	if err := b.Append(nil, []byte("x\n"), p1); err == nil {
		t.Errorf("Append to a position the lines do not reach (a reused seq) succeeded")
	}
	if err := b.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := next.Close(true); err != nil {
		t.Fatal(err)
	}
}

// TestMemStoreSnapshotMatchesRecords: Open returns the newest snapshot
// published, with its position, and Read passes the lines after it.
func TestMemStoreSnapshotMatchesRecords(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	s, b := lockedSession(t, m, "one")
	lines, p1 := chained(runstate.Position{}, "a")
	more, p2 := chained(p1, "b", "c")
	if err := b.Append(nil, lines, p1); err != nil {
		t.Fatal(err)
	}
	if err := b.Append(nil, more, p2); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	b.Publish(p1, []byte("at a"), nil)
	b.Publish(runstate.Position{}, []byte("older"), nil) // an older one never wins
	if err := b.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(false); err != nil {
		t.Fatal(err)
	}
	r := m.Session()
	snap, at, err := r.Open(ctx, "two")
	if err != nil {
		t.Fatal(err)
	}
	if string(snap) != "at a" || at != p1 {
		t.Errorf("Open returned snapshot %q at %+v, want %q at %+v", snap, at, "at a", p1)
	}
	var got []string
	torn, err := r.Read(ctx, at, func(line []byte) error { got = append(got, string(line)); return nil })
	if err != nil || torn != 0 || len(got) != 2 || got[0] != "b" || got[1] != "c" {
		t.Errorf("Read after the snapshot: %q, torn %d, %v; want b, c", got, torn, err)
	}
	if live, _ := r.Live(ctx, []string{"one"}); live["one"] {
		t.Errorf("a session closed as crashed is alive")
	}
}

// TestMemStoreHandoffSaysWhereItsRecordsAre: a memory store's handoff
// names the store, not a run directory's files (logs/ledger.jsonl,
// manifest.json) that its working directory does not have, nor a runstate
// command that cannot read it; the published handoff is the same text.
func TestMemStoreHandoffSaysWhereItsRecordsAre(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	dir := t.TempDir()
	r, err := m.Open(dir, &runstate.Options{Request: "handoff"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Plan(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	text, err := r.NextSteps()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "look at:  "+m.String()+": the records, in this process only") {
		t.Errorf("the handoff does not name the memory store:\n%s", text)
	}
	for _, bad := range []string{"ledger.jsonl", "manifest.json", "runstate status", dir} {
		if strings.Contains(text, bad) {
			t.Errorf("the handoff names %q, which a memory store does not have:\n%s", bad, text)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := string(m.Handoff()); !strings.HasSuffix(got, text[strings.Index(text, "\nlook at:"):]) {
		t.Errorf("the published handoff ends otherwise:\n%s", got)
	}
}

// A store that holds no record is no run: InspectStore's error says so and
// matches fs.ErrNotExist, as Inspect's does for a run directory that is
// not there, so that a caller tells "no run here" from a damaged one.
func TestInspectOfAnEmptyStoreIsNotExist(t *testing.T) {
	_, err := runstate.InspectStore(context.Background(), runstatetest.NewMemStore().Session())
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), "holds no record: the run was never created")
	_, err = runstate.Inspect(filepath.Join(t.TempDir(), "none"))
	require.ErrorIs(t, err, fs.ErrNotExist, "the same for a directory")
}

// TestMemSessionRefusedOpenLeavesItsRun: a second OpenStore on a Store
// from MemStore.Session is refused, as its doc says, and the Run it serves
// goes on. The refused OpenStore closed the store, as OpenStore closes a
// store it could not open: that ended the first Run's session, whose next
// call failed with ErrSessionLost.
func TestMemSessionRefusedOpenLeavesItsRun(t *testing.T) {
	ctx := context.Background()
	m := runstatetest.NewMemStore()
	s := m.Session()
	dir := t.TempDir()
	r1, err := runstate.OpenStore(s, dir, &runstate.Options{Request: "one run"})
	require.NoError(t, err)
	_, err = runstate.OpenStore(s, dir, &runstate.Options{Request: "one run"})
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "serves one Run: call Session again")

	require.NoError(t, r1.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, r1.Close())
	lines := m.Lines()
	assert.Contains(t, string(lines[len(lines)-1]), `"ev":"close"`)
	rep, err := runstate.VerifyStore(ctx, m.Session(), dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}
