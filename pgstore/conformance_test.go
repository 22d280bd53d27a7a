package pgstore

import (
	"context"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/runstate/runstate/runstatetest/storetest"
)

// pgHarness opens every session of one run in a work dir of its own, as
// if each were on another machine.
type pgHarness struct {
	db  *DB
	run string
}

func (h pgHarness) Open(t testing.TB, opts *runstate.Options) (*runstate.Run, error) {
	return h.db.Open(context.Background(), h.run, t.TempDir(), opts)
}

func (h pgHarness) Crash(_ testing.TB, run *runstate.Run) { runstatetest.Crash(run) }

func (h pgHarness) Lines(t testing.TB) [][]byte { return storetest.ReadLines(t, h.db.Store(h.run)) }

func (h pgHarness) Store(testing.TB) runstate.Store { return h.db.Store(h.run) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) storetest.Harness {
		return pgHarness{db: newTestDB(t), run: "conformance"}
	})
}
