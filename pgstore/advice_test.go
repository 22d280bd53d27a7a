package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAdviceNamesTheRunsAddress: what a person is told to run for a
// PostgreSQL run — in the errors of Begin (an awaiting or a fatal stage)
// and of a failed Effect, in Run.Status's and DB.Inspect's blocker
// Actions and in the handoff — names the run by its address (DB.Address,
// quoted for a shell), not the placeholder DIR nor the working directory.
func TestAdviceNamesTheRunsAddress(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	r, err := db.Open(ctx, "r", dir, &runstate.Options{Request: "advice"})
	require.NoError(t, err)
	defer r.Close()
	st, err := r.Begin(ctx, "review")
	require.NoError(t, err)
	require.ErrorIs(t, st.Await("read the diff"), runstate.ErrNeedsPerson)
	st, err = r.Begin(ctx, "deploy")
	require.NoError(t, err)
	require.NoError(t, st.Fail(runstate.Fatal(errors.New("the schema is gone"))))
	_, effect := r.Effect(ctx, "ticket", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, errors.New("timeout")
	}})
	require.ErrorIs(t, effect, runstate.ErrUnconfirmed)
	_, awaiting := r.Begin(ctx, "review")
	require.ErrorIs(t, awaiting, runstate.ErrNeedsPerson)
	_, fatal := r.Begin(ctx, "deploy")
	require.ErrorIs(t, fatal, runstate.ErrFatal)

	at := "'" + db.Address("r") + "'" // quoted for a shell: it has an &
	assert.Contains(t, awaiting.Error(), "approve it with: runstate approve "+at+" review -by NAME")
	assert.Contains(t, fatal.Error(), "fix the cause, then: runstate invalidate "+at+" deploy -reason TEXT")
	assert.Contains(t, effect.Error(), "resolve it with: runstate resolve "+at+" ticket -sent RECEIPT|-not-sent -by NAME")
	want := map[string]string{
		"review": "runstate approve " + at + " review -by NAME -note TEXT",
		"deploy": "fix the cause, then: runstate invalidate " + at + " deploy -reason TEXT",
		"ticket": "check the receiving system, then: runstate resolve " + at + " ticket -sent RECEIPT -by NAME (or -not-sent); a later Effect call for this key asks its Check again first, if it has one",
	}
	status, err := r.Status()
	require.NoError(t, err)
	inspected, err := db.Inspect(ctx, "r")
	require.NoError(t, err)
	page, err := r.NextSteps()
	require.NoError(t, err)
	for what, st := range map[string]*runstate.Status{"Run.Status": status, "DB.Inspect": inspected} {
		got := map[string]string{}
		for _, b := range st.Blockers {
			got[b.Stage+b.Key] = b.Action
			assert.Contains(t, page, "    do: "+b.Action+"\n", "the handoff says it as %s does", what)
		}
		assert.Equal(t, want, got, what)
	}
	for _, text := range []string{awaiting.Error(), fatal.Error(), effect.Error(), page} {
		assert.NotContains(t, text, " DIR ")
		assert.NotContains(t, text, dir, "the working directory is not the run's address")
	}
}

// TestCorruptErrorNamesTheRunsAddress: the error for a damaged record of
// a PostgreSQL run (a *runstate.CorruptError, from DB.Inspect and from
// DB.Open, which replays the records without a snapshot) tells a person to run 'runstate verify' on the run's address,
// quoted for a shell, not on the placeholder DIR nor the working
// directory.
func TestCorruptErrorNamesTheRunsAddress(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	r, err := db.Open(ctx, "r", dir, &runstate.Options{Request: "advice"})
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }))
	require.NoError(t, r.Close())
	tag, err := db.pool.Exec(ctx, db.sql(`UPDATE {s}.records SET line = overlay(line placing 'X'::bytea from 20 for 1)
		WHERE seq = 2 AND run_id = (SELECT id FROM {s}.runs WHERE name = 'r')`))
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	_, err = db.pool.Exec(ctx, db.sql(`DELETE FROM {s}.projections`)) // Open replays every record
	require.NoError(t, err)

	// Not runstate repair, which takes run directories only.
	want := "; runstate verify '" + db.Address("r") + "' lists every problem"
	_, inspectErr := db.Inspect(ctx, "r")
	_, openErr := db.Open(ctx, "r", dir, nil)
	for what, err := range map[string]error{"DB.Inspect": inspectErr, "DB.Open": openErr} {
		var ce *runstate.CorruptError
		require.ErrorAs(t, err, &ce, what)
		assert.Contains(t, err.Error(), want, what)
		assert.NotContains(t, err.Error(), "DIR", what)
		assert.NotContains(t, err.Error(), "repair", what)
		assert.NotContains(t, err.Error(), dir, what)
	}
}

// Errors that used to give pgx's or the server's bare words say what
// happened and what to do: a DB used after its Close ("closed pool"), a
// DSN with the runstate command's run= parameter (the server's
// "unrecognized configuration parameter"), a schema name that PostgreSQL
// reserves (pg_...).
func TestAdviceForAClosedDBARunParameterAndAReservedSchema(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "advice"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	db.Close()
	for name, call := range map[string]func() error{
		"Open": func() error {
			_, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "advice"})
			return err
		},
		"Inspect": func() error { _, err := db.Inspect(ctx, "r"); return err },
		"Runs":    func() error { _, err := db.Runs(ctx); return err },
		"Has":     func() error { _, err := db.Has(ctx, "r"); return err },
	} {
		err := call()
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "was closed (DB.Close) before this call", name)
		assert.NotContains(t, err.Error(), "closed pool", name)
	}

	for _, dsn := range []string{
		testDSN(t) + "&run=billing",
		"host=127.0.0.1 port=1 run=billing",
	} {
		_, err := Connect(ctx, dsn)
		require.Error(t, err, dsn)
		assert.Contains(t, err.Error(), "run= names a run for the runstate command; Connect takes the DSN without it: pass the run name to Open", dsn)
	}

	_, err = Connect(ctx, withSchema(testDSN(t), "pg_runs"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `schema name "pg_runs": PostgreSQL reserves names that begin with pg_`)
}
