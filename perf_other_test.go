//go:build !linux

package runstate_test

import "os"

// fdatasync is the floor a checkpoint is measured against; where the
// system has no fdatasync, fsync.
func fdatasync(f *os.File) error { return f.Sync() }
