package runstate

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newestMark returns the newest header slot of the journal in dir.
func newestMark(t testing.TB, dir string) walMark {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(walFile)))
	require.NoError(t, err)
	var m walMark
	for i := range 2 {
		if s, ok := parseMark(data[i*walSlot : (i+1)*walSlot]); ok && s.end > m.end {
			m = s
		}
	}
	return m
}

// ledgerLines splits the ledger in dir into its lines, each with its '\n'.
func ledgerLines(t testing.TB, dir string) [][]byte {
	t.Helper()
	data := ledgerBytes(t, dir)
	var lines [][]byte
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		require.GreaterOrEqual(t, i, 0, "the ledger ends in a whole line")
		lines = append(lines, data[:i+1])
		data = data[i+1:]
	}
	return lines
}

// A line deleted, repeated or inserted by hand inside the bytes the
// journal holds, in a ledger that holds records after the journal's last
// (here the close record, made durable by Close's fdatasync of the
// ledger, not by the ring): the records after the edit have moved, which
// no power loss does (it damages bytes in place, and a ledger fdatasync
// after the ring's last slot makes everything before it durable). Open
// refuses it as corruption, naming the line, and writes nothing: writing
// the journal's records back at their offsets would overwrite the moved
// close record. Verify reports the same line, not "whole in the journal".
// An edit that moves nothing (a flipped byte) is what a power loss may
// leave: Open writes the journal's records back, and the ledger is the
// original again, close record included.
func TestJournalRestoreNeverOverwritesMovedRecords(t *testing.T) {
	checkLeaks(t)
	base := t.TempDir()
	r, err := Open(base, &Options{Request: "fault injection", durable: durableRingOnly})
	require.NoError(t, err)
	for _, s := range []string{"a", "b", "c"} {
		require.NoError(t, doWrite(r, s, s))
	}
	fileStoreOf(r).opts.durable = durableLedgerOnly // as the measured way may choose for the close record's batch
	require.NoError(t, r.Close())
	lines := ledgerLines(t, base)
	orig := ledgerBytes(t, base)
	m := newestMark(t, base)
	require.Less(t, m.seq, int64(len(lines)), "the close record is durable through the ledger, not the ring")
	require.Greater(t, m.seq, int64(3))
	lp := func(dir string) string { return filepath.Join(dir, filepath.FromSlash(ledgerFile)) }
	join := func(parts ...[][]byte) []byte {
		var b []byte
		for _, p := range parts {
			for _, l := range p {
				b = append(b, l...)
			}
		}
		return b
	}
	for i := int(m.seq) - 3; i < int(m.seq); i++ { // line i+1, inside the ring's window
		for _, tc := range []struct {
			what string
			data []byte
		}{
			{"deleted", join(lines[:i], lines[i+1:])},
			{"repeated", join(lines[:i+1], lines[i:])},
			{"inserted", join(lines[:i], [][]byte{[]byte(`{"seq":1,"ev":"note","prev":""}` + "\n")}, lines[i:])},
		} {
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
			require.NoError(t, os.Remove(filepath.Join(dir, manifestFile)))
			require.NoError(t, os.WriteFile(lp(dir), tc.data, 0o644))
			line := i + 1
			if tc.what == "repeated" {
				line = i + 2
			}
			rep, err := Verify(dir)
			require.NoError(t, err)
			require.False(t, rep.OK())
			assert.Equal(t, line, rep.Problems[0].Line, "line %d %s: %v", i+1, tc.what, rep.Problems)
			assert.NotContains(t, rep.Problems[0].What, "whole in "+walFile, "line %d %s", i+1, tc.what)
			_, err = Open(dir, &Options{Request: "fault injection"})
			var ce *CorruptError
			require.True(t, errors.As(err, &ce), "line %d %s: Open returns %v", i+1, tc.what, err)
			assert.Equal(t, lp(dir), ce.Path)
			assert.Equal(t, line, ce.Line)
			assert.Contains(t, err.Error(), "runstate verify")
			assert.Equal(t, tc.data, ledgerBytes(t, dir), "line %d %s: Open wrote nothing", i+1, tc.what)
		}

		// A flipped byte moves nothing: the journal's records go back.
		dir := t.TempDir()
		require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
		require.NoError(t, os.Remove(filepath.Join(dir, manifestFile)))
		flipped := bytes.Clone(orig)
		flipped[len(join(lines[:i]))+5] ^= 0x20
		require.NoError(t, os.WriteFile(lp(dir), flipped, 0o644))
		rep, err := Verify(dir)
		require.NoError(t, err)
		require.False(t, rep.OK())
		assert.Contains(t, rep.Problems[0].What, "whole in "+walFile)
		r, err := Open(dir, &Options{Request: "fault injection"})
		require.NoError(t, err)
		require.NoError(t, r.Close())
		assert.True(t, bytes.HasPrefix(ledgerBytes(t, dir), orig), "line %d flipped: the ledger is the original again", i+1)
	}
}
