package runstate

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// WorkDirFile is where a store that keeps a run elsewhere (pgstore) names
// the run in each of its working directories: a JSON object whose
// "address" is the run's address, without a password. The file store's
// Open refuses such a directory (ErrMismatch), and the runstate command
// follows the address.
const WorkDirFile = "logs/run.json"

// RunElsewhere returns the address that dir's WorkDirFile names, and
// false when dir has none or it names no address. It reads that one
// file and writes nothing; it is safe for concurrent use.
func RunElsewhere(dir string) (address string, ok bool) {
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(WorkDirFile)))
	if err != nil {
		return "", false
	}
	var rj struct {
		Address string `json:"address"`
	}
	if json.Unmarshal(data, &rj) != nil || rj.Address == "" {
		return "", false
	}
	return rj.Address, true
}

// WorkDirViewer is a Store that keeps, besides the run's records elsewhere,
// a view of the run in each session's local working directory, as a run
// directory has its projections (pgstore: logs/next-steps.txt and
// manifest.json, what the session's batches publish, and WorkDirFile).
// OpenStore calls ViewWorkDir once, when the session's open record is
// committed and before OpenStore returns, with its local directory (which
// exists then) and the run's id (Run.ID); from then on the store writes
// the projections that Batch.Publish gives it there too, beginning with
// the newest it was given before the call. A view is never read back, so
// what ViewWorkDir writes needs no fsync. An error fails OpenStore, which
// closes the Run (cleanly) first. It may run while a timer's batch
// publishes: the store makes the two safe together.
type WorkDirViewer interface {
	ViewWorkDir(dir, runID string) error
}
