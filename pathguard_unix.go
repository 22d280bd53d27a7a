//go:build unix

package runstate

import "syscall"

// oNonblock opens a FIFO without waiting for a writer (openRegular).
const oNonblock = syscall.O_NONBLOCK
