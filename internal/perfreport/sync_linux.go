//go:build linux

package main

import (
	"os"
	"syscall"
)

// fdatasync is the floor a checkpoint is measured against.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// writeOutput is the baseline's output file, done with the fewest system
// calls, as runstate's Stage.WriteFile does on Linux: a temp file created
// relative to the open tmp directory, written, closed, and renamed into
// the open out directory (openat, write, close, renameat).
func writeOutput(tmp, out *os.File, tmpName, outName string, data []byte) error {
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
