//go:build linux

package main

import (
	"os"
	"syscall"
)

// fdatasync is the floor a checkpoint is measured against.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
