package cpustat

import (
	"testing"
	"time"
)

func TestStatCPUReadsTheNameAndTheTimes(t *testing.T) {
	cases := []struct {
		line string
		comm string
		cpu  time.Duration
		ok   bool
	}{
		// A backend: utime 1234, stime 56 ticks.
		{"4242 (postgres) S 21274 21274 21274 0 -1 4194624 1523 0 0 0 1234 56 0 0 20 0 1 0 1370611 224276480 2684 18446744073709551615\n", "postgres", 12900 * time.Millisecond, true},
		// A name with a space and a parenthesis: the last ')' ends it.
		{"7 (a b) c) R 1 1 1 0 -1 0 0 0 0 0 5 7 0 0 20 0 1 0 1 1 1 1\n", "a b) c", 120 * time.Millisecond, true},
		{"7 (short) R 1 1", "", 0, false},
		{"7 postgres R 1 1 1 0 -1 0 0 0 0 0 5 7", "", 0, false},
		{"7 (x) R 1 1 1 0 -1 0 0 0 0 0 five 7 0", "", 0, false},
		{"7 (x) R 1 1 1 0 -1 0 0 0 0 0 -5 7 0", "", 0, false},
	}
	for _, c := range cases {
		comm, cpu, ok := statCPU(c.line)
		if comm != c.comm || cpu != c.cpu || ok != c.ok {
			t.Errorf("statCPU(%q) = %q, %v, %v; want %q, %v, %v", c.line, comm, cpu, ok, c.comm, c.cpu, c.ok)
		}
	}
}
