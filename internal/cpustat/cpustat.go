// Package cpustat measures CPU time for the benchmarks and the
// performance reports: this process's, and that of the PostgreSQL server
// when it runs on this machine. The library does not import it.
package cpustat

import (
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of the times in /proc/PID/stat: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// statCPU reads one /proc/PID/stat line: the process's command name (at
// most 15 bytes, in parentheses; it may hold spaces and parentheses) and
// the CPU time it used, user and system (fields 14 and 15 of proc(5)).
// ok is false for a line it cannot read.
func statCPU(line string) (comm string, cpu time.Duration, ok bool) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	// After the name: the state (field 3), then fields 4-13, then utime
	// and stime.
	f := strings.Fields(line[end+1:])
	if len(f) < 13 {
		return "", 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || utime < 0 || stime < 0 {
		return "", 0, false
	}
	return line[open+1 : end], time.Duration(utime+stime) * time.Second / clockTicks, true
}
