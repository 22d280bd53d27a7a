//go:build !linux

package pgstore

import "syscall"

// userTimeoutControl does nothing where TCP_USER_TIMEOUT is not set this
// way: keepalives remain.
func userTimeoutControl(network, address string, c syscall.RawConn) error { return nil }
