//go:build unix

package cpustat

import (
	"testing"
	"time"
)

// Spinning counts: CPU time reaches 20 ms well within 10 s of spinning,
// however busy the machine (a Self stuck at 0, or not moving, fails).
func TestSelfCountsThisProcesssWork(t *testing.T) {
	before := Self()
	deadline := time.Now().Add(10 * time.Second)
	turns := 0
	for Self()-before < 20*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("10 s of spinning (%d turns) counted %v of CPU", turns, Self()-before)
		}
		for range 10000 {
			turns++
		}
	}
}
