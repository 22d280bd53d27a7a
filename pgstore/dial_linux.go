package pgstore

import (
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT (linux/tcp.h).
const tcpUserTimeout = 0x12

// userTimeoutControl sets TCP_USER_TIMEOUT on a new connection's socket,
// best effort (a Unix socket has none): data unacknowledged for
// userTimeout ends the connection.
func userTimeoutControl(_, _ string, c syscall.RawConn) error {
	return c.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(userTimeout/time.Millisecond))
	})
}
