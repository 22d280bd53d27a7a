package pgstore

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTimes returns the CPU time used so far by the processes named
// postgres on this machine (the server's, when the tests' server runs
// here; alive now: a backend that ended took its time with it) and by
// this process. ok is false when no postgres process was found.
func cpuTimes() (server, client time.Duration, ok bool) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || !strings.HasSuffix(s[:i], "(postgres") {
			continue
		}
		// After the name: state, then fields 4-13 of proc(5), then utime
		// and stime (14, 15), in clock ticks.
		f := strings.Fields(s[i+1:])
		if len(f) < 13 {
			continue
		}
		u, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		server += time.Duration(u+st) * time.Second / clockTicks
		ok = true
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return server, client, ok
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100
