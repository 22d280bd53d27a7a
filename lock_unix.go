//go:build unix

package runstate

import (
	"os"
)

// syncDir fsyncs a directory so that a rename or create in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// rename is os.Rename: POSIX rename replaces the target atomically.
func rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }
