package runstate

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkOutputHash is one output's hash as Begin checks a completed
// stage's outputs, Stage.Output declares one, and Verify rehashes them: a
// small file (the size of a typical checkpoint's output) through
// outputs.hash.
func BenchmarkOutputHash(b *testing.B) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "out.txt"), []byte("result 12345: the parser handles the three invoice formats; 14 tests added and passing\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	o, err := openOutputs(dir, "bench", 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer o.close()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := o.hash("out.txt"); err != nil {
			b.Fatal(err)
		}
	}
}
