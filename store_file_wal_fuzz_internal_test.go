package runstate

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
	r, err := Open(base, &Options{Request: "fuzz seed", durable: durableRingOnly})
	require.NoError(f, err)
	require.NoError(f, r.Plan(ctx, "a", "b"))
	for _, s := range []string{"a", "b"} {
		require.NoError(f, r.Do(ctx, s, func(_ context.Context, st *Stage) error {
			return st.WriteFile("artifacts/"+s+".txt", []byte(s))
		}))
	}
	r.crash() // no close record, and the ledger is not synced
	lp := filepath.Join(base, "logs", "ledger.jsonl")
	full, err := os.ReadFile(lp)
	require.NoError(f, err)
	var want []int64
	require.NoError(f, ReadLedger(base, func(r *Record) error { want = append(want, r.Seq); return nil }))
	const keep = 3 // what the ledger kept of itself
	require.NoError(f, os.WriteFile(lp, firstLines(full, keep), 0o644))
	require.NoError(f, os.Remove(filepath.Join(base, "manifest.json")))

	f.Add([]byte{})
	f.Add([]byte{0, 0, 'x'})
	f.Add([]byte{0, 19, '9'})           // a slot's end
	f.Add([]byte{2, 0, 'x', 'y'})       // the second slot
	f.Add([]byte{16, 10, '{', '}', 10}) // the ring
	f.Add(append([]byte{0, 0}, bytes.Repeat([]byte{0}, 1024)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := copyDir(t, base)
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
		require.NoError(t, ReadLedger(dir, func(r *Record) error { seqs = append(seqs, r.Seq); return nil }))
		require.GreaterOrEqual(t, len(seqs), keep, "the ledger's own records are read")
		if len(data) < 2 {
			assert.Equal(t, want, seqs, "an untouched journal restores every record")
		}
		_, err := Inspect(dir)
		require.NoError(t, err)
		_, err = Verify(dir)
		require.NoError(t, err)
		r, err := Open(dir, &Options{Request: "fuzz seed"})
		require.NoError(t, err)
		require.NoError(t, r.Close())
		var after []int64
		require.NoError(t, ReadLedger(dir, func(r *Record) error { after = append(after, r.Seq); return nil }))
		assert.Equal(t, seqs, after[:len(seqs)], "Open restores what the readers read")
		r, err = Open(dir, &Options{Request: "fuzz seed"})
		require.NoError(t, err)
		require.NoError(t, r.Close())
	})
}

// firstLines returns the bytes of the first n lines of data.
func firstLines(data []byte, n int) []byte {
	off := 0
	for i := 0; i < n; i++ {
		off += bytes.IndexByte(data[off:], '\n') + 1
	}
	return data[:off]
}

// copyDir copies a run directory.
func copyDir(t testing.TB, from string) string {
	to := t.TempDir()
	require.NoError(t, os.CopyFS(to, os.DirFS(from)))
	return to
}
