package runstatetest

import (
	"testing"
	"time"

	"github.com/runstate/runstate/internal/leakcheck"
)

// CheckLeaks makes t fail if a goroutine started after this call is still
// running when the test ends (it waits up to five seconds for them to wind
// down). Call it first in the test, so that its check runs after the
// test's other cleanups. A small stand-in for goleak.VerifyNone. It looks
// at every goroutine of the process: one that a test running in parallel
// started meanwhile counts too (the parallel tests themselves do not), so
// call it in tests that do not run in parallel with others.
func CheckLeaks(t testing.TB) {
	t.Helper()
	before := leakcheck.Snapshot()
	t.Cleanup(func() {
		if err := leakcheck.Find(before, 5*time.Second); err != nil {
			t.Errorf("runstatetest: goroutines leaked by %s: %v", t.Name(), err)
		}
	})
}
