package kit

import (
	"fmt"
	"math"
	"os"
	"slices"
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
