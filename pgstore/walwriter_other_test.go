//go:build !unix

package pgstore

import "testing"

// stopWALWriter cannot stop a process here (no SIGSTOP): the tests that
// call it rely on holdWAL's settings alone, so a hibernating WAL writer
// may write a lazy commit's WAL early, and TestResolvedCommitIsFlushed
// checks that premise while TestSyncAfterAFailedFlushReturnsOnlyOnDisk
// may then pass without testing. CI runs them on Linux.
func stopWALWriter(t testing.TB, db *DB) int { return 0 }
