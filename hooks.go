package runstate

import (
	"github.com/runstate/runstate/internal/testhook"
)

// The bridge to package runstatetest and the fault-injecting file system:
// test-only entry points live in internal/testhook, not in this package's
// API.
func init() {
	testhook.Crash = func(run any) { run.(*Run).crash() }
	testhook.SetFS = func(opts any, fsys testhook.FS) {
		opts.(*Options).fs = fsys
	}
}

// The crash points, named for the core files that cross them.
const (
	hookAfterBegin         = testhook.AfterBegin
	hookAfterComplete      = testhook.AfterComplete
	hookBetweenProjections = testhook.BetweenProjections
	hookAfterIntent        = testhook.AfterIntent
	hookAfterDo            = testhook.AfterDo
)

// hit crosses crash point p. Unless a test armed one, that is one atomic
// load (inlined) and a nil error.
func (r *Run) hit(p testhook.Point, name string) error {
	if !testhook.Armed() {
		return nil
	}
	return r.hitArmed(p, name)
}

// hitArmed is the slow path of hit, kept out of line so that hit inlines.
//
//go:noinline
func (r *Run) hitArmed(p testhook.Point, name string) error {
	return testhook.Hit(r, p, name)
}

// hitBatch crosses the crash points of an append batch that just landed:
// after a complete record (before the projections) or between the
// projections. Disarmed, it is one atomic load (inlined).
func (r *Run) hitBatch(p testhook.Point, batch []*tx) error {
	if !testhook.Armed() {
		return nil
	}
	return r.hitBatchArmed(p, batch)
}

func (r *Run) hitBatchArmed(p testhook.Point, batch []*tx) error {
	if p == hookAfterComplete {
		stage, ok := completes(batch)
		if !ok {
			return nil
		}
		return testhook.Hit(r, p, stage)
	}
	return testhook.Hit(r, p, batchName(batch))
}

// batchName is the stage or effect key of a batch's last record, for the
// crash point between the projections.
func batchName(batch []*tx) string {
	for i := len(batch) - 1; i >= 0; i-- {
		if batch[i].err != nil {
			continue
		}
		for j := len(batch[i].recs) - 1; j >= 0; j-- {
			if rec := batch[i].recs[j]; rec.Stage != "" {
				return rec.Stage
			} else if rec.Key != "" {
				return rec.Key
			}
		}
	}
	return ""
}

// completes reports the stage of a complete record in the batch, if any.
func completes(batch []*tx) (string, bool) {
	for _, t := range batch {
		if t.err != nil {
			continue
		}
		for _, rec := range t.recs {
			if rec.Ev == evComplete {
				return rec.Stage, true
			}
		}
	}
	return "", false
}
