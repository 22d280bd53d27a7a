//go:build unix

package runstate

import (
	"io/fs"
	"syscall"
)

// oNonblock opens a FIFO without waiting for a writer (openRegular).
const oNonblock = syscall.O_NONBLOCK

// oNoFollow makes an open of a symbolic link fail (a session's lock file:
// a link's target, a device, is never opened).
const oNoFollow = syscall.O_NOFOLLOW

// linkCount is the number of hard links to the file fi describes (1 when
// the system does not say).
func linkCount(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 1
}

// fileKeyOf is the identity of the file fi describes (ok false when the
// system does not say).
func fileKeyOf(fi fs.FileInfo) (k fileKey, ok bool) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fileKey{uint64(st.Dev), uint64(st.Ino)}, true
	}
	return k, false
}
