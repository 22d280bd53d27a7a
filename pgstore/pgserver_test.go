package pgstore

// Servers and DSNs for the fault tests: the shared test server
// (RUNSTATE_PG_DSN), a fresh schema per test, and servers of a test's own
// (RUNSTATE_PG_BIN) for tests that crash or re-address the server.

import (
	"testing"
	"time"

	"github.com/runstate/runstate/pgstore/internal/pgtest"
)

// needEnv, pgServer, startServerWith and freePort are pgtest's (shared
// with the command's tests).
var (
	needEnv         = pgtest.Need
	startServerWith = pgtest.Start
	freePort        = pgtest.FreePort
)

type pgServer = pgtest.Server

// startServer starts a server of the test's own listening on 127.0.0.1
// and on the extra addresses, trusting the extra networks (pgtest.Start).
func startServer(t testing.TB, extraListen, extraNets []string) *pgServer {
	t.Helper()
	return startServerWith(t, extraListen, extraNets, nil)
}

// holdWAL are the settings of a server that keeps a lazy commit's WAL
// (synchronous_commit off) in its shared buffers: the WAL writer wakes
// every 10 s at most (the most wal_writer_delay allows), and nothing else
// writes WAL out early (no background writer, no autovacuum, no timed
// checkpoint), so that a crash right after a lazy commit loses it; a crash
// ends the server instead of restarting it (restart_after_crash off), so
// that a test may kill a process of it. A WAL writer that hibernates is
// woken by every lazy commit all the same: the tests that need the WAL held
// stop it too (stopWALWriter).
var holdWAL = []string{"wal_writer_delay=10000ms", "bgwriter_lru_maxpages=0", "autovacuum=off", "checkpoint_timeout=1h", "restart_after_crash=off"}

// poll calls ok every step until it returns true or d has passed, and
// returns how long that took and whether ok said true.
func poll(d, step time.Duration, ok func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if ok() {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(step)
	}
}

// waitFor polls ok every 10 ms for up to d, and fails the test naming
// what it waited for.
func waitFor(t *testing.T, d time.Duration, ok func() bool, what string) {
	t.Helper()
	if _, done := poll(d, 10*time.Millisecond, ok); !done {
		t.Fatalf("no %s within %v", what, d)
	}
}
