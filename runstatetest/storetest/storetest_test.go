package storetest_test

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/faultfs"
	"github.com/runstate/runstate/internal/testhook"
	"github.com/runstate/runstate/runstatetest"
	"github.com/runstate/runstate/runstatetest/storetest"
)

// dirHarness is the file store's harness: every session opens the same
// run directory, as processes on one machine do.
type dirHarness struct{ dir string }

func (h dirHarness) Open(_ testing.TB, opts *runstate.Options) (*runstate.Run, error) {
	return runstate.OpenStore(runstate.NewFileStore(h.dir, opts), h.dir, opts)
}

func (h dirHarness) Store(testing.TB) runstate.Store { return runstate.NewFileStore(h.dir, nil) }

func (h dirHarness) Crash(_ testing.TB, run *runstate.Run) { runstatetest.Crash(run) }

func (h dirHarness) Lines(t testing.TB) [][]byte {
	data, err := os.ReadFile(filepath.Join(h.dir, "logs", "ledger.jsonl"))
	if err != nil {
		t.Fatalf("read the ledger: %v", err)
	}
	var lines [][]byte
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break // a torn tail: never acknowledged
		}
		lines = append(lines, data[:i])
		data = data[i+1:]
	}
	return lines
}

// TestFileStoreConformance runs the conformance suite on the file store:
// a run directory that every session opens.
func TestFileStoreConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) storetest.Harness {
		return dirHarness{dir: t.TempDir()}
	})
}

// lossyDirHarness is the file store on a file system that can lose power
// (internal/faultfs): PowerLoss kills every session it opened, as the
// machine's end would, and rewrites the disk to what was made durable. Its
// Lines read through the file store, which passes the records a power
// loss left only in logs/ledger.wal in their place.
type lossyDirHarness struct {
	dirHarness
	fsys *faultfs.FS

	mu   sync.Mutex
	runs []*runstate.Run
}

func (h *lossyDirHarness) Open(_ testing.TB, opts *runstate.Options) (*runstate.Run, error) {
	o := *opts
	testhook.SetFS(&o, h.fsys)
	run, err := runstate.OpenStore(runstate.NewFileStore(h.dir, &o), h.dir, &o)
	if err == nil {
		h.mu.Lock()
		h.runs = append(h.runs, run)
		h.mu.Unlock()
	}
	return run, err
}

func (h *lossyDirHarness) Lines(t testing.TB) [][]byte {
	return storetest.ReadLines(t, runstate.NewFileStore(h.dir, nil))
}

func (h *lossyDirHarness) PowerLoss(t testing.TB) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, run := range h.runs {
		runstatetest.Crash(run)
	}
	if err := h.fsys.PowerLoss(nil); err != nil {
		t.Fatalf("power loss: %v", err)
	}
}

// TestFileStoreConformanceWithPowerLoss runs the suite on the file store
// over a file system that simulates a power loss, so that the PowerLoss
// subtest runs on it too.
func TestFileStoreConformanceWithPowerLoss(t *testing.T) {
	storetest.Run(t, func(t testing.TB) storetest.Harness {
		return &lossyDirHarness{dirHarness: dirHarness{dir: t.TempDir()}, fsys: faultfs.New()}
	})
}
