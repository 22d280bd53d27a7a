//go:build unix

package pgstore

import (
	"context"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// stopWALWriter stops db's server's WAL writer (SIGSTOP) for the rest of
// the test, so that a lazy commit's WAL stays in the server's shared
// buffers until a synchronous commit writes it out or the server dies.
// holdWAL's settings alone do not hold it back: a WAL writer that woke 50
// times in a row with nothing to write hibernates, and from then on every
// lazy commit wakes it (PostgreSQL's XLogSetAsyncXactLSN) and it writes
// that commit's WAL at once. How many idle wake-ups a test's setup gives it
// depends on timing: TestServerCrashLosingALazyBeginStopsItsSession failed
// 2 runs in 60 beside a busy machine, and strace showed the WAL writer
// writing the lazy begin's page 0.35 ms after its commit. It returns the
// WAL writer's pid, for crashNow to kill; at the test's end it is
// continued (SIGCONT: nothing happens if it is gone).
func stopWALWriter(t testing.TB, db *DB) int {
	t.Helper()
	var pid int
	require.NoError(t, db.pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&pid), "the server's WAL writer")
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP), "stop the WAL writer (pid %d)", pid)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	return pid
}
