package main

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data (and the metadata needed to read it back, such
// as its size) to stable storage.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// writeOutput writes an output file with the fewest system calls: a temp
// file created relative to the open tmp directory, written, closed, and
// renamed into the open out directory (openat, write, close, renameat).
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
