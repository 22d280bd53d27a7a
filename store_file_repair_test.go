package runstate_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repairRun makes a closed run with stages a and b complete and returns its
// directory and ledger bytes.
func repairRun(t *testing.T) (string, []byte) {
	t.Helper()
	dir := t.TempDir()
	r, err := runstate.Open(dir, &runstate.Options{Request: "repair", NoSync: true})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, r.Plan(ctx, "a", "b", "c"))
	for _, s := range []string{"a", "b"} {
		require.NoError(t, r.Do(ctx, s, func(ctx context.Context, st *runstate.Stage) error {
			return st.WriteFile("artifacts/"+s, []byte(s))
		}))
	}
	require.NoError(t, r.Close())
	return dir, readLedger(t, dir)
}

func ledgerOf(dir string) string { return filepath.Join(dir, "logs", "ledger.jsonl") }

func readLedger(t *testing.T, dir string) []byte {
	t.Helper()
	b, err := os.ReadFile(ledgerOf(dir))
	require.NoError(t, err)
	return b
}

func writeLedger(t *testing.T, dir string, b []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(ledgerOf(dir), b, 0o644))
}

// lineStart returns the byte offset of line n (1-based).
func lineStart(b []byte, n int) int64 {
	var off int64
	for _, l := range strings.SplitAfter(string(b), "\n")[:n-1] {
		off += int64(len(l))
	}
	return off
}

func verifyOK(t *testing.T, dir string) {
	t.Helper()
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	assert.Empty(t, rep.Problems)
}

func TestRepairTornTail(t *testing.T) {
	// The last one, 17 MiB, is longer than a line may be (16 MiB): a torn
	// tail all the same.
	for _, torn := range []string{`{"seq":99,"at":"20`, "{\"not a record", `{"seq":99,"data":"` + strings.Repeat("x", 17<<20)} {
		dir, good := repairRun(t)
		writeLedger(t, dir, append(append([]byte{}, good...), torn...))

		rep, err := runstate.Repair(dir, nil)
		require.NoError(t, err)
		assert.Equal(t, int64(len(torn)), rep.TornBytes)
		assert.Contains(t, rep.Damage, "torn last line")
		assert.Equal(t, good, readLedger(t, dir))
		assert.True(t, strings.HasPrefix(rep.TornSaved, ledgerOf(dir)+".torn-"), rep.TornSaved)
		saved, err := os.ReadFile(rep.TornSaved)
		require.NoError(t, err)
		assert.Equal(t, torn, string(saved))
		assert.Empty(t, rep.Backup)
		assert.Equal(t, int64(len(good)), rep.Bytes)
		assert.Len(t, rep.Rebuilt, 2)
		verifyOK(t, dir)
		tmp, err := os.ReadDir(filepath.Join(dir, "logs", "tmp"))
		require.NoError(t, err)
		assert.Empty(t, tmp, "no temp file left")
	}
}

func TestRepairRebuildsProjections(t *testing.T) {
	dir, good := repairRun(t)
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "next-steps.txt"), []byte("stale\n"), 0o644))
	rep, err := runstate.Repair(dir, &runstate.RepairOptions{})
	require.NoError(t, err)
	assert.Empty(t, rep.Damage)
	assert.Zero(t, rep.TornBytes)
	assert.Equal(t, good, readLedger(t, dir), "a healthy ledger is not touched")
	verifyOK(t, dir)
	h, err := runstate.NextSteps(dir)
	require.NoError(t, err)
	file, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	assert.Equal(t, h, string(file))

	// The run opens and goes on.
	r, err := runstate.Open(dir, &runstate.Options{Request: "repair", NoSync: true})
	require.NoError(t, err)
	st, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, "c", st.Next)
	require.NoError(t, r.Close())
}

// editMiddle changes line 5 (the complete of a) so that the chain breaks at
// line 6; it returns the ledger as edited.
func editMiddle(t *testing.T, dir string, good []byte) []byte {
	t.Helper()
	lines := strings.SplitAfter(string(good), "\n")
	require.Contains(t, lines[4], `"ev":"complete"`)
	lines[4] = string(recrcLine([]byte(strings.Replace(lines[4], `"stage":"a"`, `"stage":"z"`, 1)))) // its checksum kept right
	bad := []byte(strings.Join(lines, ""))
	writeLedger(t, dir, bad)
	return bad
}

func TestRepairRefusesMidFileDamage(t *testing.T) {
	dir, good := repairRun(t)
	bad := editMiddle(t, dir, good)
	manifest, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)

	_, err = runstate.Repair(dir, nil)
	require.ErrorIs(t, err, runstate.ErrCorrupt)
	assert.Contains(t, err.Error(), "line 6 (byte ")
	assert.Contains(t, err.Error(), "-truncate-at 5 -force "+dir+" (a copy", "the advice drops the edited line 5 too, with -force: manifest.json shows the records after it acknowledged")
	assert.Equal(t, bad, readLedger(t, dir), "nothing written")
	after, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)
	assert.Equal(t, manifest, after)
	baks, _ := filepath.Glob(ledgerOf(dir) + ".*")
	assert.Empty(t, baks)

	for _, o := range []runstate.RepairOptions{
		{TruncateAt: 7},              // after the damage: it would stay
		{TruncateAt: 7, Force: true}, // even with Force
		{TruncateAt: 1},              // no run would be left
		{TruncateAt: -1},
	} {
		_, err := runstate.Repair(dir, &o)
		require.ErrorIs(t, err, runstate.ErrInvalid, "%+v", o)
		assert.Equal(t, bad, readLedger(t, dir), "%+v", o)
	}
}

func TestRepairTruncateAt(t *testing.T) {
	for _, at := range []int{6, 5, 3} { // at the damage, at the edited line, before both
		dir, good := repairRun(t)
		bad := editMiddle(t, dir, good)
		rep, err := runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: at, Force: true})
		require.NoError(t, err, "at %d", at)
		assert.Contains(t, rep.Damage, "line 6", "at %d", at)
		assert.Equal(t, bad[:lineStart(bad, at)], readLedger(t, dir), "at %d", at)
		assert.Equal(t, lineStart(bad, at), rep.CutAt)
		assert.Equal(t, int64(len(bad))-rep.CutAt, rep.CutBytes)
		assert.Equal(t, strings.Count(string(bad), "\n")-(at-1), rep.CutLines)
		assert.Equal(t, int64(at-1), rep.Records)
		backup, err := os.ReadFile(rep.Backup)
		require.NoError(t, err)
		assert.Equal(t, bad, backup, "the backup holds the whole ledger")
		verifyOK(t, dir)
	}
}

// A cut that would drop records manifest.json shows were acknowledged is
// refused, saying which, unless Force: the records after the damage were
// reported done to a caller, and only a person may choose to drop them.
func TestRepairTruncateKeepsAcknowledged(t *testing.T) {
	dir, good := repairRun(t)
	bad := editMiddle(t, dir, good)
	_, err := runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: 6})
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "would drop acknowledged records seq 6-8 (manifest.json shows")
	assert.Contains(t, err.Error(), "-force")
	assert.Equal(t, bad, readLedger(t, dir), "nothing cut")
	baks, _ := filepath.Glob(ledgerOf(dir) + ".*")
	assert.Empty(t, baks)
}

func TestRepairTruncateHealthyNeedsForce(t *testing.T) {
	dir, good := repairRun(t)
	_, err := runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: 4})
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "no damage")
	assert.Equal(t, good, readLedger(t, dir))

	_, err = runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: 999, Force: true})
	require.ErrorIs(t, err, runstate.ErrInvalid, "no such line")

	rep, err := runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: 4, Force: true})
	require.NoError(t, err)
	assert.Empty(t, rep.Damage)
	assert.Equal(t, good[:lineStart(good, 4)], readLedger(t, dir))
	verifyOK(t, dir)
}

func TestRepairTruncateRefusedWhileSessionOpen(t *testing.T) {
	dir, good := repairRun(t)
	r, err := runstate.Open(dir, &runstate.Options{NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	_, err = runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: 4, Force: true})
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), r.Session())
	assert.True(t, len(readLedger(t, dir)) > len(good), "the open session's records are still there")

	// A torn tail may be cut while the session is open: the session goes on.
	f, err := os.OpenFile(ledgerOf(dir), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"seq":`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	rep, err := runstate.Repair(dir, nil)
	require.NoError(t, err)
	assert.Equal(t, int64(7), rep.TornBytes)
	require.NoError(t, r.Do(context.Background(), "c", func(ctx context.Context, st *runstate.Stage) error { return nil }))
	require.NoError(t, r.Close())
	verifyOK(t, dir)
}

func TestRepairNotARun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	_, err := runstate.Repair(dir, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not a run directory")
	assert.NoDirExists(t, dir)
}

func TestRepairVersion(t *testing.T) {
	dir, good := repairRun(t)
	lines := strings.SplitAfter(string(good), "\n")
	lines[0] = string(recrcLine([]byte(strings.Replace(lines[0], `"format":1`, `"format":9`, 1))))
	bad := string(rechain(splitLines([]byte(strings.Join(lines, "")))))
	writeLedger(t, dir, []byte(bad))
	_, err := runstate.Repair(dir, nil)
	require.ErrorIs(t, err, runstate.ErrVersion)
	assert.Equal(t, bad, string(readLedger(t, dir)))
}

// A deleted line shows as a seq gap at the line that follows it: the cut
// advice names that line, since nothing before it changed.
func TestRepairAdviceForDeletedLine(t *testing.T) {
	dir, good := repairRun(t)
	lines := strings.SplitAfter(string(good), "\n")
	writeLedger(t, dir, []byte(strings.Join(append(lines[:4:4], lines[5:]...), "")))
	_, err := runstate.Repair(dir, nil)
	require.ErrorIs(t, err, runstate.ErrCorrupt)
	assert.Contains(t, err.Error(), "line 5 (byte ")
	assert.Contains(t, err.Error(), "seq gap")
	assert.Contains(t, err.Error(), "cut it from there on, dropping acknowledged records seq 5-8 (manifest.json shows they were made durable), with: runstate repair -truncate-at 5 -force "+dir+" (a copy")

	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1)
	assert.Contains(t, rep.Problems[0].Fix, "-truncate-at 5 -force "+dir+" (a copy")
	_, err = runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: 5})
	require.ErrorIs(t, err, runstate.ErrInvalid, "the cut without -force, which the advice does not give")
}

// Where nothing shows the records after the damage acknowledged (no
// manifest.json, no journal), the cut advice has no -force, and Repair
// does what it says.
func TestRepairAdviceWithoutAcknowledgedRecords(t *testing.T) {
	dir, good := repairRun(t)
	lines := strings.SplitAfter(string(good), "\n")
	writeLedger(t, dir, []byte(strings.Join(append(lines[:4:4], lines[5:]...), "")))
	for _, name := range []string{"manifest.json", "logs/ledger.wal"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			require.ErrorIs(t, err, os.ErrNotExist)
		}
	}
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	require.NotEmpty(t, rep.Problems)
	assert.Contains(t, rep.Problems[0].Fix, "cut it from there on with: runstate repair -truncate-at 5 "+dir+" (a copy")
	assert.NotContains(t, rep.Problems[0].Fix, "-force")
	_, err = runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: 5})
	require.NoError(t, err)
	assert.Equal(t, strings.Join(lines[:4], ""), string(readLedger(t, dir)))
}
