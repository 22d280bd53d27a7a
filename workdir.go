package runstate

import (
	"encoding/json"
	"errors"
	"fmt"
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

// maxWorkDirFile caps what ReadWorkDirFile reads of WorkDirFile: an
// address is short, and a longer file is none that a store wrote.
const maxWorkDirFile = 64 << 10

// ReadWorkDirFile returns the bytes of dir's WorkDirFile: nil when dir has
// none, or when it is longer than 64 KiB (no file a store writes there:
// the store may replace it). It refuses a WorkDirFile that is not a
// regular file (a FIFO is opened without blocking, never read) with an
// error that names it and wraps ErrInvalid, as Open refuses one; other
// errors are the file system's, naming the file. It writes nothing and is
// safe for concurrent use.
func ReadWorkDirFile(dir string) ([]byte, error) {
	p := filepath.Join(dir, filepath.FromSlash(WorkDirFile))
	f, _, err := openOwn(osFS{}, dir, WorkDirFile, os.O_RDONLY)
	if err != nil {
		if nr := (*notRegular)(nil); errors.As(err, &nr) {
			return nil, fmt.Errorf("%s is %w", p, err)
		}
		if isNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxWorkDirFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if len(data) > maxWorkDirFile {
		return nil, nil
	}
	return data, nil
}

// RunElsewhere returns the address that dir's WorkDirFile names, and
// false when dir has none or it names no address (a WorkDirFile that
// ReadWorkDirFile refuses or finds too long names none: Open refuses the
// first). It reads that one file and writes nothing; it is safe for
// concurrent use.
func RunElsewhere(dir string) (address string, ok bool) {
	data, err := ReadWorkDirFile(dir)
	if err != nil || data == nil {
		return "", false // a FIFO or a device too: Open's guard names it
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
	// ViewWorkDir starts the view of the run in dir, as WorkDirViewer
	// says: OpenStore calls it once, on its caller's goroutine.
	ViewWorkDir(dir, runID string) error
}

// WorkDirChecker is a Store that can refuse a local working directory
// (one that belongs to another run, say) before the session records
// anything: OpenStore calls CheckWorkDir once, after the store's Open
// has returned the run's records and before the session's open record
// (and a new run's create record), with the working directory and the
// run's id, or "" for a run that this session is about to create. An
// error fails OpenStore with nothing of the session recorded; the
// directory is as it was. pgstore's DB.Store is one.
type WorkDirChecker interface {
	// CheckWorkDir returns an error that says why dir cannot be the
	// session's working directory, or nil. dir may not exist yet (OpenStore
	// creates it after the check). It is called once, on OpenStore's
	// caller's goroutine, and must write nothing.
	CheckWorkDir(dir, runID string) error
}
