//go:build unix

package pgstore

import "syscall"

// oNonblock opens a FIFO without waiting for a writer (checkWorkDir).
const oNonblock = syscall.O_NONBLOCK
