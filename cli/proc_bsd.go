//go:build unix && !linux

package cli

import (
	"os"
	"syscall"
)

// setDeathSignal does nothing: only Linux has a parent-death signal. A
// command whose runstate process is killed keeps running until it ends.
func setDeathSignal(*syscall.SysProcAttr) {}

// isTerminal reports whether f is a character device other than
// /dev/null: a terminal, most likely.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(fi, null)
}
