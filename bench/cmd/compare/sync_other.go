//go:build !linux

package main

import "os"

// fdatasync falls back to fsync where the platform has no fdatasync.
func fdatasync(f *os.File) error { return f.Sync() }
