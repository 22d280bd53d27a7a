package runstate

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// denyLedgerFS refuses to open logs/ledger.jsonl, as the system refuses a
// user who may not write to another user's run.
type denyLedgerFS struct{ fileSystem }

func (d denyLedgerFS) OpenFile(name string, flag int, perm fs.FileMode) (file, error) {
	if filepath.Base(name) == filepath.Base(ledgerFile) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EACCES}
	}
	return d.fileSystem.OpenFile(name, flag, perm)
}

// A run that this user may not write names the file once and says what
// to do (it said "open P: open P: permission denied").
func TestOpenOfARunThisUserMayNotWrite(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "mine"})
	require.NoError(t, err)
	require.NoError(t, r.Close())

	_, err = Open(dir, &Options{fs: denyLedgerFS{osFS{}}})
	require.Error(t, err)
	lp := filepath.Join(dir, "logs", "ledger.jsonl")
	assert.ErrorIs(t, err, fs.ErrPermission)
	assert.Equal(t, 1, strings.Count(err.Error(), lp), "the path once: %v", err)
	assert.Contains(t, err.Error(), "run this as the user that owns the run directory, or give this user write access to it")

	// Another error than a permission's: the path once, no advice.
	assert.Equal(t, "runstate: cannot open "+lp+": no such file or directory",
		openError(lp, &fs.PathError{Op: "open", Path: lp, Err: syscall.ENOENT}).Error())
	_, err = os.Stat(lp)
	require.NoError(t, err, "the ledger is still there")
}
