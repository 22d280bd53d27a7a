// Package floorio is the I/O of the baselines that runstate's performance
// is measured against (internal/perfreport and bench/cmd/compare): an
// fdatasync, and an output file written the way runstate's
// Stage.WriteFile writes one, with the fewest system calls. Both programs
// use it, so that their floors do the same work.
package floorio

import (
	"os"
	"syscall"
)

// Fdatasync flushes f's data (and the metadata needed to read it back,
// such as its size) to stable storage.
func Fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// WriteOutput writes data to outName in the directory out through a temp
// file tmpName in the directory tmp: created relative to tmp, written,
// closed and renamed into out (openat, write, close, renameat), as
// runstate's WriteFile does on Linux. Nothing is synced.
func WriteOutput(tmp, out *os.File, tmpName, outName string, data []byte) error {
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
