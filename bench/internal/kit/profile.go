package kit

import (
	"os"
	"runtime/pprof"
)

// StartCPUProfile starts writing this process's CPU profile to the file
// path (created or truncated); stop ends the profile and closes the file.
// The bench programs' -cpuprofile. Not safe for concurrent use (one
// profile a process).
func StartCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
