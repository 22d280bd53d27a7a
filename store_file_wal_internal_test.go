package runstate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate/internal/faultfs"
)

// The journal (logs/ledger.wal, store_file_wal.go): acknowledged records survive a
// power loss although the ledger itself is synced only when the ring
// wraps and on Close.

// ringOptions are faultOptions that make every batch durable through the
// ring when it can take it, whatever is faster here.
func ringOptions(ffs *faultfs.FS) *Options {
	o := faultOptions(ffs, nil)
	o.durable = durableRingOnly
	return o
}

// completed returns the stages the ledger in dir (and the journal) say
// are complete, in order.
func completed(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	for _, rec := range records(t, dir) {
		if rec.Ev == evComplete {
			out = append(out, rec.Stage)
		}
	}
	return out
}

// smallJournal creates dir with a journal of walMin bytes, so that a test
// wraps its ring after a few dozen checkpoints.
func smallJournal(t testing.TB, dir string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.FromSlash(walFile)), make([]byte, walMin), 0o644))
}

// A power loss while a batch's journal write is in flight (its fsync
// failed, then the power went): the disk kept any mix of old and new
// sectors of the ring and of the header slot. Every record acknowledged
// before it survives, and Open, Verify and the artifacts are clean. With
// one header slot instead of two, a torn slot takes the last good
// batch's end with it and this fails.
func TestJournalTornWrite(t *testing.T) {
	checkLeaks(t)
	rng := rand.New(rand.NewPCG(11, uint64(time.Now().UnixNano())))
	trials := 60
	if testing.Short() {
		trials = 15
	}
	for trial := 0; trial < trials; trial++ {
		dir := filepath.Join(t.TempDir(), "run")
		ffs := faultfs.New()
		r, err := Open(dir, ringOptions(ffs))
		require.NoError(t, err)
		n := 1 + rng.IntN(12)
		var acked []string
		for i := 0; i < n; i++ {
			stage := fmt.Sprintf("s%02d", i)
			require.NoError(t, doWrite(r, stage, strings.Repeat(stage, 1+rng.IntN(200))))
			acked = append(acked, stage)
		}
		ffs.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "ledger.wal", Err: syscall.EIO, Times: 1})
		require.Error(t, doWrite(r, "lost", strings.Repeat("x", rng.IntN(3000))), "trial %d: the fsync fails", trial)
		r.crash()
		require.NoError(t, ffs.PowerLoss(rng))

		r, err = Open(dir, &Options{Request: "fault injection"})
		require.NoError(t, err, "trial %d: Open after the power loss", trial)
		got := completed(t, dir)
		require.GreaterOrEqual(t, len(got), n, "trial %d: acknowledged stages lost: %v", trial, got)
		assert.Equal(t, acked, got[:n], "trial %d", trial)
		require.NoError(t, r.Close())
		requireVerified(t, dir)
	}
}

// Many checkpoints through a small journal: the ring wraps several times,
// and each time the ledger is fsync'd first. A power loss after any of
// them loses no acknowledged record; the ledger's own fsyncs are one per
// lap, not one per checkpoint.
func TestJournalWrap(t *testing.T) {
	checkLeaks(t)
	rng := rand.New(rand.NewPCG(12, uint64(time.Now().UnixNano())))
	for _, stop := range []int{90, 200, 260} {
		dir := t.TempDir()
		smallJournal(t, dir)
		ffs := faultfs.New()
		r, err := Open(dir, ringOptions(ffs))
		require.NoError(t, err)
		require.Equal(t, int64(walMin-walHeader), fileStoreOf(r).wal.ring, "the journal's own size is used")
		var acked []string
		for i := 0; i < stop; i++ {
			stage := fmt.Sprintf("s%03d", i)
			// ~730 bytes of records a checkpoint: the 60 KiB ring
			// wraps every ~80.
			require.NoError(t, r.Do(context.Background(), stage, func(_ context.Context, st *Stage) error {
				return st.WriteFile("artifacts/"+stage+".txt", []byte(stage))
			}, Value("big", strings.Repeat("v", 600))))
			acked = append(acked, stage)
		}
		ledgerSyncs := ffs.Calls(faultfs.OpSync, "ledger.jsonl")
		walSyncs := ffs.Calls(faultfs.OpSync, "ledger.wal")
		size := ledgerSize(t, dir)
		laps := int(size / (walMin - walHeader))
		t.Logf("%d checkpoints, %d KiB of ledger: %d ledger fsyncs, %d journal fsyncs", stop, size>>10, ledgerSyncs, walSyncs)
		assert.GreaterOrEqual(t, ledgerSyncs, laps, "the ledger is synced before the ring's bytes are reused")
		assert.LessOrEqual(t, ledgerSyncs, laps+2, "the ledger is synced once a lap, not once a checkpoint")
		assert.Greater(t, walSyncs, stop-ledgerSyncs-1, "the other checkpoints sync the journal")
		r.crash()
		require.NoError(t, ffs.PowerLoss(rng))

		r, err = Open(dir, &Options{Request: "fault injection"})
		require.NoError(t, err)
		assert.Equal(t, acked, completed(t, dir), "after %d checkpoints and a power loss", stop)
		require.NoError(t, r.Close())
		requireVerified(t, dir)
	}
}

func ledgerSize(t testing.TB, dir string) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(ledgerFile)))
	require.NoError(t, err)
	return fi.Size()
}

// Two sessions on one run (two processes, as far as the ledger lock
// goes): one appends a begin without an fsync, the other acknowledges a
// complete after it. The second's journal write must hold the first's
// begin too, or a power loss would leave a gap that the restore cannot
// cross, and the acknowledged complete would be lost.
func TestJournalCoversOtherWriters(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(13, uint64(time.Now().UnixNano())))
	for trial := 0; trial < 10; trial++ {
		dir := filepath.Join(t.TempDir(), "run")
		ffs := faultfs.New()
		r1, err := Open(dir, ringOptions(ffs))
		require.NoError(t, err)
		r2, err := Open(dir, ringOptions(ffs))
		require.NoError(t, err)
		require.NoError(t, doWrite(r1, "first", "1"))
		st, err := r1.Begin(ctx, "slow") // written, not synced
		require.NoError(t, err)
		require.NoError(t, doWrite(r2, "second", "2")) // acknowledged after the begin
		r1.crash()
		r2.crash()
		_ = st
		require.NoError(t, ffs.PowerLoss(rng))

		r, err := Open(dir, &Options{Request: "fault injection"})
		require.NoError(t, err)
		assert.Equal(t, []string{"first", "second"}, completed(t, dir), "trial %d", trial)
		require.NoError(t, r.Close())
		requireVerified(t, dir)
	}
}

// After a power loss and before any Open: Inspect, ReadLedger and Verify
// read the records only the journal holds; Verify says so; Repair copies
// them into the ledger, after which the ledger alone holds them.
func TestJournalReadersAndRepair(t *testing.T) {
	checkLeaks(t)
	dir := filepath.Join(t.TempDir(), "run")
	ffs := faultfs.New()
	r, err := Open(dir, ringOptions(ffs))
	require.NoError(t, err)
	for _, s := range []string{"a", "b", "c"} {
		require.NoError(t, doWrite(r, s, s))
	}
	r.crash()
	require.NoError(t, ffs.PowerLoss(nil)) // the ledger keeps what was synced: nothing but its name

	assert.Zero(t, ledgerSize(t, dir), "the ledger was never synced: it is empty after the power loss")
	s, err := Inspect(dir)
	require.NoError(t, err)
	c, ok := s.Stage("c")
	require.True(t, ok)
	assert.Equal(t, StateComplete, c.State)
	assert.Equal(t, []string{"a", "b", "c"}, completed(t, dir), "ReadLedger reads the journal's records")
	rep, err := Verify(dir)
	require.NoError(t, err)
	require.False(t, rep.OK())
	assert.Contains(t, rep.Problems[0].String(), "only logs/ledger.wal holds")
	assert.Contains(t, rep.Problems[0].String(), "the next Open, or runstate repair "+dirArg(dir)+", copies them into the ledger")

	rr, err := Repair(dir, nil)
	require.NoError(t, err)
	assert.Positive(t, rr.Restored)
	assert.Equal(t, rr.Restored, rr.Records)
	requireVerified(t, dir)
	// The ledger alone: with the journal gone, nothing is missing.
	require.NoError(t, os.Remove(filepath.Join(dir, filepath.FromSlash(walFile))))
	assert.Equal(t, []string{"a", "b", "c"}, completed(t, dir))
}

// Repair's TruncateAt clears the journal before it cuts: the records it
// drops never come back from the journal at the next Open.
func TestRepairTruncateClearsJournal(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "fault injection", durable: durableRingOnly})
	require.NoError(t, err)
	for _, s := range []string{"a", "b", "c"} {
		require.NoError(t, doWrite(r, s, s))
	}
	require.NoError(t, r.Close())
	var line int
	for _, rec := range records(t, dir) {
		if rec.Ev == evBegin && rec.Stage == "b" {
			line = int(rec.Seq)
		}
	}
	_, err = Repair(dir, &RepairOptions{TruncateAt: line, Force: true})
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, completed(t, dir))
	r, err = Open(dir, &Options{Request: "fault injection"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	assert.Equal(t, []string{"a"}, completed(t, dir), "the cut records stay cut")
	requireVerified(t, dir)
}

// A journal that runstate did not write (wrong size) is refused with an
// error that names it and says what to do; nothing is written.
func TestJournalBadSize(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "fault injection"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	wp := filepath.Join(dir, filepath.FromSlash(walFile))
	require.NoError(t, os.Truncate(wp, 1000))
	before := ledgerBytes(t, dir)
	_, err = Open(dir, &Options{Request: "fault injection"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), wp)
	assert.Contains(t, err.Error(), "move it away")
	assert.Equal(t, before, ledgerBytes(t, dir), "nothing written")
	_, err = Inspect(dir)
	assert.ErrorContains(t, err, wp)
}

// parseMark reads exactly what encode writes and nothing torn.
func TestWalMark(t *testing.T) {
	m := walMark{end: 123456789, seq: 4242, hash: strings.Repeat("ab", 32)}
	slot := make([]byte, walSlot)
	m.encode(slot)
	got, ok := parseMark(slot)
	require.True(t, ok)
	assert.Equal(t, m, got)
	for _, bad := range []func([]byte){
		func(b []byte) { clear(b) },
		func(b []byte) { b[len("runstate-wal 1 end=")] = 'x' },
		func(b []byte) { b[bytesIndex(b, "hash=")+5] = 'G' },
		func(b []byte) { b[bytesIndex(b, "\n")] = ' ' },
		func(b []byte) { copy(b, "runstate-wal 2") },
	} {
		b := append([]byte(nil), slot...)
		bad(b)
		_, ok := parseMark(b)
		assert.False(t, ok, "%q", b[:100])
	}
}

func bytesIndex(b []byte, s string) int { return strings.Index(string(b), s) }

// The Run measures which way of making a batch durable is faster on its
// file system and takes it, trying the other way now and then: with the
// ledger's fdatasync made slow through the seam, nearly every checkpoint
// goes through the ring; with the journal's made slow, through the
// ledger. Either way each checkpoint is one fsync. The slow way is made
// 10 ms slower: on a machine whose CPUs other processes keep busy, both
// ways' times grow by milliseconds of waiting for a CPU (2-4 ms on
// average here beside 3 spinning processes on 2 CPUs), which a 2 ms
// difference did not outlast. The fsyncs are the delays alone
// (delayOnly): with a disk other processes kept busy, the ledger's real
// fdatasync averaged 29 ms (an appended file's size goes through the
// file system's journal; the ring's preallocated slots do not), and the
// journal made 10 ms slower was still the faster way.
func TestDurableWayMeasured(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		slowLedger   bool
		wantRingMost bool
	}{
		{"ledger slow", true, true},
		{"journal slow", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCountFS()
			c.delayOnly = true
			if tc.slowLedger {
				c.ledgerDelay = 10 * time.Millisecond
			} else {
				c.walDelay = 10 * time.Millisecond
			}
			r := openCounted(t, t.TempDir(), c, Options{})
			for i := 0; i < 40; i++ { // learn
				require.NoError(t, smallDo(ctx, r, fmt.Sprintf("warm%d", i)))
			}
			syncs0, ring0 := c.commitSyncs.Load(), c.walSyncs.Load()
			const n = 128
			for i := 0; i < n; i++ {
				require.NoError(t, smallDo(ctx, r, fmt.Sprintf("s%d", i)))
			}
			syncs, ring := c.commitSyncs.Load()-syncs0, c.walSyncs.Load()-ring0
			t.Logf("%d checkpoints: %d fsyncs, %d of them the journal's; averages: ledger %v, ring %v",
				n, syncs, ring, fileStoreOf(r).wal.cost[wayLedger], fileStoreOf(r).wal.cost[wayRing])
			assert.Equal(t, int64(n), syncs, "one fsync a checkpoint")
			if tc.wantRingMost {
				assert.GreaterOrEqual(t, ring, int64(n*9/10), "the ring, the faster way here")
			} else {
				assert.LessOrEqual(t, ring, int64(n/10), "the ledger, the faster way here")
			}
			assert.Positive(t, min(ring, syncs-ring), "the other way is still tried now and then")
			require.NoError(t, r.Close())
			requireVerified(t, r.Dir())
		})
	}
}

// pick and note: the first batches try both ways; the ring is chosen only
// when it is 10% faster; the other way is tried exploreFor-1 measured
// batches every exploreEvery.
func TestDurableWayPick(t *testing.T) {
	run := func(ledger, ring time.Duration, batches int) (j journal, ways [2]int) {
		j = journal{best: wayRing, last: wayLedger}
		for i := 0; i < batches; i++ {
			w := j.pick()
			ways[w]++
			d := ledger
			if w == wayRing {
				d = ring
			}
			j.note(w, d)
		}
		return j, ways
	}
	j, ways := run(100*time.Microsecond, 50*time.Microsecond, 640)
	assert.Equal(t, wayRing, j.best)
	assert.InDelta(t, 640*(exploreFor)/exploreEvery, ways[wayLedger], 8, "the ledger tried now and then: %v", ways)
	j, _ = run(100*time.Microsecond, 95*time.Microsecond, 640)
	assert.Equal(t, wayLedger, j.best, "5% faster is not enough for the ring")
	j, ways = run(50*time.Microsecond, 100*time.Microsecond, 640)
	assert.Equal(t, wayLedger, j.best)
	assert.InDelta(t, 640*(exploreFor)/exploreEvery, ways[wayRing], 8, "the ring tried now and then: %v", ways)

	// One batch that took long (the kernel ran another process) does not
	// change the choice; a way slow twice in a row does.
	j, _ = run(100*time.Microsecond, 50*time.Microsecond, 640)
	j.note(wayRing, 50*time.Microsecond) // the ring's again after a trial
	j.note(wayRing, 50*time.Microsecond)
	j.note(wayRing, 20*time.Millisecond)
	assert.Equal(t, wayRing, j.best, "one slow batch alone: %v", j.cost)
	j.note(wayRing, 50*time.Microsecond)
	j.note(wayRing, 20*time.Millisecond)
	j.note(wayRing, 20*time.Millisecond)
	assert.Equal(t, wayLedger, j.best, "slow twice in a row: %v", j.cost)
}

// TestResumeFromSnapshotWithJournal: with logs/ledger.wal present, Open
// and Inspect resume from manifest.json, reading the ledger only in the
// ring's window (to check that the journal agrees with the snapshot), not
// the whole ledger. Before, lastPrev did not see through a line's crc
// field, so the check failed on every line and both replayed the ledger.
func TestResumeFromSnapshotWithJournal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	smallJournal(t, dir) // a ring of 60 KiB
	r, err := Open(dir, ringOptions(faultfs.New()))
	require.NoError(t, err)
	for i := range 1000 {
		require.NoError(t, r.Do(t.Context(), fmt.Sprintf("s%03d", i), func(context.Context, *Stage) error { return nil },
			Value("big", strings.Repeat("v", 600))))
	}
	require.NoError(t, r.Close()) // writes the snapshot; the journal's slots stand
	size := int64(len(ledgerBytes(t, dir)))
	require.Greater(t, size, int64(512<<10))
	require.Greater(t, acknowledged(osFS{}, dir), int64(0), "the journal names records")

	c := newCountFS()
	st, err := inspect(t.Context(), newDirStore(dir, Options{fs: c}), dir)
	require.NoError(t, err)
	assert.Len(t, st.Stages, 1000)
	assert.Less(t, c.ledgerRead.Load(), int64(128<<10), "Inspect read the window and the snapshot's record, of a %d-byte ledger", size)

	c = newCountFS()
	r = openCounted(t, dir, c, Options{Request: "fault injection"})
	assert.Less(t, c.ledgerRead.Load(), int64(128<<10), "Open read the window and the snapshot's record, of a %d-byte ledger", size)
	require.NoError(t, r.Close())

	// A stale journal: sessions without fsync append without it. The
	// check still reads the ring's window, not the ledger from there on.
	r, err = Open(dir, &Options{Request: "fault injection", NoSync: true})
	require.NoError(t, err)
	for i := range 1000 {
		require.NoError(t, r.Do(t.Context(), fmt.Sprintf("t%03d", i), func(context.Context, *Stage) error { return nil },
			Value("big", strings.Repeat("v", 600))))
	}
	require.NoError(t, r.Close())
	c = newCountFS()
	st, err = inspect(t.Context(), newDirStore(dir, Options{fs: c}), dir)
	require.NoError(t, err)
	assert.Len(t, st.Stages, 2000)
	assert.Less(t, c.ledgerRead.Load(), int64(128<<10), "Inspect with a stale journal")
}

// TestLastPrev: lastPrev finds the prev hash of the lines runstate writes,
// with a crc field and without.
func TestLastPrev(t *testing.T) {
	for _, name := range []string{"basic.jsonl", "crc.jsonl"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
		require.Greater(t, len(lines), 2, name)
		for i := 1; i < len(lines); i++ {
			prev, ok := lastPrev([]byte(lines[i]))
			if assert.True(t, ok, "%s line %d", name, i+1) {
				assert.Equal(t, lineHash([]byte(lines[i-1])), string(prev), "%s line %d", name, i+1)
			}
		}
	}
	for _, bad := range []string{"", "}", `{"prev":"x"}`, `{"seq":1,"prev":""}`, `{"prev":"` + strings.Repeat("a", 64) + `","crc":"0000000"}`} {
		_, ok := lastPrev([]byte(bad))
		assert.False(t, ok, bad)
	}
}

// BenchmarkInspectWithJournal inspects a run of 60,000 records whose
// journal names its last records: Inspect resumes from manifest.json and
// reads the ring's window of the ledger (PERF.md).
func BenchmarkInspectWithJournal(b *testing.B) {
	dir := b.TempDir()
	require.NoError(b, genRun(dir, 60_000, true))
	r, err := Open(dir, &Options{Request: "generated run"}) // with fsync: through the journal
	require.NoError(b, err)
	for i := range 300 {
		require.NoError(b, r.Do(b.Context(), fmt.Sprintf("bench-%d", i), func(context.Context, *Stage) error { return nil }))
	}
	require.NoError(b, r.Close())
	require.Positive(b, acknowledged(osFS{}, dir))
	b.ResetTimer()
	for b.Loop() {
		if _, err := Inspect(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// TestVerifyLiveRun: Verify of a run that another session appends to
// meanwhile (through the journal) finds nothing wrong: records appended
// after it measured the ledger are neither journal-only records nor a
// handoff or a manifest ahead of the ledger. (A manifest behind the
// ledger is said to be normal while a session runs: it is rewritten at
// most every ManifestInterval.)
func TestVerifyLiveRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	opts := ringOptions(faultfs.New())
	opts.ManifestInterval = -1 // projections as fresh as can be
	r, err := Open(dir, opts)
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, doWrite(r, "first", "x"))
	stop := make(chan struct{})
	wrote := make(chan int)
	go func() {
		n := 0
		defer func() { wrote <- n }()
		for ; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if doWrite(r, fmt.Sprintf("s%05d", n), "x") != nil {
				return
			}
		}
	}()
	var problems []string
	for range 300 {
		rep, err := Verify(dir)
		require.NoError(t, err)
		for _, p := range rep.Problems {
			if !strings.HasPrefix(p.What, "behind the ledger") {
				problems = append(problems, p.String())
			}
		}
	}
	close(stop)
	n := <-wrote
	require.Greater(t, n, 10, "the writer wrote while Verify ran")
	if !assert.Empty(t, len(problems), "problems in 300 Verifies of a live run") {
		t.Log(strings.Join(problems[:min(4, len(problems))], "\n"))
	}
	requireVerified(t, dir)
}

// A journal that cannot be opened is named once in the error, with what
// to do ("open P: open P: permission denied" before).
func TestJournalOpenErrorNamesItOnce(t *testing.T) {
	dir := t.TempDir()
	ffs := faultfs.New()
	r, err := Open(dir, faultOptions(ffs, nil))
	require.NoError(t, err)
	require.NoError(t, r.Close())
	ffs.Inject(faultfs.Rule{Op: faultfs.OpOpen, Path: "ledger.wal", Err: syscall.EACCES})
	_, err = Open(dir, faultOptions(ffs, nil))
	require.ErrorIs(t, err, syscall.EACCES)
	p := filepath.Join(dir, "logs", "ledger.wal")
	assert.Equal(t, 1, strings.Count(err.Error(), p), err.Error())
	assert.Contains(t, err.Error(), "make it readable")
}
