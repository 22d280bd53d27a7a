package runstate

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
)

// WorkDirFile is where a store that keeps a run elsewhere (pgstore) names
// the run in each of its working directories: a JSON object whose
// "address" is the run's address, without a password. The file store's
// Open refuses such a directory (ErrMismatch), and the runstate command
// follows the address.
const WorkDirFile = "logs/run.json"

// maxWorkDirFile caps what RunElsewhere reads of WorkDirFile: an address
// is short, and a longer file is no JSON object it reads.
const maxWorkDirFile = 64 << 10

// RunElsewhere returns the address that dir's WorkDirFile names, and
// false when dir has none or it names no address (a WorkDirFile that is
// not a regular file, or is longer than 64 KiB, names none: Open refuses
// the first). It reads that one file and writes nothing; it is safe for
// concurrent use.
func RunElsewhere(dir string) (address string, ok bool) {
	f, err := openRegular(func(flag int) (*os.File, error) {
		return os.OpenFile(filepath.Join(dir, filepath.FromSlash(WorkDirFile)), flag, 0)
	})
	if err != nil {
		return "", false // a FIFO or a device too: Open's guard names it
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxWorkDirFile))
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
