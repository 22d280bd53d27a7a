package runstate_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Whole records lost from the ledger's end (a ledger restored from an old
// backup, copied badly, cut by a file system that lost its end), which
// manifest.json shows were acknowledged: Open, Inspect and Repair refuse
// to rebuild the projections from the short ledger, Verify reports them,
// and Repair with AcceptLoss drops them, keeping the projections aside.
// buildRun's ledger: 1 create, 2 open, 3 plan, 4 begin a, 5 complete a,
// 6 begin b, 7 fail b, 8 begin b, 9 complete b, 10 begin c, 11 complete
// c, 12 close; its manifest reflects seq 12.

// cutLedger keeps the first n whole records of the ledger in dir, and
// then the first half of record n+1 when torn; it returns what it wrote.
func cutLedger(t *testing.T, dir string, n int, torn bool) []byte {
	t.Helper()
	lines := splitLines(readLedgerBytes(t, dir))
	data := joinLines(lines[:n])
	if torn {
		data = append(data, lines[n][:len(lines[n])/2]...)
	}
	require.NoError(t, os.WriteFile(ledgerPath(dir), data, 0o644))
	return data
}

// projections returns manifest.json and logs/next-steps.txt in dir.
func projections(t *testing.T, dir string) (manifest, next []byte) {
	t.Helper()
	manifest, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)
	next, err = os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	return manifest, next
}

func TestOpenRefusesLostRecords(t *testing.T) {
	for _, tc := range []struct {
		name string
		keep int
		torn bool
	}{
		{"cut to 4 whole records", 4, false},
		{"cut to 10 whole records", 10, false},
		{"cut to 5 whole records and half of the 6th", 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := buildRun(t)
			data := cutLedger(t, dir, tc.keep, tc.torn)
			manifest, next := projections(t, dir)

			_, err := runstate.Open(dir, testOptions())
			require.Error(t, err)
			assert.ErrorIs(t, err, runstate.ErrCorrupt)
			var ce *runstate.CorruptError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, ledgerPath(dir), ce.Path)
			assert.Equal(t, tc.keep+1, ce.Line)
			assert.Equal(t, int64(len(joinLines(splitLines(data)[:tc.keep]))), ce.Offset)
			for _, want := range []string{
				ledgerPath(dir),
				fmt.Sprintf("the ledger ends at seq %d, but manifest.json reflects seq 12: %d records are missing", tc.keep, 12-tc.keep),
				"records up to seq 11 were acknowledged (stage \"c\" complete at seq 11)",
				fmt.Sprintf("restore logs/ledger.jsonl from a backup that holds seq %d-12", tc.keep+1),
				"or accept the loss with: runstate repair -accept-loss " + dir,
			} {
				assert.Contains(t, err.Error(), want)
			}
			assert.NotContains(t, err.Error(), "repair only cuts a torn tail", "the advice names repair -accept-loss, which does more")
			assert.Equal(t, data, readLedgerBytes(t, dir), "Open wrote to the ledger (the torn part too)")
			m, n := projections(t, dir)
			assert.Equal(t, manifest, m, "Open rebuilt manifest.json")
			assert.Equal(t, next, n, "Open rebuilt logs/next-steps.txt")
			torn, _ := filepath.Glob(ledgerPath(dir) + ".torn-*")
			assert.Empty(t, torn)

			// The readers say the same, rather than show the short state.
			_, err = runstate.Inspect(dir)
			assert.ErrorIs(t, err, runstate.ErrCorrupt)
			assert.ErrorContains(t, err, fmt.Sprintf("the ledger ends at seq %d, but manifest.json reflects seq 12", tc.keep))
			_, err = runstate.NextSteps(dir)
			assert.ErrorIs(t, err, runstate.ErrCorrupt)

			// Repair refuses too, and changes nothing.
			_, err = runstate.Repair(dir, nil)
			assert.ErrorIs(t, err, runstate.ErrCorrupt)
			assert.ErrorContains(t, err, "runstate repair -accept-loss")
			assert.Equal(t, data, readLedgerBytes(t, dir))
			m, n = projections(t, dir)
			assert.Equal(t, manifest, m)
			assert.Equal(t, next, n)
		})
	}
}

func TestVerifyReportsLostRecords(t *testing.T) {
	dir := buildRun(t)
	cutLedger(t, dir, 4, false)
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	require.False(t, rep.OK())
	var lost *runstate.Problem
	for i, p := range rep.Problems {
		assert.NotContains(t, p.Fix, "rebuilds it", "%s: the projections are the lost records' trace", p.File)
		if strings.Contains(p.What, "lost records") {
			lost = &rep.Problems[i]
		}
	}
	require.NotNil(t, lost, "%+v", rep.Problems)
	assert.Equal(t, ledgerPath(dir), lost.File)
	assert.Equal(t, 5, lost.Line)
	assert.Equal(t, int64(len(joinLines(splitLines(readLedgerBytes(t, dir))))), lost.Offset)
	assert.Contains(t, lost.What, "the ledger ends at seq 4, but manifest.json reflects seq 12: 8 records are missing")
	assert.Contains(t, lost.Fix, "restore logs/ledger.jsonl from a backup that holds seq 5-12")
	assert.Contains(t, lost.Fix, "runstate repair -accept-loss")
}

func TestRepairAcceptLoss(t *testing.T) {
	dir := buildRun(t)
	data := cutLedger(t, dir, 4, false)
	manifest, next := projections(t, dir)

	rep, err := runstate.Repair(dir, &runstate.RepairOptions{AcceptLoss: true})
	require.NoError(t, err)
	assert.Contains(t, rep.Lost, "the ledger ends at seq 4, but manifest.json reflects seq 12")
	require.Len(t, rep.KeptAside, 2)
	assert.True(t, strings.HasPrefix(rep.KeptAside[0], filepath.Join(dir, "manifest.json.lost-")), rep.KeptAside[0])
	assert.True(t, strings.HasPrefix(rep.KeptAside[1], filepath.Join(dir, "logs", "next-steps.txt.lost-")), rep.KeptAside[1])
	for i, want := range [][]byte{manifest, next} {
		got, err := os.ReadFile(rep.KeptAside[i])
		require.NoError(t, err)
		assert.Equal(t, want, got, "kept aside as it was")
	}
	assert.Equal(t, data, readLedgerBytes(t, dir), "the ledger is kept as it is")
	assert.Equal(t, int64(4), rep.Records)
	assert.Equal(t, int64(4), readManifest(t, dir).Seq, "manifest.json rebuilt from the ledger")
	verifyOK(t, dir)

	// The run goes on from what the ledger holds.
	r := openRun(t, dir, testOptions())
	s, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, 0, s.Done)
	require.NoError(t, r.Do(context.Background(), "a", writeStage("artifacts/a.txt", "alpha")))
	require.NoError(t, r.Close())
	verifyOK(t, dir)
}

// A session still open on the run (one that opened before the ledger was
// cut under it) would append after records that no longer exist: the loss
// is not accepted while it runs, and nothing is written.
func TestRepairAcceptLossRefusedWhileASessionIsOpen(t *testing.T) {
	dir := buildRun(t)
	r := openRun(t, dir, testOptions())
	data := cutLedger(t, dir, 4, false)
	manifest, next := projections(t, dir)

	_, err := runstate.Repair(dir, &runstate.RepairOptions{AcceptLoss: true})
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), "session "+r.Session()+" is open on "+dir)
	assert.Equal(t, data, readLedgerBytes(t, dir), "the ledger is untouched")
	m, n := projections(t, dir)
	assert.Equal(t, manifest, m, "manifest.json is untouched")
	assert.Equal(t, next, n, "logs/next-steps.txt is untouched")
	matches, err := filepath.Glob(filepath.Join(dir, "manifest.json.lost-*"))
	require.NoError(t, err)
	assert.Empty(t, matches, "nothing kept aside")
	runstatetest.Crash(r)
}

// What the ledger may lose without losing anything acknowledged is
// recovered as before: a manifest that lags the ledger, a torn last line
// the manifest reflects, records appended without an fsync (a begin, an
// open, a close) that a power loss dropped after the manifest showed them.
func TestLostRecordsNotClaimed(t *testing.T) {
	t.Run("manifest lags the ledger", func(t *testing.T) {
		dir := buildRun(t)
		old, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
		require.NoError(t, err)
		r := openRun(t, dir, testOptions())
		require.NoError(t, r.Do(context.Background(), "d", writeStage("artifacts/d.txt", "delta")))
		require.NoError(t, r.Close())
		require.NoError(t, os.WriteFile(filepath.Join(dir, "manifest.json"), old, 0o644))
		st, err := runstate.Inspect(dir)
		require.NoError(t, err)
		assert.Equal(t, lastRecord(t, dir).Seq, st.Seq)
		r = openRun(t, dir, testOptions())
		require.NoError(t, r.Close())
		verifyOK(t, dir)
	})
	t.Run("torn close record the manifest reflects", func(t *testing.T) {
		dir := buildRun(t)
		good := cutLedger(t, dir, 11, true)
		good = good[:len(joinLines(splitLines(good)[:11]))]
		st, err := runstate.Inspect(dir)
		require.NoError(t, err)
		assert.Equal(t, int64(11), st.Seq)
		r := openRun(t, dir, testOptions())
		require.NoError(t, r.Close())
		assert.True(t, bytes.HasPrefix(readLedgerBytes(t, dir), good))
		verifyOK(t, dir)
	})
	t.Run("open and close records lost", func(t *testing.T) {
		dir := buildRun(t)
		r := openRun(t, dir, testOptions())
		require.NoError(t, r.Close()) // 13 open, 14 close; the manifest reflects 14
		cutLedger(t, dir, 12, false)
		r = openRun(t, dir, testOptions())
		require.NoError(t, r.Close())
		verifyOK(t, dir)
	})
	t.Run("begin published, then lost", func(t *testing.T) {
		base := buildRun(t)
		opts := testOptions()
		opts.ManifestInterval = -1 // the manifest after every append, the begin's too
		r := openRun(t, base, opts)
		st, err := r.Begin(context.Background(), "d")
		require.NoError(t, err)
		// The files as a power loss may leave them: the manifest shows
		// the begin (seq 14), the ledger lost it.
		dir := t.TempDir()
		require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
		require.Equal(t, int64(14), readManifest(t, dir).Seq)
		require.NoError(t, os.WriteFile(ledgerPath(dir), joinLines(splitLines(readLedgerBytes(t, base))[:13]), 0o644))
		require.NoError(t, st.Complete())
		require.NoError(t, r.Close())

		s, err := runstate.Inspect(dir)
		require.NoError(t, err)
		assert.Equal(t, int64(13), s.Seq)
		r = openRun(t, dir, testOptions())
		require.NoError(t, r.Do(context.Background(), "d", writeStage("artifacts/d.txt", "delta")))
		require.NoError(t, r.Close())
		verifyOK(t, dir)
	})
	t.Run("the manifest of another run", func(t *testing.T) {
		dir := buildRun(t)
		other := buildRun(t)
		r := openRun(t, other, testOptions())
		require.NoError(t, r.Do(context.Background(), "d", writeStage("artifacts/d.txt", "delta")))
		require.NoError(t, r.Close())
		cutLedger(t, dir, 4, false)
		copyFile(t, filepath.Join(other, "manifest.json"), filepath.Join(dir, "manifest.json"))
		_, err := runstate.Inspect(dir)
		require.NoError(t, err, "another run's manifest proves nothing of this ledger")
	})
}

// A reader holds no lock: a writer may append records, and publish a
// manifest that shows them, after the reader measured the ledger. That is
// not a loss.
func TestLostRecordsNotClaimedWhileWriting(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	opts.ManifestInterval = -1
	r := openRun(t, dir, opts)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			_ = r.Do(context.Background(), fmt.Sprint("s", i), writeStage(fmt.Sprintf("artifacts/%d.txt", i), "x"))
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		_, err := runstate.Inspect(dir)
		require.NoError(t, err)
	}
}
