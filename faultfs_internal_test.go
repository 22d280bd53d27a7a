package runstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate/internal/faultfs"
	"github.com/runstate/runstate/internal/leakcheck"
	"github.com/runstate/runstate/internal/testhook"
)

// Fault injection through the fileSystem seam: a full disk, short writes,
// a failed fsync, a read-only directory, failed renames and power loss.

func checkLeaks(t testing.TB) {
	before := leakcheck.Snapshot()
	t.Cleanup(func() {
		if err := leakcheck.Find(before, 5*time.Second); err != nil {
			t.Errorf("goroutines leaked: %v", err)
		}
	})
}

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func faultOptions(ffs *faultfs.FS, log *logBuffer) *Options {
	o := &Options{Request: "fault injection", fs: ffs}
	if log != nil {
		o.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return o
}

func ledgerBytes(t testing.TB, dir string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(ledgerFile)))
	require.NoError(t, err)
	return data
}

func doWrite(r *Run, stage, content string) error {
	return r.Do(context.Background(), stage, func(_ context.Context, st *Stage) error {
		return st.WriteFile("artifacts/"+strings.ReplaceAll(stage, "/", "-")+".txt", []byte(content))
	})
}

func requireVerified(t testing.TB, dir string) *Report {
	t.Helper()
	rep, err := Verify(dir)
	require.NoError(t, err)
	require.True(t, rep.OK(), "verify %s: %v", dir, rep.Problems)
	return rep
}

func TestFaultDiskFullOnAppend(t *testing.T) {
	checkLeaks(t)
	for _, tc := range []struct {
		name  string
		short int
	}{{"nothing written", 0}, {"short write", -1}, {"one byte", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ffs := faultfs.New()
			r, err := Open(dir, faultOptions(ffs, nil))
			require.NoError(t, err)
			require.NoError(t, r.Plan(context.Background(), "a", "b"))
			require.NoError(t, doWrite(r, "a", "A"))
			before := ledgerBytes(t, dir)

			// The begin of b fails: the disk is full.
			ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "ledger.jsonl", Err: syscall.ENOSPC, Short: tc.short, Times: 1})
			err = doWrite(r, "b", "B")
			var werr *WriteError
			require.ErrorAs(t, err, &werr)
			assert.ErrorIs(t, err, syscall.ENOSPC)
			assert.Equal(t, "write", werr.Op)
			assert.False(t, werr.Sticky, "a failed write that was cut back is not sticky")
			assert.Contains(t, err.Error(), filepath.Join(dir, "logs", "ledger.jsonl"), "the error names the file")
			assert.Equal(t, before, ledgerBytes(t, dir), "the ledger is cut back to its last good record")

			// The complete of b fails the same way; the stage stays begun
			// and its Complete may be retried.
			st, err := r.Begin(context.Background(), "b")
			require.NoError(t, err)
			require.NoError(t, st.WriteFile("artifacts/b.txt", []byte("B")))
			mid := ledgerBytes(t, dir)
			ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "ledger.jsonl", Err: syscall.ENOSPC, Short: tc.short, Times: 1})
			err = st.Complete()
			require.ErrorAs(t, err, &werr)
			assert.Equal(t, mid, ledgerBytes(t, dir), "nothing of the failed complete is left")
			require.NoError(t, st.Complete(), "the disk has room again")
			require.NoError(t, r.Close())

			recs := records(t, dir)
			assert.True(t, bytes.HasPrefix(ledgerBytes(t, dir), before), "nothing acknowledged before is lost")
			assert.Equal(t, []string{"create", "open", "plan", "begin", "complete", "begin", "complete", "close"}, evs(recs))
			requireVerified(t, dir)
		})
	}
}

func records(t testing.TB, dir string) []*Record {
	t.Helper()
	var recs []*Record
	require.NoError(t, ReadLedger(dir, func(r *Record) error {
		recs = append(recs, r)
		return nil
	}))
	return recs
}

func evs(recs []*Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Ev)
	}
	return out
}

func TestFaultShortWriteThatCannotBeCutBack(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	ffs := faultfs.New()
	r, err := Open(dir, faultOptions(ffs, nil))
	require.NoError(t, err)
	require.NoError(t, doWrite(r, "a", "A"))
	before := ledgerBytes(t, dir)
	ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "ledger.jsonl", Err: syscall.ENOSPC, Short: 10, Times: 1})
	ffs.Inject(faultfs.Rule{Op: faultfs.OpTruncate, Path: "ledger.jsonl", Err: syscall.EIO, Times: 1})
	err = doWrite(r, "b", "B")
	var werr *WriteError
	require.ErrorAs(t, err, &werr)
	assert.True(t, werr.Sticky, "a torn write that stays in the file makes the run read-only")
	err = r.Plan(context.Background(), "x")
	assert.ErrorIs(t, err, ErrReadOnly)
	require.ErrorIs(t, r.Close(), ErrReadOnly, "Close returns the sticky error")

	// A fresh session cuts the torn bytes aside; nothing acknowledged is lost.
	r, err = Open(dir, faultOptions(faultfs.New(), nil))
	require.NoError(t, err)
	require.NoError(t, doWrite(r, "b", "B"))
	require.NoError(t, r.Close())
	assert.True(t, bytes.HasPrefix(ledgerBytes(t, dir), before))
	torn, _ := filepath.Glob(filepath.Join(dir, "logs", "ledger.jsonl.torn-*"))
	assert.Len(t, torn, 1, "the torn bytes were saved aside")
	requireVerified(t, dir)
}

func TestFaultFsyncFailureIsSticky(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	ffs := faultfs.New()
	r, err := Open(dir, faultOptions(ffs, nil))
	require.NoError(t, err)
	require.NoError(t, doWrite(r, "a", "A"))
	st, err := r.Begin(ctx, "b")
	require.NoError(t, err)
	// A checkpoint's fsync is the ledger's or the journal's (store_file_wal.go),
	// whichever is faster here: the first of them fails.
	ffs.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "ledger.wal", Err: syscall.EIO, Times: 1})
	ffs.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "ledger.jsonl", Err: syscall.EIO, Times: 1})
	commitSyncs := func() int { return ffs.Calls(faultfs.OpSync, "ledger.jsonl") + ffs.Calls(faultfs.OpSync, "ledger.wal") }
	syncs := commitSyncs()
	err = st.Complete()
	var werr *WriteError
	require.ErrorAs(t, err, &werr)
	assert.ErrorIs(t, err, syscall.EIO)
	assert.Equal(t, "sync", werr.Op)
	assert.True(t, werr.Sticky)
	assert.Contains(t, err.Error(), "read-only")

	// Every later write is refused, and the ledger is never synced again:
	// the kernel may have dropped the pages, a second fsync could lie.
	for name, call := range map[string]func() error{
		"Plan":    func() error { return r.Plan(ctx, "a", "b", "c") },
		"Begin":   func() error { _, err := r.Begin(ctx, "c"); return err },
		"Do":      func() error { return doWrite(r, "c", "C") },
		"Skip":    func() error { return r.Skip(ctx, "c", "no") },
		"Approve": func() error { return r.Approve(ctx, "c", "me", "") },
		"Effect": func() error {
			_, err := r.Effect(ctx, "k", Effect{Do: func(context.Context, string) (json.RawMessage, error) {
				t.Error("Do called on a read-only run")
				return nil, nil
			}})
			return err
		},
		"Complete": st.Complete,
	} {
		err := call()
		assert.ErrorIs(t, err, ErrReadOnly, name)
	}
	assert.Equal(t, syncs+1, commitSyncs(), "the failed fsync was not retried")
	_ = r.Close()
	assert.Equal(t, syncs+1, commitSyncs(), "Close does not sync either")

	// A new session (a fresh process) opens the run cleanly.
	r, err = Open(dir, &Options{Request: "fault injection"})
	require.NoError(t, err)
	require.NoError(t, doWrite(r, "c", "C"))
	require.NoError(t, r.Close())
	requireVerified(t, dir)
}

func TestFaultReadOnlyDirectory(t *testing.T) {
	checkLeaks(t)
	t.Run("new run", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		ffs := faultfs.New()
		ffs.ReadOnly()
		_, err := Open(dir, faultOptions(ffs, nil))
		require.Error(t, err)
		assert.ErrorIs(t, err, syscall.EROFS)
		assert.Contains(t, err.Error(), dir, "the error names the directory")
		assert.Contains(t, err.Error(), "writable", "and says what to check")
	})
	t.Run("existing run", func(t *testing.T) {
		dir := t.TempDir()
		r, err := Open(dir, &Options{Request: "fault injection"})
		require.NoError(t, err)
		require.NoError(t, doWrite(r, "a", "A"))
		require.NoError(t, r.Close())
		before := ledgerBytes(t, dir)

		ffs := faultfs.New()
		ffs.ReadOnly()
		_, err = Open(dir, faultOptions(ffs, nil))
		require.Error(t, err)
		assert.ErrorIs(t, err, syscall.EROFS)
		assert.Contains(t, err.Error(), filepath.Join(dir, "logs", "ledger.jsonl"), "the error names the file")
		assert.Equal(t, before, ledgerBytes(t, dir))

		// Readers need no write access.
		st, err := Inspect(dir)
		require.NoError(t, err)
		s, _ := st.Stage("a")
		assert.Equal(t, StateComplete, s.State)
	})
}

func TestFaultRenameFailsForProjections(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	ffs := faultfs.New()
	var log logBuffer
	opts := faultOptions(ffs, &log)
	opts.ManifestInterval = -1 // a manifest after every append
	r, err := Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, doWrite(r, "a", "A"))
	requireVerified(t, dir)

	ffs.Inject(faultfs.Rule{Op: faultfs.OpRename, Err: syscall.EIO})
	require.NoError(t, doWrite(r, "b", "B"), "a projection that cannot be written does not fail the call")
	require.NoError(t, r.Plan(context.Background(), "a", "b"))
	assert.Contains(t, log.String(), "cannot write the handoff")
	assert.Contains(t, log.String(), "cannot write the manifest")
	rep, err := Verify(dir)
	require.NoError(t, err)
	var files []string
	for _, p := range rep.Problems {
		files = append(files, filepath.Base(p.File))
	}
	assert.ElementsMatch(t, []string{"manifest.json", "next-steps.txt"}, files, "the projections are behind, nothing else: %v", rep.Problems)
	require.NoError(t, r.Close())
	tmp, err := os.ReadDir(filepath.Join(dir, filepath.FromSlash(tmpDir)))
	require.NoError(t, err)
	assert.Empty(t, tmp, "failed renames leave no temp file")

	// The next Open rebuilds them.
	r, err = Open(dir, &Options{Request: "fault injection"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	requireVerified(t, dir)
	st, err := Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, 2, st.Done)
}

// powerPipeline is the pipeline of the power-loss tests: stages and an
// effect, with every acknowledged record noted in acks.
type powerPipeline struct {
	mu   sync.Mutex
	acks map[int64]string // seq -> "ev stage/key" of records acknowledged to the caller
	sent map[string]int   // the fake receiving system: deliveries per key
}

func (p *powerPipeline) ack(r *Run, ev, name string) {
	st, err := r.Status()
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev {
	case evComplete:
		s, _ := st.Stage(name)
		p.acks[s.DoneSeq] = ev + " " + name
	case evConfirm:
		for _, e := range st.Effects {
			if e.Key == name {
				p.acks[e.Seq] = ev + " " + name
			}
		}
	case evPlan:
		p.acks[st.Seq] = ev
	}
}

func (p *powerPipeline) run(ctx context.Context, r *Run) error {
	stages := []string{"fetch", "parse", "build", "report"}
	if err := r.Plan(ctx, stages...); err != nil {
		return err
	}
	p.ack(r, evPlan, "")
	for i, name := range stages {
		in := []Input{}
		if i > 0 {
			in = append(in, After(stages[i-1]))
		}
		content := strings.Repeat(name+"\n", 20*(i+1))
		if err := r.Do(ctx, name, func(_ context.Context, st *Stage) error {
			return st.WriteFile("artifacts/"+name+".txt", []byte(content))
		}, in...); err != nil {
			return err
		}
		p.ack(r, evComplete, name)
		if i == 1 {
			key := "notify"
			_, err := r.Effect(ctx, key, Effect{
				Do: func(_ context.Context, full string) (json.RawMessage, error) {
					p.mu.Lock()
					defer p.mu.Unlock()
					p.sent[full]++
					return json.RawMessage(`{"ok":true}`), nil
				},
				Check: func(_ context.Context, full string) (json.RawMessage, bool, error) {
					p.mu.Lock()
					defer p.mu.Unlock()
					return json.RawMessage(`{"ok":true}`), p.sent[full] > 0, nil
				},
			})
			if err != nil {
				return err
			}
			p.ack(r, evConfirm, key)
		}
	}
	return nil
}

// powerLossTrial runs the pipeline in a fresh directory on a fault file
// system, stops it at crash point p's skip+1'th crossing, drops everything
// not synced (or, with torn, keeps a random part of it; with sector too,
// sector by sector under the whole model, faultfs.PowerLossSectors), and
// checks that every acknowledged record survived, that Open is clean, and
// that the run resumes to the reference's artifacts with its effect
// delivered once. Under the whole model Open may refuse damage that no
// durable copy covers; refused reports that, after checking that every
// acknowledged record is before the damage (so the advised cut drops none).
func powerLossTrial(t *testing.T, ref string, way durableWay, p testhook.Point, skip int, torn *rand.Rand, sector int) (acked, lost int, refused bool) {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "run") // Open creates it: its entry must be made durable too
	ffs := faultfs.New()
	pl := &powerPipeline{acks: map[int64]string{}, sent: map[string]int{}}
	opts := faultOptions(ffs, nil)
	opts.durable = way
	r, err := Open(dir, opts)
	require.NoError(t, err)
	fired := false
	disarm := testhook.Arm(&testhook.Trigger{Run: r, Point: p, Skip: skip, Fire: func(any, testhook.Point, string) error {
		fired = true
		r.crash()
		return testhook.ErrCrashed
	}})
	err = pl.run(ctx, r)
	disarm()
	require.True(t, fired, "the pipeline crossed %s %d times", p, skip+1)
	require.ErrorIs(t, err, testhook.ErrCrashed)
	if sector > 0 {
		require.NoError(t, ffs.PowerLossSectors(torn, sector))
	} else {
		require.NoError(t, ffs.PowerLoss(torn))
	}

	// Every acknowledged record survived, and Open is clean.
	r, err = Open(dir, &Options{Request: "fault injection"})
	var ce *CorruptError
	if sector > 0 && errors.As(err, &ce) {
		refused = true
		at := ce.Line
		if errors.Is(ce.Err, errBrokenChain) {
			at-- // the line before may be the damaged one
		}
		for seq, what := range pl.acks {
			assert.Less(t, seq, int64(at), "power loss at %s %d: acknowledged record seq %d (%s) is at or after the damage Open refuses: %v", p, skip, seq, what, err)
		}
		_, rerr := Repair(dir, &RepairOptions{TruncateAt: at, Force: true})
		require.NoError(t, rerr)
		r, err = Open(dir, &Options{Request: "fault injection"})
	}
	require.NoError(t, err, "Open after a power loss at %s %d", p, skip)
	got := map[int64]string{}
	for _, rec := range records(t, dir) {
		name := rec.Stage
		if rec.Key != "" {
			name = rec.Key
		}
		got[rec.Seq] = strings.TrimSpace(rec.Ev + " " + name)
	}
	for seq, what := range pl.acks {
		acked++
		if got[seq] != what {
			lost++
			t.Errorf("power loss at %s %d: acknowledged record seq %d (%s) lost; the ledger has %q", p, skip, seq, what, got[seq])
		}
	}
	require.NoError(t, pl.run(ctx, r))
	require.NoError(t, r.Close())
	requireVerified(t, dir)
	assert.Equal(t, readTree(t, ref), readTree(t, dir), "artifacts after a power loss at %s %d", p, skip)
	for k, c := range pl.sent {
		assert.Equal(t, 1, c, "effect %s delivered %d times", k, c)
	}
	return acked, lost, refused
}

func TestFaultPowerLoss(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	ref := t.TempDir()
	pl := &powerPipeline{acks: map[int64]string{}, sent: map[string]int{}}
	r, err := Open(ref, &Options{Request: "fault injection"})
	require.NoError(t, err)
	counts := map[testhook.Point]*atomic.Int64{}
	var disarm []func()
	for p := testhook.Point(1); p < testhook.NumPoints; p++ {
		counts[p] = &atomic.Int64{}
		disarm = append(disarm, testhook.Arm(&testhook.Trigger{Run: r, Point: p, Count: counts[p]}))
	}
	require.NoError(t, pl.run(ctx, r))
	for _, d := range disarm {
		d()
	}
	require.NoError(t, r.Close())

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(7, seed))
	trials, acked, refused := 0, 0, 0
	for p := testhook.Point(1); p < testhook.NumPoints; p++ {
		n := int(counts[p].Load())
		require.Positive(t, n, "%s crossed", p)
		for skip := 0; skip < n; skip++ {
			// Each batch made durable by the ledger's fdatasync, by the
			// journal's ring (store_file_wal.go), and by whichever is faster here,
			// switching between them as the Run measures.
			for _, way := range []durableWay{durableLedgerOnly, durableRingOnly, durableMeasured} {
				// Nothing unsynced kept; a random part kept, every
				// other time a prefix of a file's growth, else sector
				// by sector (512 or 4096 bytes) kept, lost, zeroed or
				// garbled.
				for i, torn := range []*rand.Rand{nil, rng} {
					sector := 0
					if i == 1 {
						sector = []int{0, 512, 4096}[trials/2%3]
					}
					a, lost, no := powerLossTrial(t, ref, way, p, skip, torn, sector)
					require.Zero(t, lost, "seed %d", seed)
					acked += a
					trials++
					if no {
						refused++
					}
				}
			}
		}
	}
	t.Logf("%d power losses (seed %d), %d acknowledged records checked, none lost; %d refused damage no durable copy covered, every acknowledged record before it", trials, seed, acked, refused)
}

func readTree(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	root := filepath.Join(dir, "artifacts")
	ents, err := os.ReadDir(root)
	require.NoError(t, err)
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(root, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = string(data)
	}
	return out
}

// The power-loss model has teeth: with NoSync, acknowledged records are
// lost, and the model says so.
func TestFaultPowerLossCatchesNoSync(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	ffs := faultfs.New()
	opts := faultOptions(ffs, nil)
	opts.NoSync = true
	r, err := Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, doWrite(r, "a", "A"))
	r.crash()
	durable, ok := ffs.Durable(filepath.Join(dir, filepath.FromSlash(ledgerFile)))
	assert.False(t, ok && len(durable) > 0, "nothing of the ledger is durable without fsync")
	require.NoError(t, ffs.PowerLoss(nil))
	_, err = os.Stat(filepath.Join(dir, filepath.FromSlash(ledgerFile)))
	assert.True(t, os.IsNotExist(err), "the ledger's name was never made durable: %v", err)
}
