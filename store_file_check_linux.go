package runstate

import (
	"encoding/binary"
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

// sysStatx is statx(2)'s number where this package knows it (the syscall
// package does not have it for most architectures); 0 elsewhere, where
// fileID falls back to Stat and os.SameFile.
var sysStatx = map[string]uintptr{
	"amd64": 332, "arm64": 291, "riscv64": 291, "loong64": 291,
	"386": 383, "arm": 397, "ppc64": 383, "ppc64le": 383, "s390x": 379,
}[runtime.GOARCH]

const (
	atFDCWD           = -100
	atSymlinkNofollow = 0x100
	atEmptyPath       = 0x1000
	statxIno          = 0x100
)

// statx fills the device and inode of path (relative to fd; with an empty
// path, of fd itself), asking for nothing else.
func statx(fd int, path string, flags int) (dev, ino uint64, err error) {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return 0, 0, err
	}
	var buf [256]byte
	for {
		_, _, e := syscall.Syscall6(sysStatx, uintptr(fd), uintptr(unsafe.Pointer(p)), uintptr(flags),
			statxIno, uintptr(unsafe.Pointer(&buf[0])), 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, 0, &os.PathError{Op: "statx", Path: path, Err: e}
		}
		break
	}
	le := binary.NativeEndian
	ino = le.Uint64(buf[32:])
	dev = uint64(le.Uint32(buf[136:]))<<32 | uint64(le.Uint32(buf[140:]))
	return dev, ino, nil
}

// idOf returns the identity of f, an open file.
func idOf(f file) (fileID, error) {
	of, ok := f.(osFile)
	if !ok || sysStatx == 0 {
		return statFileID(f)
	}
	conn, err := of.SyscallConn()
	if err != nil {
		return fileID{}, err
	}
	var id fileID
	cerr := conn.Control(func(fd uintptr) {
		id.dev, id.ino, err = statx(int(fd), "", atEmptyPath)
	})
	if cerr != nil {
		return fileID{}, cerr
	}
	if err == nil && id.ino == 0 {
		return statFileID(f) // no inode numbers here
	}
	return id, err
}

// pathIs reports whether rel, in the run directory (a link is not
// followed), is the file id names. It looks rel up from the run
// directory's descriptor where the Run holds one (outputDirs): two path
// components instead of the whole absolute path, the same directory its
// outputs go to.
func (s *dirStore) pathIs(rel string, id fileID) (bool, error) {
	if id.fi != nil {
		return lstatIs(s.path(rel), id)
	}
	var dev, ino uint64
	var err error
	if d := s.dirFD; d != nil {
		if cerr := control(d, func(fd int) { dev, ino, err = statx(fd, rel, atSymlinkNofollow) }); cerr != nil {
			return false, cerr
		}
	} else {
		dev, ino, err = statx(atFDCWD, s.path(rel), atSymlinkNofollow)
	}
	if err != nil {
		return false, err
	}
	return dev == id.dev && ino == id.ino, nil
}
