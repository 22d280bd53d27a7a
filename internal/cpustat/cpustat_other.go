//go:build !linux

package cpustat

import "time"

// Postgres is measured on Linux only (cpustat_linux.go).
func Postgres() (cpu time.Duration, ok bool) { return 0, false }
