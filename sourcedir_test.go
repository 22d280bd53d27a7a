package runstate_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

func mkfile(t *testing.T, path, data string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(data), 0o644))
}

// The run is opened from one directory with SourceDir naming the checkout;
// the checkout is moved and the run opened again from another directory:
// its evidence holds, and a change is named by the path inside the
// checkout.
func TestSourceDirKeepsEvidenceWhenTheCheckoutMoves(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	checkout := filepath.Join(base, "checkout")
	mkfile(t, filepath.Join(checkout, "parser", "parser.go"), "package parser\n")
	require.NoError(t, os.MkdirAll(filepath.Join(base, "a"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(base, "b"), 0o755))
	dir := filepath.Join(base, "run")

	t.Chdir(filepath.Join(base, "a"))
	opts := testOptions()
	opts.SourceDir = checkout
	r := openRun(t, dir, opts)
	require.NoError(t, r.Do(ctx, "parse", noop, runstate.File("parser/parser.go")))
	require.NoError(t, r.Close())
	lines := parseLedger(t, readLedgerBytes(t, dir))
	var inputs map[string]string
	for _, l := range lines {
		if l.rec.Ev == "complete" {
			inputs = l.rec.Inputs
		}
	}
	assert.Contains(t, inputs, "parser/parser.go", "recorded relative to SourceDir")

	moved := filepath.Join(base, "moved")
	require.NoError(t, os.Rename(checkout, moved))
	t.Chdir(filepath.Join(base, "b"))
	opts.SourceDir = "../moved" // relative to the working directory at Open
	r = openRun(t, dir, opts)
	_, err := r.Begin(ctx, "parse", runstate.File("parser/parser.go"))
	assert.ErrorIs(t, err, runstate.ErrDone, "the moved checkout keeps its evidence")
	_, err = r.Begin(ctx, "parse", runstate.File(filepath.Join(moved, "parser", "parser.go")))
	assert.ErrorIs(t, err, runstate.ErrDone, "an absolute path inside SourceDir is the same input")
	_, err = r.Begin(ctx, "parse", runstate.File("./parser/../parser/parser.go"))
	assert.ErrorIs(t, err, runstate.ErrDone, "and so is an unclean one")

	mkfile(t, filepath.Join(moved, "parser", "parser.go"), "package parser // changed\n")
	st, err := r.Begin(ctx, "parse", runstate.File("parser/parser.go"))
	require.NoError(t, err)
	assert.Equal(t, "input parser/parser.go changed", st.Reason())
}

func TestFileOutsideSourceDirIsRecordedAbsolute(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	outside := filepath.Join(base, "elsewhere", "notes.txt")
	mkfile(t, outside, "notes\n")
	opts := testOptions()
	opts.SourceDir = filepath.Join(base, "checkout")
	r := openRun(t, filepath.Join(base, "run"), opts)
	require.NoError(t, r.Do(ctx, "read", noop, runstate.File("../elsewhere/notes.txt")))
	s, err := r.Status()
	require.NoError(t, err)
	st, _ := s.Stage("read")
	assert.Contains(t, st.Inputs, filepath.ToSlash(outside))
	_, err = r.Begin(ctx, "read", runstate.File(outside))
	assert.ErrorIs(t, err, runstate.ErrDone, "the same file, named absolute")
}

// Without SourceDir, File paths are relative to the working directory at
// Open, not at Begin: a program that changes directory keeps its inputs.
func TestFilePathsAreRelativeToTheWorkingDirectoryAtOpen(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	mkfile(t, filepath.Join(base, "src", "x.go"), "package x\n")
	require.NoError(t, os.MkdirAll(filepath.Join(base, "other"), 0o755))
	t.Chdir(filepath.Join(base, "src"))
	r := openRun(t, filepath.Join(base, "run"), testOptions())
	t.Chdir(filepath.Join(base, "other"))
	require.NoError(t, r.Do(ctx, "read", noop, runstate.File("x.go")))
	s, err := r.Status()
	require.NoError(t, err)
	st, _ := s.Stage("read")
	assert.Contains(t, st.Inputs, "x.go")
}

func TestFileGivenTwiceUnderTwoSpellingsIsRefused(t *testing.T) {
	dir := t.TempDir()
	mkfile(t, filepath.Join(dir, "x.go"), "package x\n")
	opts := testOptions()
	opts.SourceDir = dir
	r := openRun(t, filepath.Join(dir, "run"), opts)
	_, err := r.Begin(context.Background(), "read", runstate.File("x.go"), runstate.File("./x.go"))
	assert.ErrorIs(t, err, runstate.ErrInvalid)
}
