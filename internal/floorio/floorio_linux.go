// Package floorio is the I/O of the baselines that runstate's performance
// is measured against (internal/perfreport and bench/cmd/compare): an
// fdatasync, and an output file written the way runstate's
// Stage.WriteFile writes one, with the fewest system calls. Both programs
// use it, so that their floors do the same work.
package floorio

import (
	"errors"
	"os"
	"syscall"

	"github.com/runstate/runstate/internal/unnamed"
)

// Fdatasync flushes f's data (and the metadata needed to read it back,
// such as its size) to stable storage.
func Fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// WriteOutput writes data to outName in the directory out as runstate's
// WriteFile writes a new output on Linux: an unnamed file made in out,
// written, and linked in (package internal/unnamed). Where this kernel
// or file system cannot, it goes through a temp file tmpName in the
// directory tmp: created relative to tmp, written, closed and renamed into
// out (openat, write, close, renameat), as WriteFile then does. Nothing is
// synced. Safe for concurrent use.
func WriteOutput(tmp, out *os.File, tmpName, outName string, data []byte) error {
	if err := way.Write(int(out.Fd()), outName, data, 0o644); !errors.Is(err, unnamed.ErrUnsupported) {
		return err
	}
	fd, err := syscall.Openat(int(tmp.Fd()), tmpName, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	_, err = syscall.Write(fd, data)
	if cerr := syscall.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return syscall.Renameat(int(tmp.Fd()), tmpName, int(out.Fd()), outName)
}

// way is how WriteOutput links an unnamed file here.
var way unnamed.Way
