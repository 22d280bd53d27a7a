package runstate_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// DecodeLine accepts each line the ledger holds, as Open does, and
// refuses what Open would refuse in a line: a flipped byte (the crc), a
// key that differs from a field by case alone, a key given twice, a line
// that is no record.
func TestDecodeLine(t *testing.T) {
	dir := t.TempDir()
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Skip(context.Background(), "a", "not needed"))
	require.NoError(t, r.Close())
	data, err := os.ReadFile(filepath.Join(dir, "logs", "ledger.jsonl"))
	require.NoError(t, err)
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	require.GreaterOrEqual(t, len(lines), 3)
	for i, line := range lines {
		rec, crc, err := runstate.DecodeLine(line)
		require.NoError(t, err, "line %d", i+1)
		assert.Equal(t, int64(i+1), rec.Seq)
		assert.True(t, crc, "line %d has a crc field", i+1)
	}
	rec, _, err := runstate.DecodeLine(lines[1])
	require.NoError(t, err)

	flipped := bytes.Clone(lines[1])
	i := bytes.Index(flipped, []byte(rec.Ev))
	flipped[i] ^= 0x20 // the ev's first letter in the other case
	_, _, err = runstate.DecodeLine(flipped)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "checksum")

	// Without the crc field, the line is checked for what it says alone.
	n := bytes.LastIndex(lines[1], []byte(`,"crc":"`))
	plain := append(bytes.Clone(lines[1][:n]), '}')
	_, crc, err := runstate.DecodeLine(plain)
	require.NoError(t, err)
	assert.False(t, crc)
	for _, bad := range []string{
		strings.Replace(string(plain), `"seq":`, `"Seq":`, 1),
		strings.Replace(string(plain), `{`, `{"ev":"x",`, 1),
		`{"note":"no seq, no ev"}`,
		`not json`,
	} {
		_, _, err := runstate.DecodeLine([]byte(bad))
		assert.Error(t, err, "%s", bad)
	}
}

// CheckKey is the rule Run.Effect applies to a key.
func TestCheckKey(t *testing.T) {
	assert.NoError(t, runstate.CheckKey("ticket:BILL-42"))
	for _, bad := range []string{"", "a\nb", "\x1b[2J", strings.Repeat("k", 5000), "\xff"} {
		err := runstate.CheckKey(bad)
		assert.ErrorIs(t, err, runstate.ErrInvalid, "%q", bad)
	}
}

// CheckOutput is the rule Stage.WriteFile applies to an output's name.
func TestCheckOutput(t *testing.T) {
	for _, ok := range []string{"out/a.txt", "logsx/a", "manifest.json/x", "a/logs"} {
		assert.NoError(t, runstate.CheckOutput(ok), ok)
	}
	for _, bad := range []string{"logs/x", "LOGS/x", "Manifest.JSON", "manifest.json::$DATA", "MANIFE~1.JSO",
		"manifest.json. ", "out/con.txt", "a/../b", "../x", "/abs", "", "./a"} {
		assert.ErrorIs(t, runstate.CheckOutput(bad), runstate.ErrInvalid, "%q", bad)
	}
}
