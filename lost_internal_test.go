package runstate

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A ledger cut back to whole records while logs/ledger.wal still holds the
// records after them, chained from the ledger's last: no records are lost,
// so Open copies them back from the journal (as after a machine crash)
// rather than refusing the ledger as one that lost acknowledged records
// (lost_test.go), whatever manifest.json reflects.
func TestLostRecordsRestoredFromJournal(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "lost records", durable: durableRingOnly})
	require.NoError(t, err)
	for _, s := range []string{"a", "b", "c"} {
		require.NoError(t, doWrite(r, s, s))
	}
	require.NoError(t, r.Close())
	orig := ledgerBytes(t, dir)
	lines := bytes.SplitAfter(orig, []byte("\n"))
	require.Greater(t, newestMark(t, dir).seq, int64(4))
	lp := filepath.Join(dir, filepath.FromSlash(ledgerFile))
	require.NoError(t, os.WriteFile(lp, bytes.Join(lines[:4], nil), 0o644))

	rep, err := Verify(dir)
	require.NoError(t, err)
	for _, p := range rep.Problems {
		assert.NotContains(t, p.What, "lost records")
	}
	r, err = Open(dir, &Options{Request: "lost records"})
	require.NoError(t, err, "the journal holds the records the ledger lost")
	require.NoError(t, r.Close())
	assert.True(t, bytes.HasPrefix(ledgerBytes(t, dir), orig), "the records are back from the journal")
	rep, err = Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}
