// Package testhook is the bridge between package runstate and its test
// helpers (package runstatetest, the fault-injecting file system): function
// variables that runstate sets in an init function, and the crash points
// that runstate crosses. It keeps test-only entry points out of runstate's
// public API.
//
// A crash point that nothing armed costs one atomic load.
package testhook

import (
	"errors"
	"io"
	"io/fs"
	"sync"
	"sync/atomic"
)

// Set by package runstate in an init function.
var (
	// Crash abandons a *runstate.Run as a killed process would: its locks
	// and files released, nothing more written, no close record. The
	// session's lock file is left behind, unlocked.
	Crash func(run any)

	// SetFS makes opts (a *runstate.Options) use fsys instead of the
	// operating system's file system.
	SetFS func(opts any, fsys FS)
)

// Point is a place in package runstate where a test can end a session
// abruptly.
type Point int32

// The crash points.
const (
	// AfterBegin: a stage's begin record is appended; the stage's work has
	// not started. Name is the stage.
	AfterBegin Point = iota + 1
	// AfterComplete: a complete record is appended (and fsync'd), the
	// projections are not written yet. Name is the stage.
	AfterComplete
	// BetweenProjections: logs/next-steps.txt reflects the batch just
	// appended, manifest.json does not. Name is the stage or effect key of
	// the batch's last record, if any.
	BetweenProjections
	// AfterIntent: an effect's intent record is durable; Do has not been
	// called. Name is the effect key (without the run id).
	AfterIntent
	// AfterDo: an effect's Do returned; its confirm record is not
	// appended yet. Name is the effect key.
	AfterDo

	NumPoints = AfterDo + 1
)

var pointNames = [NumPoints]string{"", "after-begin", "after-complete", "between-projections", "after-intent", "after-do"}

func (p Point) String() string {
	if p > 0 && p < NumPoints {
		return pointNames[p]
	}
	return "unknown-point"
}

// ParsePoint is the inverse of Point.String.
func ParsePoint(s string) (Point, bool) {
	for p := Point(1); p < NumPoints; p++ {
		if pointNames[p] == s {
			return p, true
		}
	}
	return 0, false
}

// Trigger is an armed crash point.
type Trigger struct {
	Run   any    // the *runstate.Run it applies to; nil: every run in the process
	Point Point  // where
	Name  string // the stage or effect key it applies to; "": any
	Skip  int    // crossings to let pass before it fires

	// Fire is called at the crossing that fires the trigger, with the
	// run that crossed; the trigger is removed first. A non-nil error
	// ends the call that crossed: the caller returns it (after Fire
	// crashed the run). A trigger without Fire only counts.
	Fire func(run any, p Point, name string) error

	// Count, if not nil, counts every matching crossing while the
	// trigger is armed, including the one that fires it.
	Count *atomic.Int64
}

var (
	armed    atomic.Int32 // triggers armed; zero makes Hit one atomic load
	mu       sync.Mutex
	triggers []*Trigger
)

// Arm adds t. A trigger with Fire set fires once and is removed; disarm
// removes it before that (or a counting trigger). t must not change while
// it is armed.
func Arm(t *Trigger) (disarm func()) {
	mu.Lock()
	triggers = append(triggers, t)
	armed.Add(1)
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			remove(t)
			mu.Unlock()
		})
	}
}

// remove takes t out of the table. The caller holds mu.
func remove(t *Trigger) {
	for i, x := range triggers {
		if x == t {
			triggers = append(triggers[:i:i], triggers[i+1:]...)
			armed.Add(-1)
			return
		}
	}
}

// Armed reports whether any trigger is armed: one atomic load.
func Armed() bool { return armed.Load() != 0 }

// Hit is called by package runstate at crash point p, with the run that
// crosses it and the stage or effect key concerned. It returns nil unless
// an armed trigger fired and ended the call.
func Hit(run any, p Point, name string) error {
	if armed.Load() == 0 {
		return nil
	}
	return hit(run, p, name)
}

func hit(run any, p Point, name string) error {
	var fire *Trigger
	mu.Lock()
	for _, t := range triggers {
		if t.Point != p || (t.Run != nil && t.Run != run) || (t.Name != "" && t.Name != name) {
			continue
		}
		if t.Count != nil {
			t.Count.Add(1)
		}
		if t.Fire == nil || fire != nil {
			continue
		}
		if t.Skip > 0 {
			t.Skip--
			continue
		}
		fire = t
	}
	if fire != nil {
		remove(fire)
	}
	mu.Unlock()
	if fire == nil {
		return nil
	}
	return fire.Fire(run, p, name)
}

// FS is the file system seam of package runstate, with exported types so
// that a package outside runstate can implement it.
type FS interface {
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	Rename(oldpath, newpath string) error
	Remove(name string) error
	MkdirAll(path string, perm fs.FileMode) error
	Stat(name string) (fs.FileInfo, error)
	ReadDir(name string) ([]fs.DirEntry, error)
	SyncDir(dir string) error
}

// File is the part of *os.File that runstate uses.
type File interface {
	io.Reader
	io.ReaderAt
	io.Writer
	io.WriterAt
	io.Seeker
	io.Closer
	Sync() error
	Truncate(size int64) error
	Stat() (fs.FileInfo, error)
}

// ErrCrashed is returned by a call that crossed a crash point armed to
// crash its run in process.
var ErrCrashed = errors.New("runstatetest: the session crashed at a crash point (simulated)")
