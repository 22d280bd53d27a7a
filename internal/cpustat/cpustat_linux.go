package cpustat

import (
	"os"
	"time"
)

// Postgres returns the CPU time used so far by the processes named
// postgres on this machine: the server's, when the server runs here. A
// process that ended took its time with it, so the difference of two
// calls counts only the processes alive at both (a benchmark's
// connections stay open between them). ok is false when no such process
// was found (the server runs elsewhere, or /proc is not readable).
func Postgres() (cpu time.Duration, ok bool) {
	// Not filepath.Glob("/proc/[0-9]*/stat"): it lists every process's
	// directory to find its stat: 9 ms of CPU with 74 processes here, against
	// 2.6 ms this way.
	f, err := os.Open("/proc")
	if err != nil {
		return 0, false
	}
	names, _ := f.Readdirnames(-1)
	f.Close()
	for _, pid := range names {
		if pid == "" || pid[0] < '0' || pid[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + pid + "/stat")
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
