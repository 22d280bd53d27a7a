//go:build !linux

package runstate

import "os"

// datasync is f.Sync where the system has no fdatasync (on macOS it is
// F_FULLFSYNC, on Windows FlushFileBuffers).
func datasync(f *os.File) error { return f.Sync() }
