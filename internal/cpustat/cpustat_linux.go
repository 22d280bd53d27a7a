package cpustat

import (
	"os"
	"path/filepath"
	"time"
)

// Postgres returns the CPU time used so far by the processes named
// postgres on this machine: the server's, when the server runs here. A
// process that ended took its time with it, so the difference of two
// calls counts only the processes alive at both (a benchmark's
// connections stay open between them). ok is false when no such process
// was found (the server runs elsewhere, or /proc is not readable).
func Postgres() (cpu time.Duration, ok bool) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // ended meanwhile
		}
		if comm, d, good := statCPU(string(b)); good && comm == "postgres" {
			cpu += d
			ok = true
		}
	}
	return cpu, ok
}
