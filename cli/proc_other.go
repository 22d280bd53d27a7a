//go:build !unix

package cli

import (
	"os"
	"os/exec"
)

// oNonblock: opening a file does not block here (readHandoff, tryRLock).
const oNonblock = 0

// oNoFollow: no such flag here.
const oNoFollow = 0

// forwardSignals are the signals runProc passes on to the command. On
// Windows the console delivers Ctrl-C to every process attached to it, the
// command included, so there is nothing to pass on.
var forwardSignals = []os.Signal{os.Interrupt}

// survivePipe does nothing: this system raises no signal for a closed
// pipe; a write to one returns an error.
func survivePipe() (stop func()) { return func() {} }

// setProcGroup does nothing on this system: the command shares the
// console's process group.
func setProcGroup(*exec.Cmd) bool { return false }

// signalGroup passes s on: an interrupt already reached the command (see
// forwardSignals); anything else kills it.
func signalGroup(cmd *exec.Cmd, _ bool, s os.Signal) {
	if s != os.Interrupt {
		_ = cmd.Process.Kill()
	}
}

// killGroup does nothing: the command has exited, and the processes it
// started are not known.
func killGroup(*exec.Cmd, bool) {}

// exitStatus is the command's exit status.
func exitStatus(ps *os.ProcessState) (int, os.Signal) { return ps.ExitCode(), nil }
