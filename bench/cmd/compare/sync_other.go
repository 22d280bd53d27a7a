//go:build !linux

package main

import (
	"os"
	"path/filepath"
)

// fdatasync falls back to fsync where the platform has no fdatasync.
func fdatasync(f *os.File) error { return f.Sync() }

// writeOutput writes an output file: a temp file in tmp, written, closed
// and renamed into out.
func writeOutput(tmp, out *os.File, tmpName, outName string, data []byte) error {
	t := filepath.Join(tmp.Name(), tmpName)
	if err := os.WriteFile(t, data, 0o644); err != nil {
		return err
	}
	return os.Rename(t, filepath.Join(out.Name(), outName))
}
