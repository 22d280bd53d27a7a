package pgstore

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Pooled connections give up on a server that stops acknowledging within
// userTimeout (TCP_USER_TIMEOUT), not the kernel's default minutes.
func TestPoolConnectionsHaveTheUserTimeout(t *testing.T) {
	db := newTestDB(t)
	conn, err := db.pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	tc, ok := conn.Conn().PgConn().Conn().(*net.TCPConn)
	if !ok {
		t.Skip("RUNSTATE_PG_DSN is not a TCP address")
	}
	raw, err := tc.SyscallConn()
	require.NoError(t, err)
	var v int
	var gerr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout)
	}))
	require.NoError(t, gerr)
	assert.Equal(t, int(userTimeout/time.Millisecond), v)
}
