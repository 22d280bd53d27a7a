package kit

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Loadavg returns the 1-minute load average, or "?" where there is no
// /proc/loadavg. Other processes busy with the disk make the figures noisy.
func Loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// FileCreation times the creation of n small files, each a new name
// (os.WriteFile), in a new directory under dir, and returns the median
// per file. The output files' figures depend on it, and on ext4 it swings
// twentyfold: for minutes after many files were deleted, each new inode's
// allocation skips, one by one and in the kernel, the free inodes deleted
// in the last minutes (ext4's recently_deleted, the top of a perf profile
// then). Measured here on 2026-12-02: 17-29 µs a file settled, 140-660 µs
// in the minutes after a benchmark or a test run removed some thousands
// of files. The files stay until dir is removed: deleting them would slow
// the creations that follow.
func FileCreation(dir string, n int) (time.Duration, error) {
	d, err := os.MkdirTemp(dir, "filecreation-")
	if err != nil {
		return 0, err
	}
	data := make([]byte, 100)
	times := make([]time.Duration, n)
	for i := range times {
		t0 := time.Now()
		if err := os.WriteFile(filepath.Join(d, "f"+strconv.Itoa(i)), data, 0o644); err != nil {
			return 0, err
		}
		times[i] = time.Since(t0)
	}
	return Median(times), nil
}

// FileCreationFiles is how many files the programs' FileCreation makes.
const FileCreationFiles = 200

// slowFileCreation is a FileCreation median above which the output
// files' figures of a run mostly measure the file system's recent
// deletions.
const slowFileCreation = 60 * time.Microsecond

// FileCreationLines is the report's line on FileCreation before and
// after the rounds, with a warning when it was slow and the run wrote
// output files.
func FileCreationLines(before, after time.Duration, outputs bool) string {
	s := fmt.Sprintf("creating a small file in the working directory: %.0f µs before the rounds, %.0f µs after (median of %d)\n", US(before), US(after), FileCreationFiles)
	if outputs && max(before, after) > slowFileCreation {
		s += fmt.Sprintf("WARNING: file creation is slow here, above %.0f µs: the output files' figures mostly measure the file system's\n"+
			"recent deletions (ext4 skips the inodes deleted in the last minutes one by one). Rerun some minutes after the last mass deletion.\n",
			US(slowFileCreation))
	}
	return s
}

// WithIQR formats the median of f with its interquartile range.
func WithIQR(f []float64) string {
	return fmt.Sprintf("%.2f (%.2f–%.2f)", MedianF(f), QuantileF(f, 0.25), QuantileF(f, 0.75))
}

// Verdict says whether a target was met.
func Verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// US is d in microseconds.
func US(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Median is the median of d (0 for none).
func Median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Percentile returns the smallest latency that at least q of them do not exceed.
func Percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

// Mean is the mean of d (0 for none).
func Mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

// QuantileF returns the q-quantile of f, interpolating between neighbours.
func QuantileF(f []float64, q float64) float64 {
	if len(f) == 0 {
		return 0
	}
	s := slices.Clone(f)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}

// MedianF is the median of f (0 for none).
func MedianF(f []float64) float64 {
	if len(f) == 0 {
		return 0
	}
	s := slices.Clone(f)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
