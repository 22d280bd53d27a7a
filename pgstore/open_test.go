package pgstore

import (
	"context"
	"strings"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOpenRunsStagesAcrossTwoSessions(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	a, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "two sessions"})
	require.NoError(t, err)
	require.NoError(t, a.Plan(ctx, "x", "y"))
	require.NoError(t, a.Do(ctx, "x", func(ctx context.Context, st *runstate.Stage) error { return nil }))

	b, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "two sessions"})
	require.NoError(t, err)
	_, err = b.Begin(ctx, "x")
	assert.ErrorIs(t, err, runstate.ErrDone)
	st, err := a.Begin(ctx, "y")
	require.NoError(t, err)
	_, err = b.Begin(ctx, "y")
	assert.ErrorIs(t, err, runstate.ErrBusy)
	require.NoError(t, st.Complete())
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())

	status, err := db.Inspect(ctx, "r")
	require.NoError(t, err)
	assert.Equal(t, runstate.StateComplete, status.Stages[0].State)
	assert.Equal(t, runstate.StateComplete, status.Stages[1].State)

	_, err = db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "another request"})
	assert.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), `run "r"`)
}

// Runs lists the runs that hold a record, by name: not the names whose
// Open was refused before the first record (which leaves a row in the
// runs table). Has tells the same of one name.
func TestRunsListsRunNames(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dirB := t.TempDir()
	for _, name := range []string{"b", "a"} {
		dir := t.TempDir()
		if name == "b" {
			dir = dirB
		}
		r, err := db.Open(ctx, name, dir, &runstate.Options{Request: "list"})
		require.NoError(t, err)
		require.NoError(t, r.Close())
	}
	_, err := runstate.OpenStore(db.Store("no-request"), t.TempDir(), &runstate.Options{})
	require.ErrorIs(t, err, runstate.ErrInvalid)
	_, err = runstate.OpenStore(db.Store("b's-dir"), dirB, &runstate.Options{Request: "list"})
	require.ErrorIs(t, err, runstate.ErrMismatch)
	names, err := db.Runs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, names)
	for name, want := range map[string]bool{"a": true, "b": true, "no-request": false, "b's-dir": false, "missing": false} {
		has, err := db.Has(ctx, name)
		require.NoError(t, err, name)
		assert.Equal(t, want, has, "Has(%q)", name)
	}
}

// A clean Close leaves the projections row at the close record: the next
// Open resumes from that snapshot.
func TestCloseWritesProjectionsAtTheLastRecord(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "projections"})
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "a", func(ctx context.Context, st *runstate.Stage) error { return nil }))
	require.NoError(t, r.Close())
	st := db.reader("r")
	runID, err := st.id(ctx)
	require.NoError(t, err)
	snap, at, err := st.snapshot(ctx, runID)
	require.NoError(t, err)
	require.NotNil(t, snap)
	lines := readAll(t, st)
	assert.Equal(t, int64(len(lines)), at.Seq)
	var handoffSeq int64
	var handoff string
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT handoff_seq, handoff FROM {s}.projections WHERE run_id = $1`), runID).Scan(&handoffSeq, &handoff))
	assert.Equal(t, int64(len(lines)), handoffSeq)
	assert.NotEmpty(t, handoff)
}

// A run name follows the rule of a stage name (valid UTF-8 of at most 256
// bytes, no control character, no space at either end): anything else is
// refused with ErrInvalid naming the rule, before the database sees it,
// by Open, by OpenStore on db.Store, and by the readers. Before, a NUL or
// a byte that is not UTF-8 came back as the server's "invalid byte
// sequence" (with the NUL in the message), a newline was taken, and a
// name of some kilobytes failed the unique index.
func TestRunNamesFollowTheStageNameRule(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	long := strings.Repeat("n", 257)
	for _, name := range []string{"a\x00b", "bad\xffutf8", "two\nlines", "tab\there", " lead", "trail ", long} {
		_, err := db.Open(ctx, name, t.TempDir(), &runstate.Options{Request: "r"})
		require.ErrorIs(t, err, runstate.ErrInvalid, "Open(%q)", name)
		assert.Contains(t, err.Error(), "run name")
		assert.NotContains(t, err.Error(), "\x00", "the message quotes the name")
		assert.NotContains(t, err.Error(), "\n", "the message quotes the name")
		_, err = runstate.OpenStore(db.Store(name), t.TempDir(), &runstate.Options{Request: "r"})
		require.ErrorIs(t, err, runstate.ErrInvalid, "OpenStore(%q)", name)
		_, err = db.Inspect(ctx, name)
		require.ErrorIs(t, err, runstate.ErrInvalid, "Inspect(%q)", name)
		_, err = db.Has(ctx, name)
		require.ErrorIs(t, err, runstate.ErrInvalid, "Has(%q)", name)
	}
	names, err := db.Runs(ctx)
	require.NoError(t, err)
	assert.Empty(t, names, "nothing was created")
	for _, name := range []string{"billing-2026-11-29", "ünïcode run", "x?run=y&schema=z", "../../etc", strings.Repeat("n", 256)} {
		r, err := db.Open(ctx, name, t.TempDir(), &runstate.Options{Request: "r"})
		require.NoError(t, err, "Open(%q)", name)
		require.NoError(t, r.Close())
	}
}
