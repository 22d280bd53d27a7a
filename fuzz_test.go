package runstate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

// Fuzz targets for everything runstate reads back: the ledger, the
// manifest snapshot and the handoff. The seeds run as ordinary tests; to
// fuzz, by hand:
//
//	go test -run '^$' -fuzz FuzzLedger -fuzztime 60s .
//	go test -run '^$' -fuzz FuzzManifest -fuzztime 60s .
//	go test -run '^$' -fuzz FuzzNextSteps -fuzztime 30s .
//	go test -run '^$' -fuzz FuzzRecordRoundTrip -fuzztime 30s .

// ledgerSeeds are the checked-in fixtures, a ledger this version writes,
// and damaged copies of them: torn tails, bad lines in the middle, lines
// swapped and repeated.
func ledgerSeeds(f *testing.F) [][]byte {
	var seeds [][]byte
	files, _ := filepath.Glob(filepath.Join("testdata", "*.jsonl"))
	for _, p := range files {
		data, err := os.ReadFile(p)
		require.NoError(f, err)
		seeds = append(seeds, data)
	}
	seeds = append(seeds, fuzzRunLedger(f))
	var out [][]byte
	for _, s := range seeds {
		out = append(out, s)
		lines := bytes.SplitAfter(s, []byte("\n"))
		if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
			lines = lines[:len(lines)-1]
		}
		if len(lines) < 3 {
			continue
		}
		join := func(ls [][]byte) []byte { return bytes.Join(ls, nil) }
		last := lines[len(lines)-1]
		mid := len(lines) / 2
		out = append(out,
			s[:len(s)-len(last)/2], // torn tail
			s[:len(s)-1],           // no final newline
			append(bytes.Clone(s), `{"seq":`...),
			join(append(append(append([][]byte{}, lines[:mid]...), []byte("{not json}\n")), lines[mid+1:]...)),   // bad middle
			join(append(append(append([][]byte{}, lines[:mid]...), lines[mid+1], lines[mid]), lines[mid+2:]...)), // swapped
			join(append(append(append([][]byte{}, lines[:mid+1]...), lines[mid]), lines[mid+1:]...)),             // repeated
			join(append(append([][]byte{}, lines[:mid]...), lines[mid+1:]...)),                                   // deleted
			bytes.Replace(s, []byte(`"format":1`), []byte(`"format":2`), 1),                                      // a v2 header
			bytes.Replace(s, []byte(`"ev":"complete"`), []byte(`"ev":"c0mplete"`), 1),                            // edited
		)
	}
	return append(out, nil, []byte("\n"), []byte("{}\n"), []byte(`{"seq":1,"ev":"create","prev":""}`+"\n"))
}

// fuzzRunLedger builds a small run with this version and returns its
// ledger.
func fuzzRunLedger(t testing.TB) []byte {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := runstate.Open(dir, &runstate.Options{Request: "fuzz seed", NoSync: true})
	require.NoError(t, err)
	require.NoError(t, r.Plan(ctx, "a", "b"))
	require.NoError(t, r.Do(ctx, "a", func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/a.txt", []byte("alpha"))
	}))
	_, err = r.Effect(ctx, "ticket", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) { return json.RawMessage(`{"id":7}`), nil }})
	require.NoError(t, err)
	st, err := r.Begin(ctx, "b", runstate.After("a"), runstate.Value("n", 3))
	require.NoError(t, err)
	require.NoError(t, st.Fail(errors.New("flaky")))
	require.NoError(t, r.Close())
	data, err := os.ReadFile(filepath.Join(dir, "logs", "ledger.jsonl"))
	require.NoError(t, err)
	return data
}

// goodPrefix returns the bytes of the first n lines of data.
func goodPrefix(data []byte, n int) []byte {
	off := 0
	for i := 0; i < n; i++ {
		j := bytes.IndexByte(data[off:], '\n')
		if j < 0 {
			return data
		}
		off += j + 1
	}
	return data[:off]
}

// FuzzLedger feeds arbitrary bytes to every reader of the ledger: ReadLedger,
// Inspect, Verify and Open. None may panic; each returns a valid prefix
// (records 1..n in order) or an error that names the file and the line;
// Open writes nothing to a ledger it refuses, and what it accepts it
// keeps: the valid prefix stays, byte for byte.
func FuzzLedger(f *testing.F) {
	for _, s := range ledgerSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		lp := filepath.Join(dir, "logs", "ledger.jsonl")
		require.NoError(t, os.MkdirAll(filepath.Dir(lp), 0o755))
		require.NoError(t, os.WriteFile(lp, data, 0o644))

		var recs []*runstate.Record
		err := runstate.ReadLedger(dir, func(r *runstate.Record) error {
			recs = append(recs, r)
			return nil
		})
		for i, r := range recs {
			require.Equal(t, int64(i+1), r.Seq, "ReadLedger passes records 1..n in order")
		}
		prefix := goodPrefix(data, len(recs))
		var ce *runstate.CorruptError
		switch {
		case err == nil:
		case errors.As(err, &ce):
			assert.Equal(t, lp, ce.Path, "the error names the file")
			assert.Equal(t, len(recs)+1, ce.Line, "the error names the first bad line")
			assert.Equal(t, int64(len(prefix)), ce.Offset, "and its byte offset")
			assert.Contains(t, err.Error(), lp)
		case errors.Is(err, runstate.ErrVersion):
			assert.Contains(t, err.Error(), lp)
		default:
			t.Fatalf("ReadLedger: an error that is neither corruption nor a version: %v", err)
		}

		st, ierr := runstate.Inspect(dir)
		if ierr == nil {
			assert.Equal(t, int64(len(recs)), st.Seq, "Inspect reads the same records")
			assert.Nil(t, err)
		} else {
			assert.Contains(t, ierr.Error(), lp, "Inspect's error names the file")
		}

		rep, verr := runstate.Verify(dir)
		if errors.Is(err, runstate.ErrVersion) {
			require.ErrorIs(t, verr, runstate.ErrVersion, "Verify does not check a format it does not know")
			assert.Contains(t, verr.Error(), lp)
		} else {
			require.NoError(t, verr, "Verify reads any file")
			assert.Equal(t, int64(len(recs)), rep.Records)
		}
		if err != nil && verr == nil {
			require.False(t, rep.OK())
			assert.Equal(t, lp, rep.Problems[0].File)
			if ce != nil {
				assert.Equal(t, ce.Line, rep.Problems[0].Line)
			}
		}

		r, oerr := runstate.Open(dir, &runstate.Options{NoSync: true})
		after, rerr := os.ReadFile(lp)
		require.NoError(t, rerr)
		if oerr != nil {
			if errors.As(oerr, &ce) || errors.Is(oerr, runstate.ErrVersion) {
				assert.Equal(t, data, after, "Open writes nothing to a ledger it refuses")
				assert.Contains(t, oerr.Error(), lp)
			} else {
				assert.ErrorIs(t, oerr, runstate.ErrInvalid, "Open's other refusal: an empty ledger and no Request")
				assert.Empty(t, recs)
			}
			return
		}
		require.NotEmpty(t, recs, "Open resumed a run from a ledger with no record")
		require.NoError(t, err, "Open accepted a ledger that ReadLedger refuses")
		require.NoError(t, r.Close())
		after, rerr = os.ReadFile(lp)
		require.NoError(t, rerr)
		assert.True(t, bytes.HasPrefix(after, prefix), "what Open accepted it keeps")
		var again []*runstate.Record
		require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error {
			again = append(again, r)
			return nil
		}), "the ledger is valid after Open and Close")
		assert.Greater(t, len(again), len(recs))
		if len(prefix) < len(data) {
			torn, _ := filepath.Glob(lp + ".torn-*")
			assert.Len(t, torn, 1, "the torn tail was saved aside")
		}
	})
}

// fuzzRun builds the run the manifest and handoff fuzzers start from.
func fuzzRun(t testing.TB) string {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := runstate.Open(dir, &runstate.Options{Request: "fuzz seed", NoSync: true})
	require.NoError(t, err)
	require.NoError(t, r.Plan(ctx, "a", "b", "c"))
	require.NoError(t, r.Do(ctx, "a", func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/a.txt", []byte("alpha"))
	}))
	_, err = r.Effect(ctx, "ticket", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) { return json.RawMessage(`{"id": 7}`), nil }})
	require.NoError(t, err)
	require.NoError(t, r.Skip(ctx, "c", "not needed"))
	require.NoError(t, r.Close())
	return dir
}

// copyRun copies a run directory.
func copyRun(t testing.TB, from string) string {
	to := t.TempDir()
	require.NoError(t, os.CopyFS(to, os.DirFS(from)))
	return to
}

// stateOf is what must not depend on how a run was loaded.
func stateOf(t testing.TB, s *runstate.Status) map[string]any {
	t.Helper()
	stages := map[string]string{}
	for _, st := range s.Stages {
		stages[st.Name] = st.State
	}
	effects := map[string]string{}
	for _, e := range s.Effects {
		effects[e.Key] = e.State + " " + string(e.Receipt)
	}
	return map[string]any{"seq": s.Seq, "id": s.ID, "plan": s.Plan, "stages": stages, "effects": effects, "artifacts": s.Artifacts, "request": s.Request}
}

// FuzzManifest opens a run whose manifest.json is arbitrary bytes. Open
// and Inspect must not panic and must load the same state as a full replay
// of the ledger: a manifest that is not exactly a snapshot of this ledger
// is ignored. After Open and Close, the manifest is rebuilt and the run
// verifies.
func FuzzManifest(f *testing.F) {
	base := fuzzRun(f)
	good, err := os.ReadFile(filepath.Join(base, "manifest.json"))
	require.NoError(f, err)
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte("{}"))
	f.Add([]byte("null"))
	f.Add([]byte(`{"format":1,"seq":1,"ledger":{"offset":0,"end":10,"hash":"` + strings.Repeat("0", 64) + `"}}`))
	f.Add(bytes.Replace(good, []byte(`"state": "complete"`), []byte(`"state": "fatal"`), 1))
	f.Add(bytes.Replace(good, []byte(`"format": 1`), []byte(`"format": 2`), 1))
	f.Add(bytes.Replace(good, []byte(`"id": 7`), []byte(`"id": 8`), 1))
	f.Add(bytes.Replace(good, []byte(`"plan": [`), []byte(`"plan": ["z",`), 1))
	ref, err := runstate.Inspect(base)
	require.NoError(f, err)
	os.Remove(filepath.Join(base, "manifest.json"))
	replayed, err := runstate.Inspect(base) // no manifest: a full replay
	require.NoError(f, err)
	require.Equal(f, stateOf(f, replayed), stateOf(f, ref))
	want := stateOf(f, replayed)

	f.Fuzz(func(t *testing.T, data []byte) {
		dir := copyRun(t, base)
		mp := filepath.Join(dir, "manifest.json")
		require.NoError(t, os.WriteFile(mp, data, 0o644))
		st, err := runstate.Inspect(dir)
		require.NoError(t, err, "a bad manifest is ignored, not an error")
		assert.Equal(t, want, stateOf(t, st), "Inspect loads the ledger's state whatever the manifest says")
		r, err := runstate.Open(dir, &runstate.Options{NoSync: true})
		require.NoError(t, err)
		st, err = r.Status()
		require.NoError(t, err)
		got := stateOf(t, st)
		got["seq"] = want["seq"] // Open appended its open record
		assert.Equal(t, want, got, "Open loads the ledger's state whatever the manifest says")
		require.NoError(t, r.Close())
		rep, err := runstate.Verify(dir)
		require.NoError(t, err)
		assert.True(t, rep.OK(), "Close rebuilt the projections: %v", rep.Problems)
	})
}

// FuzzNextSteps gives a run an arbitrary logs/next-steps.txt: Verify must
// not panic and must call it out unless its first line names the ledger's
// last seq; Open rebuilds it.
func FuzzNextSteps(f *testing.F) {
	base := fuzzRun(f)
	np := filepath.Join(base, "logs", "next-steps.txt")
	good, err := os.ReadFile(np)
	require.NoError(f, err)
	f.Add(good)
	f.Add(good[:20])
	f.Add([]byte(""))
	f.Add([]byte("as of ledger seq 99999999999999999999999 (x)\n"))
	f.Add([]byte("as of ledger seq -1 \n"))
	f.Add(bytes.Repeat([]byte("x"), 5000))
	st, err := runstate.Inspect(base)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := copyRun(t, base)
		p := filepath.Join(dir, "logs", "next-steps.txt")
		require.NoError(t, os.WriteFile(p, data, 0o644))
		rep, err := runstate.Verify(dir)
		require.NoError(t, err)
		if !bytes.Equal(data, good) && !rep.OK() {
			assert.Equal(t, p, rep.Problems[0].File, "the problem is the handoff")
		}
		if rep.OK() {
			first, _, _ := strings.Cut(string(data), "\n")
			assert.Contains(t, first, "seq ", "a handoff Verify accepts names a seq")
		}
		r, err := runstate.Open(dir, &runstate.Options{NoSync: true})
		require.NoError(t, err, "a bad handoff never stops Open")
		require.NoError(t, r.Close())
		rep, err = runstate.Verify(dir)
		require.NoError(t, err)
		assert.True(t, rep.OK(), "Open and Close rebuilt it: %v", rep.Problems)
		_ = st
	})
}

// FuzzJournal feeds damaged journals (logs/ledger.wal) to every reader
// and to Open, on a run whose ledger lost its last records in a machine
// crash: the journal still holds them. The input is written over the
// journal at the offset its first two bytes name. Whatever the journal
// holds, the ledger's own records are read as they are, nothing panics,
// Open restores only records that continue the chain, and the run opens
// cleanly again afterwards. An untouched journal restores every record.
func FuzzJournal(f *testing.F) {
	ctx := context.Background()
	base := f.TempDir()
	r, err := runstate.Open(base, &runstate.Options{Request: "fuzz seed"})
	require.NoError(f, err)
	require.NoError(f, r.Plan(ctx, "a", "b"))
	for _, s := range []string{"a", "b"} {
		require.NoError(f, r.Do(ctx, s, func(_ context.Context, st *runstate.Stage) error {
			return st.WriteFile("artifacts/"+s+".txt", []byte(s))
		}))
	}
	runstatetest.Crash(r) // no close record, and the ledger is not synced
	lp := filepath.Join(base, "logs", "ledger.jsonl")
	full, err := os.ReadFile(lp)
	require.NoError(f, err)
	var want []int64
	require.NoError(f, runstate.ReadLedger(base, func(r *runstate.Record) error { want = append(want, r.Seq); return nil }))
	const keep = 3 // what the ledger kept of itself
	require.NoError(f, os.WriteFile(lp, goodPrefix(full, keep), 0o644))
	require.NoError(f, os.Remove(filepath.Join(base, "manifest.json")))

	f.Add([]byte{})
	f.Add([]byte{0, 0, 'x'})
	f.Add([]byte{0, 19, '9'})           // a slot's end
	f.Add([]byte{2, 0, 'x', 'y'})       // the second slot
	f.Add([]byte{16, 10, '{', '}', 10}) // the ring
	f.Add(append([]byte{0, 0}, bytes.Repeat([]byte{0}, 1024)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := copyRun(t, base)
		wp := filepath.Join(dir, "logs", "ledger.wal")
		if len(data) >= 2 {
			jf, err := os.OpenFile(wp, os.O_WRONLY, 0)
			require.NoError(t, err)
			fi, err := jf.Stat()
			require.NoError(t, err)
			off := int64(data[0])<<8 | int64(data[1])
			body := data[2:]
			if off+int64(len(body)) > fi.Size() {
				body = body[:max(0, fi.Size()-off)]
			}
			_, err = jf.WriteAt(body, off)
			require.NoError(t, err)
			require.NoError(t, jf.Close())
		}
		var seqs []int64
		require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error { seqs = append(seqs, r.Seq); return nil }))
		require.GreaterOrEqual(t, len(seqs), keep, "the ledger's own records are read")
		if len(data) < 2 {
			assert.Equal(t, want, seqs, "an untouched journal restores every record")
		}
		_, err := runstate.Inspect(dir)
		require.NoError(t, err)
		_, err = runstate.Verify(dir)
		require.NoError(t, err)
		r, err := runstate.Open(dir, &runstate.Options{Request: "fuzz seed"})
		require.NoError(t, err)
		require.NoError(t, r.Close())
		var after []int64
		require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error { after = append(after, r.Seq); return nil }))
		assert.Equal(t, seqs, after[:len(seqs)], "Open restores what the readers read")
		r, err = runstate.Open(dir, &runstate.Options{Request: "fuzz seed"})
		require.NoError(t, err)
		require.NoError(t, r.Close())
	})
}
