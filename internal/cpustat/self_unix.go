//go:build unix

package cpustat

import (
	"syscall"
	"time"
)

// Self is the CPU time (user and system) this process used so far; 0
// where it cannot be read.
func Self() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
