package runstate

import (
	"os"
	"syscall"
)

// datasync is fdatasync(2): the data, and the size if it changed, but
// not the file's times. After an overwrite of allocated bytes it writes
// no metadata at all, which is what makes logs/ledger.wal cheap.
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}
