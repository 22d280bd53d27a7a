package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// importLedger appends a run directory's ledger lines to the run named
// name, one batch, through the store: the lines as they are.
func importLedger(t *testing.T, db *DB, name, dir string, ledger []byte) {
	t.Helper()
	ctx := context.Background()
	st := db.Store(name)
	_, _, err := st.Open(ctx, newSession(t))
	require.NoError(t, err)
	defer st.Close(true)
	b, err := st.Lock(ctx, runstate.Position{})
	require.NoError(t, err)
	defer b.Abort() // a no-op after Unlock
	var recs []*runstate.Record
	var to runstate.Position
	for _, line := range bytes.SplitAfter(ledger, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var rec runstate.Record
		require.NoError(t, json.Unmarshal(line, &rec))
		recs = append(recs, &rec)
		for _, o := range rec.Outputs {
			data, err := os.ReadFile(filepath.Join(dir, o.Path))
			require.NoError(t, err)
			require.NoError(t, st.Blobs().Put(ctx, o.SHA256, o.Size, bytes.NewReader(data)))
		}
		to = runstate.Position{Seq: rec.Seq, Hash: lineHash(line[:len(line)-1]), End: to.End + int64(len(line)), LastLen: int64(len(line)), CRC: true}
	}
	require.NoError(t, b.Append(recs, ledger, to))
	require.NoError(t, b.Sync(ctx))
	require.NoError(t, b.Unlock())
}

// fileRun makes a small finished run in a directory and returns it and
// its ledger.
func fileRun(t *testing.T) (string, []byte) {
	dir := t.TempDir()
	ctx := context.Background()
	run, err := runstate.Open(dir, &runstate.Options{Request: "export test"})
	require.NoError(t, err)
	require.NoError(t, run.Plan(ctx, "a", "b"))
	require.NoError(t, run.Do(ctx, "a", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("out/a.txt", []byte("made by a\n"))
	}))
	require.NoError(t, run.Do(ctx, "b", func(ctx context.Context, st *runstate.Stage) error { return nil }, runstate.After("a")))
	require.NoError(t, run.Close())
	data, err := os.ReadFile(filepath.Join(dir, "logs", "ledger.jsonl"))
	require.NoError(t, err)
	return dir, data
}

func TestExportIsTheLedgerByteForByte(t *testing.T) {
	db := newTestDB(t)
	dir, ledger := fileRun(t)
	importLedger(t, db, "r", dir, ledger)
	var out bytes.Buffer
	require.NoError(t, db.Export(context.Background(), "r", &out))
	assert.Equal(t, string(ledger), out.String())

	// runstate.Verify reads the export as a run directory's ledger.
	dir = t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "ledger.jsonl"), out.Bytes(), 0o644))
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	var ledgerProblems []runstate.Problem
	for _, p := range rep.Problems {
		if filepath.Base(p.File) == "ledger.jsonl" {
			ledgerProblems = append(ledgerProblems, p)
		}
	}
	assert.Empty(t, ledgerProblems)
	assert.Equal(t, int64(bytes.Count(ledger, []byte("\n"))), rep.Records)
}

func TestInspectAndReadLedgerWithoutSession(t *testing.T) {
	db := newTestDB(t)
	dir, ledger := fileRun(t)
	importLedger(t, db, "r", dir, ledger)
	ctx := context.Background()
	st, err := db.Inspect(ctx, "r")
	require.NoError(t, err)
	assert.Equal(t, "export test", st.Request)
	var n int
	require.NoError(t, db.ReadLedger(ctx, "r", func(rec *runstate.Record) error {
		n++
		assert.Equal(t, int64(n), rec.Seq)
		return nil
	}))
	assert.Equal(t, bytes.Count(ledger, []byte("\n")), n)
	text, err := db.NextSteps(ctx, "r")
	require.NoError(t, err)
	assert.Contains(t, text, "run=r")
	rep, err := db.Verify(ctx, "r")
	require.NoError(t, err)
	assert.Empty(t, rep.Problems)

	_, err = db.Inspect(ctx, "no-such-run")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `no run "no-such-run"`)
}

// Verify finds a head row that does not name the last record.
func TestVerifyFindsHeadRowOffTheRecords(t *testing.T) {
	db := newTestDB(t)
	dir, ledger := fileRun(t)
	importLedger(t, db, "r", dir, ledger)
	_, err := db.pool.Exec(context.Background(), db.sql("UPDATE {s}.runs SET last_seq = last_seq - 1"))
	require.NoError(t, err)
	rep, err := db.Verify(context.Background(), "r")
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1)
	assert.Contains(t, rep.Problems[0].What, "head row")
}

// A run written through pgstore exports as a ledger runstate.Verify passes.
func TestExportOfARunWrittenHereVerifies(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "export"})
	require.NoError(t, err)
	require.NoError(t, r.Plan(ctx, "a", "b"))
	require.NoError(t, r.Do(ctx, "a", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("out/a.txt", []byte("a\n"))
	}))
	require.NoError(t, r.Skip(ctx, "b", "not needed"))
	require.NoError(t, r.Close())
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs"), 0o755))
	f, err := os.Create(filepath.Join(dir, "logs", "ledger.jsonl"))
	require.NoError(t, err)
	require.NoError(t, db.Export(ctx, "r", f))
	require.NoError(t, f.Close())
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	for _, p := range rep.Problems {
		assert.NotEqual(t, "ledger.jsonl", filepath.Base(p.File), "%v", p)
	}
	status, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, "export", status.Request)
	require.Len(t, status.Stages, 2)
	assert.Equal(t, runstate.StateComplete, status.Stages[0].State)
	assert.Equal(t, runstate.StateSkipped, status.Stages[1].State)
}
