//go:build !linux

package pgstore

import "time"

// cpuTimes is measured on Linux only (cpu_linux_internal_test.go).
func cpuTimes() (server, client time.Duration, ok bool) { return 0, 0, false }
