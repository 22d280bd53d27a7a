package unnamed

import (
	"errors"
	"strconv"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// The ways to give an unnamed file its name, in the order Write tries
// them.
const (
	// EmptyPath: linkat of the descriptor itself (AT_EMPTY_PATH), which
	// Linux 6.10 and later allow to its opener, and earlier kernels to a
	// process with CAP_DAC_READ_SEARCH.
	EmptyPath = 1 + iota
	// Proc: linkat of /proc/self/fd/N (AT_SYMLINK_FOLLOW), which any
	// process may do where /proc is mounted.
	Proc
	// None: no O_TMPFILE in this kernel or file system, or neither way
	// links here; write through a temp file instead.
	None
)

// oTmpfile is O_TMPFILE: __O_TMPFILE, the same on every Linux port Go
// has, with O_DIRECTORY, which differs between them.
const oTmpfile = 0o20000000 | syscall.O_DIRECTORY

// linkat's flags.
const (
	atEmptyPath     = 0x1000
	atSymlinkFollow = 0x400
)

// Write writes data to name, which must not exist yet, in the directory
// dirFd: an unnamed file is made there with mode perm (less the umask),
// written, and linked in, trying the ways from how (EmptyPath or Proc) on.
// Nothing is synced. It returns the way that linked the file, or, on
// failure, the way to try next time: None when this kernel or file system
// cannot do it at all, how when the failure was this file's (EEXIST: name
// exists; a full disk). On failure nothing is left behind.
func Write(dirFd int, name string, data []byte, perm uint32, how int) (int, error) {
	fd, err := retry(func() (int, error) {
		return syscall.Openat(dirFd, ".", oTmpfile|syscall.O_WRONLY|syscall.O_CLOEXEC, perm)
	})
	if err != nil {
		switch err {
		case syscall.EOPNOTSUPP, syscall.EISDIR, syscall.EINVAL:
			// No O_TMPFILE here (a kernel before 3.11 takes it for
			// O_DIRECTORY and refuses to open a directory for writing).
			return None, err
		}
		return how, err
	}
	defer syscall.Close(fd)
	for b := data; len(b) > 0; {
		n, err := retry(func() (int, error) { return syscall.Write(fd, b) })
		if err != nil {
			return how, err
		}
		b = b[n:]
	}
	for ; how != None; how++ {
		switch err = link(fd, dirFd, name, how); err {
		case nil:
			return how, nil
		case syscall.ENOENT, syscall.EPERM, syscall.EACCES, syscall.EINVAL:
			// This way is refused here (AT_EMPTY_PATH without the right
			// gives ENOENT, and so does a missing /proc): try the next.
			continue
		}
		return how, err
	}
	return None, err
}

// link gives the unnamed file fd the name name in dirFd, the way how
// says; it fails with EEXIST when name exists.
func link(fd, dirFd int, name string, how int) error {
	from, flags := "", atEmptyPath
	if how == Proc {
		from, flags = "/proc/self/fd/"+strconv.Itoa(fd), atSymlinkFollow
	}
	fromp, err := syscall.BytePtrFromString(from)
	if err != nil {
		return err
	}
	namep, err := syscall.BytePtrFromString(name)
	if err != nil {
		return err
	}
	_, err = retry(func() (int, error) {
		_, _, e := syscall.Syscall6(syscall.SYS_LINKAT, uintptr(fd), uintptr(unsafe.Pointer(fromp)), uintptr(dirFd), uintptr(unsafe.Pointer(namep)), uintptr(flags), 0)
		if e != 0 {
			return 0, e
		}
		return 0, nil
	})
	return err
}

// retry calls fn until it does not fail with EINTR.
func retry(fn func() (int, error)) (int, error) {
	for {
		n, err := fn()
		if err != syscall.EINTR {
			return n, err
		}
	}
}

// ErrUnsupported: this kernel or file system cannot write unnamed files
// (Way.Write); write through a temp file instead.
var ErrUnsupported = errors.New("unnamed files are not supported here")

// Way is the way to link unnamed files learnt so far, for a session or a
// process: the zero Way tries EmptyPath first. Safe for concurrent use.
type Way struct{ how atomic.Int32 }

// Load returns the way learnt so far (0: none yet).
func (w *Way) Load() int { return int(w.how.Load()) }

// Store sets the way (for tests).
func (w *Way) Store(how int) { w.how.Store(int32(how)) }

// Write is the package's Write with the way learnt so far, which it
// updates. It fails with ErrUnsupported when the way is None (nothing is
// tried) or turns out to be.
func (w *Way) Write(dirFd int, name string, data []byte, perm uint32) error {
	known := w.Load()
	how := max(known, EmptyPath)
	if how == None {
		return ErrUnsupported
	}
	got, err := Write(dirFd, name, data, perm, how)
	if got != known {
		w.Store(got)
	}
	if err != nil && got == None {
		return ErrUnsupported
	}
	return err
}
