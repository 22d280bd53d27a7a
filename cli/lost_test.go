package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A ledger that lost whole records from its end, which manifest.json shows
// were acknowledged: status and repair refuse it, verify reports lost
// records with the advice to restore the ledger, and repair -accept-loss
// rebuilds the projections after keeping the old ones aside.
func TestLostRecords(t *testing.T) {
	dir := finishedRun(t)
	lines := ledgerLines(t, dir)
	kept := strings.Join(lines[:4], "")
	require.NoError(t, os.WriteFile(ledgerPath(dir), []byte(kept), 0o644))
	before := tree(t, dir)

	res := readCLI(t, dir, "status", dir)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "the ledger ends at seq 4, but manifest.json reflects seq")
	assert.Contains(t, res.err, "runstate repair -accept-loss "+quoteArg(dir))

	res = readCLI(t, dir, "verify", dir)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.out, "problem: "+ledgerPath(dir)+" line 5 (byte ")
	assert.Contains(t, res.out, "lost records: the ledger ends at seq 4, but manifest.json reflects seq ")
	assert.Contains(t, res.out, "fix: restore logs/ledger.jsonl from a backup that holds seq 5-")
	assert.NotContains(t, res.out, "rebuilds it")

	res = runCLI(t, "repair", dir)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "runstate repair -accept-loss")
	assert.Contains(t, res.err, "nothing was changed")
	res = runCLI(t, "repair", "-accept-loss", "-truncate-at", "3", dir)
	assert.Equal(t, 2, res.code, res.err)
	assert.Equal(t, before, tree(t, dir), "a refused repair changed files")

	res = runCLI(t, "repair", "-accept-loss", dir)
	assert.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.out, "  lost:    the ledger ends at seq 4, but manifest.json reflects seq ")
	assert.Contains(t, res.out, "  kept:    "+filepath.Join(dir, "manifest.json.lost-"))
	got, err := os.ReadFile(ledgerPath(dir))
	require.NoError(t, err)
	assert.Equal(t, kept, string(got))
	v := runCLI(t, "verify", dir)
	assert.Equal(t, 0, v.code, v.out)
}
