package storetest_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/runstate/runstate"
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
