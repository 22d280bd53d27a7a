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
