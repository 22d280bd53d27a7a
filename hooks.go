package runstate

import (
	"errors"
	"io/fs"
	"os"

	"github.com/runstate/runstate/internal/testhook"
)

// The bridge to package runstatetest and the fault-injecting file system:
// test-only entry points live in internal/testhook, not in this package's
// API.
func init() {
	testhook.Crash = func(run any) { run.(*Run).crash() }
	testhook.SetFS = func(opts any, fsys testhook.FS) {
		o := opts.(*Options)
		if fsys == nil {
			o.fs = nil
			return
		}
		o.fs = hookFS{fsys}
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

// hookFS adapts a testhook.FS to the fileSystem seam.
type hookFS struct{ fs testhook.FS }

func (h hookFS) OpenFile(name string, flag int, perm fs.FileMode) (file, error) {
	f, err := h.fs.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}
func (h hookFS) Rename(oldpath, newpath string) error         { return h.fs.Rename(oldpath, newpath) }
func (h hookFS) Remove(name string) error                     { return h.fs.Remove(name) }
func (h hookFS) MkdirAll(path string, perm fs.FileMode) error { return h.fs.MkdirAll(path, perm) }
func (h hookFS) Stat(name string) (fs.FileInfo, error)        { return h.fs.Stat(name) }
func (h hookFS) ReadDir(name string) ([]fs.DirEntry, error)   { return h.fs.ReadDir(name) }
func (h hookFS) SyncDir(dir string) error                     { return h.fs.SyncDir(dir) }

// Link makes hard links when the file system under test can.
func (h hookFS) Link(oldname, newname string) error {
	if l, ok := h.fs.(linker); ok {
		return l.Link(oldname, newname)
	}
	return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: errors.ErrUnsupported}
}
