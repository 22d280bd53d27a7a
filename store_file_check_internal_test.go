package runstate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRingBatchFailsClosedWhenTheJournalIsReplaced: a batch to be made
// durable in logs/ledger.wal fails, naming it, once the journal is no
// longer the file the session opened, and the Run turns read-only
// (TestAppendFailsClosedWhenItsFileIsReplaced has the ledger's cases).
func TestRingBatchFailsClosedWhenTheJournalIsReplaced(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(p string) error
	}{
		{"deleted", os.Remove},
		{"replaced by a copy", func(p string) error {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := os.WriteFile(p+".new", data, 0o644); err != nil {
				return err
			}
			return os.Rename(p+".new", p)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			r, err := Open(dir, &Options{Request: "journal", durable: durableRingOnly})
			require.NoError(t, err)
			defer r.Close()
			require.NoError(t, r.Do(ctx, "a", func(context.Context, *Stage) error { return nil }))
			p := filepath.Join(dir, filepath.FromSlash(walFile))
			require.NoError(t, c.change(p))
			err = r.Do(ctx, "b", func(context.Context, *Stage) error { return nil })
			var werr *WriteError
			require.ErrorAs(t, err, &werr)
			assert.True(t, werr.Sticky)
			assert.Equal(t, p, werr.Path)
			assert.ErrorIs(t, r.Plan(ctx, "c"), ErrReadOnly)
		})
	}
}

// BenchmarkCheckFiles is what checkFiles and checkJournal add to a
// checkpoint at most: a statx (an lstat elsewhere) of the ledger and, for
// a batch made durable in the ring, of the journal.
func BenchmarkCheckFiles(b *testing.B) {
	r, err := Open(b.TempDir(), &Options{Request: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	if fileStoreOf(r).wal.f == nil || fileStoreOf(r).ids.ledger == (fileID{}) {
		b.Fatal("no journal, or no file identity to check")
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := fileStoreOf(r).checkFile(ledgerFile, fileStoreOf(r).ids.ledger); err != nil {
			b.Fatal(err)
		}
		if err := fileStoreOf(r).checkJournal(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpointFileCheck measures checkFiles inside a checkpoint
// (Do with one WriteFile): each iteration makes one checkpoint with the
// check and one without (a zero fileIDs is not checked), in alternating
// order, so that the machine's load falls on both alike. It reports the
// median of each and the difference.
func BenchmarkCheckpointFileCheck(b *testing.B) {
	r, err := Open(b.TempDir(), &Options{Request: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ids := fileStoreOf(r).ids
	ctx := context.Background()
	var on, off []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k, check := range []bool{i%2 == 0, i%2 != 0} {
			r.stMu.Lock()
			fileStoreOf(r).ids = fileIDs{}
			if check {
				fileStoreOf(r).ids = ids
			}
			r.stMu.Unlock()
			name := fmt.Sprintf("s%d-%d", i, k)
			start := time.Now()
			if err := r.Do(ctx, name, func(_ context.Context, st *Stage) error {
				return st.WriteFile("artifacts/"+name, []byte("result of the stage: 42 lines changed\n"))
			}); err != nil {
				b.Fatal(err)
			}
			if d := time.Since(start); check {
				on = append(on, d)
			} else {
				off = append(off, d)
			}
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) float64 { slices.Sort(d); return float64(d[len(d)/2]) }
	mon, moff := median(on), median(off)
	b.ReportMetric(mon, "check-ns")
	b.ReportMetric(moff, "nocheck-ns")
	b.ReportMetric(100*(mon-moff)/moff, "cost-%")
}
