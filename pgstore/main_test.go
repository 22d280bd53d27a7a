package pgstore

import (
	"os"
	"testing"

	"github.com/runstate/runstate/runstatetest"
)

// TestMain runs a fault test's child process (procs_test.go) when the
// environment names a role, else the tests, with runstatetest's check
// that no goroutine outlives them.
func TestMain(m *testing.M) {
	if name := os.Getenv(envRole); name != "" {
		os.Exit(runRole(name))
	}
	runstatetest.Main(m)
}
