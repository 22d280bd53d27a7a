package pgstore

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bigOutput is more than one blob chunk, not a repetition of one byte.
func bigOutput() []byte {
	data := make([]byte, chunkSize+12345)
	for i := range data {
		data[i] = byte(i*31 + i/997)
	}
	return data
}

// A stage on machine B (its own work dir) that depends on a stage done on
// machine A finds A's outputs in its dir, byte for byte.
func TestAfterOutputsFollowTheRunToAnotherDir(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	opts := &runstate.Options{Request: "outputs across machines"}
	a, err := db.Open(ctx, "r", dirA, opts)
	require.NoError(t, err)
	big := bigOutput()
	require.NoError(t, a.Do(ctx, "make", func(ctx context.Context, st *runstate.Stage) error {
		if err := st.WriteFile("out/small.txt", []byte("small\n")); err != nil {
			return err
		}
		return st.WriteFile("out/big.bin", big)
	}))
	require.NoError(t, a.Close())

	b, err := db.Open(ctx, "r", dirB, opts)
	require.NoError(t, err)
	defer b.Close()
	var saw []byte
	require.NoError(t, b.Do(ctx, "use", func(ctx context.Context, st *runstate.Stage) error {
		var err error
		saw, err = os.ReadFile(filepath.Join(dirB, "out", "big.bin"))
		return err
	}, runstate.After("make")))
	assert.True(t, bytes.Equal(big, saw), "the big output arrived whole")
	small, err := os.ReadFile(filepath.Join(dirB, "out", "small.txt"))
	require.NoError(t, err)
	assert.Equal(t, "small\n", string(small))
}

// A done stage whose local copy was altered or removed is restored from
// the database and stays done; one whose bytes are gone from the database
// too runs again.
func TestDoneStageOutputRestoredFromTheStore(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	opts := &runstate.Options{Request: "restore"}
	r, err := db.Open(ctx, "r", dir, opts)
	require.NoError(t, err)
	defer r.Close()
	runs := 0
	stage := func(ctx context.Context, st *runstate.Stage) error {
		runs++
		return st.WriteFile("out/a.txt", []byte("the result\n"))
	}
	require.NoError(t, r.Do(ctx, "a", stage))
	p := filepath.Join(dir, "out", "a.txt")
	require.NoError(t, os.WriteFile(p, []byte("edited by hand\n"), 0o644))
	require.NoError(t, r.Do(ctx, "a", stage))
	assert.Equal(t, 1, runs, "an altered local copy is restored, not redone")
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "the result\n", string(got))

	require.NoError(t, os.Remove(p))
	require.NoError(t, r.Do(ctx, "a", stage))
	assert.Equal(t, 1, runs, "a missing local copy is restored")

	// The bytes gone from the database as well: the stage runs again.
	require.NoError(t, os.Remove(p))
	_, err = db.pool.Exec(ctx, db.sql(`DELETE FROM {s}.outputs; DELETE FROM {s}.blob_chunks; DELETE FROM {s}.blobs`))
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "a", stage))
	assert.Equal(t, 2, runs)
	st, err := r.Status()
	require.NoError(t, err)
	require.Len(t, st.Stages, 1)
	assert.Equal(t, runstate.StateComplete, st.Stages[0].State)
}

// Two stages that write one file, where the store keeps outputs' bytes:
// neither is redone (in a run directory each redoes the other on every
// run), each one's Begin puts its own bytes back, and the file holds the
// last one's (Stage.Output says so).
func TestTwoStagesThatWriteOneFileRestoreTheirOwn(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	r, err := db.Open(ctx, "r", dir, &runstate.Options{Request: "one file"})
	require.NoError(t, err)
	defer r.Close()
	runs := map[string]int{}
	p := filepath.Join(dir, "out", "x.txt")
	for range 3 {
		for _, name := range []string{"a", "b"} {
			require.NoError(t, r.Do(ctx, name, func(ctx context.Context, st *runstate.Stage) error {
				runs[name]++
				return st.WriteFile("out/x.txt", []byte("by "+name))
			}))
			got, err := os.ReadFile(p)
			require.NoError(t, err)
			assert.Equal(t, "by "+name, string(got), "after %s's Do", name)
		}
	}
	assert.Equal(t, map[string]int{"a": 1, "b": 1}, runs, "neither redone")
}

// A done stage whose output cannot be restored in this working directory
// (its directory is a link out of it) is not begun again from here: Do
// fails, saying so, with nothing recorded and nothing written outside; the
// stage stays complete for the run's other sessions (found in review: a
// new attempt from the broken directory failed the shared stage).
func TestDoneStageOutputThatCannotBeRestoredHereIsNoNewAttempt(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	opts := &runstate.Options{Request: "restore elsewhere"}
	a, err := db.Open(ctx, "r", t.TempDir(), opts)
	require.NoError(t, err)
	runs := 0
	stage := func(ctx context.Context, st *runstate.Stage) error {
		runs++
		return st.WriteFile("out/a.txt", []byte("the result\n"))
	}
	require.NoError(t, a.Do(ctx, "a", stage))
	require.NoError(t, a.Close())

	dirB, outside := t.TempDir(), t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(dirB, "out")))
	b, err := db.Open(ctx, "r", dirB, opts)
	require.NoError(t, err)
	defer b.Close()
	before := runRecords(t, db, "r")
	err = b.Do(ctx, "a", stage)
	require.Error(t, err)
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "stage a is complete: nothing was recorded; fix this working directory")
	assert.Equal(t, 1, runs, "the stage function did not run")
	assert.Equal(t, before, runRecords(t, db, "r"), "nothing was recorded")
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written outside the working directory")
	st, err := db.Inspect(ctx, "r")
	require.NoError(t, err)
	s, _ := st.Stage("a")
	assert.Equal(t, runstate.StateComplete, s.State)
	assert.Equal(t, 1, s.Attempt)
}

// A done stage whose output's bytes in the database are not the
// recorded ones (a byte of a blob changed) cannot be restored from them:
// the stage runs again, instead of an error from Begin, and its bytes,
// put again, repair the blob: another machine restores the output from
// them without running the stage.
func TestDoneStageWithAlteredStoredBytesRunsAgain(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	r, err := db.Open(ctx, "r", dir, &runstate.Options{Request: "altered bytes"})
	require.NoError(t, err)
	defer r.Close()
	big := bigOutput()
	runs := 0
	stage := func(ctx context.Context, st *runstate.Stage) error {
		runs++
		return st.WriteFile("out/big.bin", big)
	}
	require.NoError(t, r.Do(ctx, "a", stage))
	tag, err := db.pool.Exec(ctx, db.sql(`UPDATE {s}.blob_chunks SET data = overlay(data placing '\xff'::bytea from 100 for 1) WHERE sha256 = $1 AND n = 1`), sumOf(big))
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	// And a chunk more: damaged bytes of another length.
	_, err = db.pool.Exec(ctx, db.sql(`INSERT INTO {s}.blob_chunks (sha256, n, data) VALUES ($1, 2, 'x')`), sumOf(big))
	require.NoError(t, err)
	_, err = db.pool.Exec(ctx, db.sql(`UPDATE {s}.blobs SET chunks = 3 WHERE sha256 = $1`), sumOf(big))
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(dir, "out", "big.bin")))

	require.NoError(t, r.Do(ctx, "a", stage), "not an error: the stage runs again")
	assert.Equal(t, 2, runs)
	got, err := os.ReadFile(filepath.Join(dir, "out", "big.bin"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(big, got))

	rc, err := db.Store("r").Blobs().Get(ctx, hex.EncodeToString(sumOf(big)))
	require.NoError(t, err)
	stored, err := io.ReadAll(rc)
	require.NoError(t, rc.Close())
	require.NoError(t, err, "the blob is repaired")
	assert.True(t, bytes.Equal(big, stored))
	var rows, chunks int
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT (SELECT count(*) FROM {s}.blob_chunks WHERE sha256 = $1), (SELECT chunks FROM {s}.blobs WHERE sha256 = $1)`), sumOf(big)).Scan(&rows, &chunks))
	assert.Equal(t, 2, rows, "the chunk past the bytes is gone")
	assert.Equal(t, 2, chunks)
	dir2 := t.TempDir()
	r2, err := db.Open(ctx, "r", dir2, &runstate.Options{Request: "altered bytes"})
	require.NoError(t, err)
	defer r2.Close()
	require.NoError(t, r2.Do(ctx, "a", stage))
	assert.Equal(t, 2, runs, "restored on the other machine, not run again")
	got, err = os.ReadFile(filepath.Join(dir2, "out", "big.bin"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(big, got))
}

// An -after stage's output whose bytes in the database are damaged
// cannot be fetched on another machine: Begin says which stage made it
// and how to store it anew, and records nothing (the fetch comes before
// the begin: no attempt is counted). Running that stage where its output
// is missing (its restore fails as the fetch did, so it runs again) puts
// the bytes again, and the stage that needs them then begins with them,
// as its first attempt.
func TestAfterOutputDamagedInTheStoreSaysWhichStageToRun(t *testing.T) {
	db, makeA := damagedA(t)
	ctx := context.Background()

	r2, err := db.Open(ctx, "r", t.TempDir(), nil)
	require.NoError(t, err)
	defer r2.Close()
	_, err = r2.Begin(ctx, "b", runstate.After("a"))
	require.ErrorIs(t, err, runstate.ErrCorrupt)
	assert.Contains(t, err.Error(), "stage a's stored output out/big.bin is damaged: run stage a in a working directory without that output")
	assert.Contains(t, err.Error(), "then begin this stage again")
	assert.Contains(t, err.Error(), "runstate: fetch output out/big.bin from run \"r\" in schema ")
	assert.Contains(t, err.Error(), "): runstate: stored output bytes are damaged: blob ", "the store's error, named once with the output")
	assert.NotContains(t, err.Error(), "ledger", "the ledger is whole")
	assert.Empty(t, recordsOf(ledger(t, db, "r"), "b"), "nothing recorded of b")

	r3, err := db.Open(ctx, "r", t.TempDir(), nil)
	require.NoError(t, err)
	defer r3.Close()
	ran := false
	require.NoError(t, r3.Do(ctx, "a", func(ctx context.Context, st *runstate.Stage) error { ran = true; return makeA(ctx, st) }))
	assert.True(t, ran, "a ran again where its output was missing")
	st, err := r2.Begin(ctx, "b", runstate.After("a"))
	require.NoError(t, err, "the bytes were stored anew")
	assert.Equal(t, 1, st.Attempt(), "the failed fetch counted no attempt")
	require.NoError(t, st.Complete())
}

// damagedA makes a run "r" whose stage a stored a large output,
// out/big.bin, then damages one byte of its stored bytes. It returns the
// function a ran.
func damagedA(t *testing.T) (*DB, func(context.Context, *runstate.Stage) error) {
	t.Helper()
	db := newTestDB(t)
	ctx := context.Background()
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "after"})
	require.NoError(t, err)
	big := bigOutput()
	makeA := func(ctx context.Context, st *runstate.Stage) error { return st.WriteFile("out/big.bin", big) }
	require.NoError(t, r.Do(ctx, "a", makeA))
	require.NoError(t, r.Close())
	_, err = db.pool.Exec(ctx, db.sql(`UPDATE {s}.blob_chunks SET data = overlay(data placing '\xff'::bytea from 100 for 1) WHERE sha256 = $1 AND n = 1`), sumOf(big))
	require.NoError(t, err)
	return db, makeA
}

// recordsOf returns the records of stage in recs.
func recordsOf(recs []runstate.Record, stage string) []runstate.Record {
	var of []runstate.Record
	for _, r := range recs {
		if r.Stage == stage {
			of = append(of, r)
		}
	}
	return of
}

// A session that has not seen the After stage complete (another machine
// completed it after the session read the run) learns of its outputs
// under the lock, and fetches them before it records the begin too: a
// fetch that fails records nothing, one that works leaves the bytes in
// place when the stage begins, and on neither path is an attempt
// counted that did not run.
func TestAfterOutputsLearnedUnderTheLockAreFetchedBeforeTheBegin(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	r1, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "after, learned late"})
	require.NoError(t, err)
	defer r1.Close()
	dir2 := t.TempDir()
	r2, err := db.Open(ctx, "r", dir2, nil)
	require.NoError(t, err)
	defer r2.Close()
	big := bigOutput()
	require.NoError(t, r1.Do(ctx, "a", func(ctx context.Context, st *runstate.Stage) error { return st.WriteFile("out/big.bin", big) }))
	sum := sumOf(big)
	_, err = db.pool.Exec(ctx, db.sql(`UPDATE {s}.blob_chunks SET data = overlay(data placing '\xff'::bytea from 100 for 1) WHERE sha256 = $1 AND n = 1`), sum)
	require.NoError(t, err)

	_, err = r2.Begin(ctx, "b", runstate.After("a"))
	require.ErrorIs(t, err, runstate.ErrCorrupt)
	assert.Empty(t, recordsOf(ledger(t, db, "r"), "b"), "nothing recorded of b")
	_, err = os.Stat(filepath.Join(dir2, "out", "big.bin"))
	require.ErrorIs(t, err, os.ErrNotExist, "no damaged bytes left in place")

	_, err = db.pool.Exec(ctx, db.sql(`UPDATE {s}.blob_chunks SET data = overlay(data placing $2::bytea from 100 for 1) WHERE sha256 = $1 AND n = 1`), sum, big[chunkSize+99:chunkSize+100])
	require.NoError(t, err, "the byte put back")
	st, err := r2.Begin(ctx, "b", runstate.After("a"))
	require.NoError(t, err)
	assert.Equal(t, 1, st.Attempt())
	got, err := os.ReadFile(filepath.Join(dir2, "out", "big.bin"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(big, got), "fetched before the begin")
	require.NoError(t, st.Complete())
	var begins int
	for _, rec := range recordsOf(ledger(t, db, "r"), "b") {
		if rec.Ev == "begin" {
			begins++
		}
	}
	assert.Equal(t, 1, begins)
}

// A small blob held both as chunks (put without a session) and in an
// outputs row is read from the row, whose hash the database checked:
// chunks damaged since do not fail Get.
func TestGetReadsACheckedOutputsRowFirst(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	data := []byte("a small output, put before any session\n")
	sum := hex.EncodeToString(sumOf(data))
	require.NoError(t, db.Store("r").Blobs().Put(ctx, sum, int64(len(data)), bytes.NewReader(data)), "as chunks: no session")
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "small"})
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "a", func(ctx context.Context, st *runstate.Stage) error { return st.WriteFile("a.txt", data) }))
	require.NoError(t, r.Close())
	var inline bool
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT EXISTS (SELECT 1 FROM {s}.outputs WHERE sha256 = $1 AND data IS NOT NULL)`), sumOf(data)).Scan(&inline))
	require.True(t, inline, "the output's row holds the bytes")
	tag, err := db.pool.Exec(ctx, db.sql(`UPDATE {s}.blob_chunks SET data = overlay(data placing '\xff'::bytea from 3 for 1) WHERE sha256 = $1`), sumOf(data))
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "and the chunk")

	rc, err := db.Store("r").Blobs().Get(ctx, sum)
	require.NoError(t, err)
	got, err := io.ReadAll(rc)
	require.NoError(t, rc.Close())
	require.NoError(t, err)
	assert.Equal(t, data, got)
}

func TestOutputOverMaxBlobRefusedClearly(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	old := MaxBlob
	MaxBlob = 1000
	defer func() { MaxBlob = old }()
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "max blob"})
	require.NoError(t, err)
	defer r.Close()
	st, err := r.Begin(ctx, "a")
	require.NoError(t, err)
	require.NoError(t, st.WriteFile("big", make([]byte, 1001)))
	err = st.Complete()
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "MaxBlob")
	assert.Contains(t, err.Error(), "big")
	require.NoError(t, st.Fail(err))
}

// Complete stores the bytes that WriteFile wrote, the ones its record
// names, even when the file changed on disk since; an output declared
// again with Output is read from the file (its record names the file's
// hash); and past the 1 MiB a stage keeps in memory, an output is read
// from its file too, where a change since WriteFile fails Complete and
// names the output.
func TestCompleteStoresTheBytesWriteFileWrote(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	opts := &runstate.Options{Request: "the bytes WriteFile wrote"}
	a, err := db.Open(ctx, "r", dirA, opts)
	require.NoError(t, err)
	defer a.Close()
	require.NoError(t, a.Do(ctx, "make", func(ctx context.Context, st *runstate.Stage) error {
		if err := st.WriteFile("out/kept.txt", []byte("written\n")); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dirA, "out", "kept.txt"), []byte("changed after\n"), 0o644); err != nil {
			return err
		}
		if err := st.WriteFile("out/declared.txt", []byte("written\n")); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dirA, "out", "declared.txt"), []byte("changed, then declared\n"), 0o644); err != nil {
			return err
		}
		return st.Output("out/declared.txt")
	}))

	b, err := db.Open(ctx, "r", dirB, opts)
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Do(ctx, "use", func(context.Context, *runstate.Stage) error { return nil }, runstate.After("make")))
	for name, want := range map[string]string{"kept.txt": "written\n", "declared.txt": "changed, then declared\n"} {
		got, err := os.ReadFile(filepath.Join(dirB, "out", name))
		require.NoError(t, err)
		assert.Equal(t, want, string(got), name)
	}

	// 17 outputs of 64 KiB: the 17th is past the 1 MiB kept, and read
	// from its file at Complete.
	st, err := a.Begin(ctx, "many")
	require.NoError(t, err)
	for i := range 17 {
		require.NoError(t, st.WriteFile(fmt.Sprintf("many/%02d", i), bytes.Repeat([]byte{byte('a' + i)}, 64<<10)))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dirA, "many", "16"), []byte("changed after\n"), 0o644))
	err = st.Complete()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "many/16")
	assert.Contains(t, err.Error(), "changed while it was stored")
	require.NoError(t, st.Fail(err))

	// One output written 20 times counts once against the 1 MiB.
	st, err = a.Begin(ctx, "again")
	require.NoError(t, err)
	for i := range 20 {
		require.NoError(t, st.WriteFile("again/one", bytes.Repeat([]byte{byte('a' + i)}, 64<<10)))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dirA, "again", "one"), []byte("changed after\n"), 0o644))
	require.NoError(t, st.Complete())
}

// An -after stage's output damaged in the store is the store's fault, not
// the work's: Begins of the stage after it that meet the damage (each
// records a begin, then fails it) do not use up its MaxAttempts, so that
// once the damage is repaired as Begin's error advises, "begin this stage
// again" begins it, instead of finding it awaiting a person ("retries
// exhausted") for a fault that was never its own.
func TestAfterOutputDamagedDoesNotUseUpAttempts(t *testing.T) {
	db, makeA := damagedA(t)
	ctx := context.Background()

	r2, err := db.Open(ctx, "r", t.TempDir(), nil) // MaxAttempts 3
	require.NoError(t, err)
	defer r2.Close()
	for i := range 4 {
		_, err = r2.Begin(ctx, "b", runstate.After("a"))
		require.ErrorIs(t, err, runstate.ErrCorrupt, "try %d", i+1)
		assert.NotErrorIs(t, err, runstate.ErrNeedsPerson, "try %d", i+1)
	}

	r3, err := db.Open(ctx, "r", t.TempDir(), nil)
	require.NoError(t, err)
	defer r3.Close()
	require.NoError(t, r3.Do(ctx, "a", makeA))
	st, err := r2.Begin(ctx, "b", runstate.After("a"))
	require.NoError(t, err, "the advice's 'begin this stage again' begins it")
	require.NoError(t, st.Complete())
}

// A stage running again in a working directory keeps its last outputs in
// the run's state until it ends. A Begin of a stage After it meanwhile is
// ErrNotReady and writes nothing there, from the session running it (its
// view is current) and from another session of the directory (two
// `runstate exec` on one machine) whose view is older (a complete, with
// the old bytes): the bytes the running attempt wrote stay, and its
// complete records them. Before, both fetched a's old bytes from the
// database over the new ones.
func TestABeginAfterARunningStageLeavesItsNewBytes(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	dir := t.TempDir()
	r1, err := db.Open(ctx, "r", dir, &runstate.Options{Request: "redo under a begin"})
	require.NoError(t, err)
	defer r1.Close()
	require.NoError(t, r1.Do(ctx, "a", func(ctx context.Context, st *runstate.Stage) error { return st.WriteFile("out/a.txt", []byte("old\n")) }))
	r2, err := db.Open(ctx, "r", dir, nil)
	require.NoError(t, err)
	defer r2.Close()

	require.NoError(t, r1.Invalidate(ctx, "a", "redo"))
	st, err := r1.Begin(ctx, "a")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "out", "a.txt"), []byte("new\n"), 0o644)) // the command's write
	require.NoError(t, st.Output("out/a.txt"))

	for _, r := range []*runstate.Run{r1, r2} {
		_, err = r.Begin(ctx, "b", runstate.After("a"))
		require.ErrorIs(t, err, runstate.ErrNotReady)
		got, err := os.ReadFile(filepath.Join(dir, "out", "a.txt"))
		require.NoError(t, err)
		assert.Equal(t, "new\n", string(got), "the running attempt's bytes stay")
	}
	require.NoError(t, st.Complete())
	status, err := r1.Status()
	require.NoError(t, err)
	a, ok := status.Stage("a")
	require.True(t, ok)
	require.Len(t, a.Outputs, 1)
	assert.Equal(t, hex.EncodeToString(sumOf([]byte("new\n"))), a.Outputs[0].SHA256, "a's second attempt records the bytes it wrote")
	stB, err := r2.Begin(ctx, "b", runstate.After("a"))
	require.NoError(t, err)
	require.NoError(t, stB.Complete())
}
