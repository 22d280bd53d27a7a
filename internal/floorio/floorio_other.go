//go:build !linux

// Package floorio is the I/O of the baselines that runstate's performance
// is measured against (internal/perfreport and bench/cmd/compare): an
// fdatasync, and an output file written the way runstate's
// Stage.WriteFile writes one. Both programs use it, so that their floors
// do the same work.
package floorio

import (
	"os"
	"path/filepath"
)

// Fdatasync is fsync where the system has no fdatasync.
func Fdatasync(f *os.File) error { return f.Sync() }

// WriteOutput writes data to outName in the directory out through a temp
// file tmpName in the directory tmp: written, closed and renamed. Nothing
// is synced.
func WriteOutput(tmp, out *os.File, tmpName, outName string, data []byte) error {
	t := filepath.Join(tmp.Name(), tmpName)
	if err := os.WriteFile(t, data, 0o644); err != nil {
		return err
	}
	return os.Rename(t, filepath.Join(out.Name(), outName))
}
