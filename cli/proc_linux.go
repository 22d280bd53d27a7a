package cli

import (
	"os"
	"syscall"
	"unsafe"
)

// setDeathSignal has the kernel SIGKILL the command when the thread that
// started it ends, which for a Go program (no locked OS threads) is when
// the process dies, SIGKILL included.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
}
