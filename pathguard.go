package runstate

import (
	"io/fs"
	"os"
)

// What runstate reads and writes may be: see openRegular.

// kindOf names what a file that is not a regular one is.
func kindOf(m fs.FileMode) string {
	switch t := m.Type(); {
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case t&fs.ModeCharDevice != 0, t&fs.ModeDevice != 0:
		return "a device"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "not a regular file"
}

// openRegular opens a file to hash it (an input, an output) with open,
// without blocking on a FIFO, and refuses one that is not a regular file
// (a FIFO, a device such as /dev/zero, a directory) with a *notRegular:
// hashing it would block or never end.
func openRegular(open func(flag int) (*os.File, error)) (*os.File, error) {
	f, err := open(os.O_RDONLY | oNonblock)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &notRegular{fi.Mode()}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// notRegular says that a file to hash is not a regular file. It wraps
// ErrInvalid.
type notRegular struct{ mode fs.FileMode }

func (e *notRegular) Error() string { return kindOf(e.mode) + ", not a regular file" }
func (e *notRegular) Unwrap() error { return ErrInvalid }
