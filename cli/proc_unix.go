//go:build unix

package cli

import (
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// oNonblock opens a FIFO without waiting for a writer (readHandoff,
// tryRLock).
const oNonblock = syscall.O_NONBLOCK

// oNoFollow makes an open of a symbolic link fail (tryRLock).
const oNoFollow = syscall.O_NOFOLLOW

// forwardSignals are the signals runProc passes on to the command.
var forwardSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// survivePipe catches SIGPIPE until stop is called, so that a write to a
// standard output or error that is a closed pipe (runstate exec ... | head
// -1) returns EPIPE instead of killing this process: exec, await and effect
// then still record how the stage or effect ended, and close the session.
// Commands they start get the default disposition back on exec. Safe for
// concurrent use; the signal stays caught while any caller holds it.
func survivePipe() (stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGPIPE)
	return func() { signal.Stop(c) }
}

// setProcGroup puts the command in a process group of its own, led by it,
// and, on Linux, has the kernel kill it when this process dies. It reports
// whether it did: when standard input is a terminal the command stays in
// this process's group, the terminal's foreground group, so that it may
// read the terminal (a background group would be stopped by SIGTTIN) and
// gets Ctrl-C from it directly.
func setProcGroup(cmd *exec.Cmd) bool {
	own := !isTerminal(os.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: own}
	setDeathSignal(cmd.SysProcAttr)
	return own
}

// signalGroup passes s on to the command's process group; when the command
// shares this process's group, to the command alone, and not an interrupt,
// which the terminal sent to the whole group.
func signalGroup(cmd *exec.Cmd, own bool, s os.Signal) {
	sig, ok := s.(syscall.Signal)
	switch {
	case !ok:
	case own:
		_ = syscall.Kill(-cmd.Process.Pid, sig)
	case s != os.Interrupt:
		_ = cmd.Process.Signal(s)
	}
}

// killGroup ends what is left of the command's own process group: SIGTERM,
// then SIGKILL for what is still there after groupGrace.
func killGroup(cmd *exec.Cmd, own bool) {
	if !own {
		return
	}
	pg := -cmd.Process.Pid
	if syscall.Kill(pg, 0) != nil {
		return // nothing left: the usual case
	}
	_ = syscall.Kill(pg, syscall.SIGTERM)
	for end := time.Now().Add(groupGrace); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if syscall.Kill(pg, 0) != nil {
			return
		}
	}
	_ = syscall.Kill(pg, syscall.SIGKILL)
}

// exitStatus is the command's exit status, 128+N when signal N killed it.
func exitStatus(ps *os.ProcessState) (int, os.Signal) {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), ws.Signal()
	}
	return ps.ExitCode(), nil
}
