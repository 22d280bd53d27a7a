//go:build !unix

package pgstore

import "testing"

// stopWALWriter cannot stop a process here (no SIGSTOP): the tests that
// call it rely on holdWAL's settings alone, and check their premise (that
// a lazy commit's WAL is not on disk yet) where they need it.
func stopWALWriter(t testing.TB, db *DB) int { return 0 }
