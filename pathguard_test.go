package runstate_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// TestOutputPathWithNULRefused: a NUL byte in an output path is refused at
// once, saying so.
func TestOutputPathWithNULRefused(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRun(t)
	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	for _, call := range []func(string) error{
		func(p string) error { return st.WriteFile(p, []byte("x")) },
		st.Output,
	} {
		err := call("artifacts/a\x00b.txt")
		require.Error(t, err)
		assert.ErrorIs(t, err, runstate.ErrInvalid)
		assert.Contains(t, err.Error(), "NUL byte")
	}
	_, err = r.Begin(ctx, "t", runstate.File("in\x00put"))
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "NUL byte")
}

// TestValidForEvidenceFromTheFutureExpires: a stage whose done time is
// after the clock's now (the clock was ahead when it completed: a VM
// snapshot, an NTP step back) has no proven age, so ValidFor evidence is
// expired, with a reason that says why, instead of staying valid until
// the clock catches up.
func TestValidForEvidenceFromTheFutureExpires(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "fetch", writeStage("artifacts/prices.json", "{}"), runstate.ValidFor(time.Hour)))
	require.NoError(t, r.Close())

	// Its complete record carries a time a day ahead.
	ahead := time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339Nano)
	at := regexp.MustCompile(`"at":"[^"]*"`)
	require.NoError(t, editLines(ledgerPath(dir), func(lines [][]byte) []byte {
		for i, l := range lines {
			if bytes.Contains(l, []byte(`"ev":"complete"`)) {
				lines[i] = at.ReplaceAll(l, []byte(`"at":"`+ahead+`"`))
			}
		}
		return rechain(lines)
	}))
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json"))) // replay the ledger

	r = openRun(t, dir, testOptions())
	st, err := r.Begin(ctx, "fetch", runstate.ValidFor(time.Hour))
	require.NoError(t, err, "evidence from the future is not valid")
	require.NoError(t, st.Complete())
	inv := events(checkLedger(t, dir), "invalidate", "fetch")
	require.Len(t, inv, 1)
	assert.Contains(t, inv[0].Reason, "evidence expired")
	assert.Contains(t, inv[0].Reason, "after this clock's now")

	// Evidence done now is valid again.
	_, err = r.Begin(ctx, "fetch", runstate.ValidFor(time.Hour))
	assert.ErrorIs(t, err, runstate.ErrDone)
}

// TestFileInputDirectoryRefused: a File input that is a directory is
// refused at Begin, saying what it is (the unix tests cover FIFOs and
// devices).
func TestFileInputDirectoryRefused(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	in := t.TempDir()
	before := readLedgerBytes(t, dir)
	_, err := r.Begin(ctx, "s", runstate.File(in))
	require.Error(t, err)
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), in)
	assert.Contains(t, err.Error(), "a directory, not a regular file")
	assert.Equal(t, before, readLedgerBytes(t, dir), "nothing recorded")
}
