package runstate

import (
	"testing"
)

// BenchmarkCheckFiles is what checkFiles adds to a checkpoint: a statx
// (an lstat elsewhere) of the ledger and of the journal.
func BenchmarkCheckFiles(b *testing.B) {
	r, err := Open(b.TempDir(), &Options{Request: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	if r.wal.f == nil || r.ids.ledger == (fileID{}) {
		b.Fatal("no journal, or no file identity to check")
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := r.checkFiles([]*tx{{sync: true}}); err != nil {
			b.Fatal(err)
		}
	}
}
