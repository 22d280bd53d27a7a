package runstate

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The two ways of BenchmarkReplayFactsAhead are measured in the same
// process, iteration by iteration in alternating order, so that the load
// of other processes on a shared machine falls on both alike; it reports
// the median of each way and the gain.

// alternate runs each of the two ways of fn once per iteration, in
// alternating order, and reports the median of each and how much less
// the first takes.
func alternate(b *testing.B, names [2]string, scale float64, set func(bool), fn func(i int)) {
	b.Helper()
	var times [2][]time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := range 2 {
			way := (i + k) % 2
			set(way == 0)
			start := time.Now()
			fn(2*i + k)
			times[way] = append(times[way], time.Since(start))
		}
	}
	b.StopTimer()
	set(true)
	median := func(d []time.Duration) float64 { slices.Sort(d); return float64(d[len(d)/2]) / scale }
	m0, m1 := median(times[0]), median(times[1])
	b.ReportMetric(m0, names[0])
	b.ReportMetric(m1, names[1])
	b.ReportMetric(100*(m1-m0)/m1, "gain-%")
}

// BenchmarkReplayFactsAhead is Verify of a 100,000-record ledger with the
// crc check and plainLine computed ahead by the line source, on the
// hashing goroutine (factsAhead), and without, by the decoding goroutine
// (before): ns per record each.
func BenchmarkReplayFactsAhead(b *testing.B) {
	const n = 100_000
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("runstate-bench-ahead-f%d-n%d", FormatVersion, n))
	if _, err := os.Stat(filepath.Join(dir, manifestFile)); err != nil {
		os.RemoveAll(dir)
		if err := genRun(dir, n, true); err != nil {
			b.Fatal(err)
		}
	}
	alternate(b, [2]string{"ahead-ns/rec", "before-ns/rec"}, n, func(on bool) { factsAhead = on }, func(int) {
		rep, err := Verify(dir)
		if err != nil || rep.Records < n {
			b.Fatal(err, rep.Records)
		}
	})
}
