package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/runstate/runstate"
)

// waitFlag registers -wait, of exec and effect.
func waitFlag(fs *flag.FlagSet, what string) *time.Duration {
	return fs.Duration("wait", 0, "`D`: while "+what+", wait and try again, for at most D (0: exit at once); SIGINT or SIGTERM ends the wait (exit 128+N)")
}

// Waits between tries: the first, and the longest; each is half as long
// again as the one before (retry).
const (
	firstPause = 100 * time.Millisecond
	maxPause   = time.Second
)

// retry calls try until it returns an error that again does not accept,
// or nil, or until wait has passed (wait 0: once). Each try is a call
// that decides under the run's lock, on what every session recorded
// (Begin, Effect): nothing needs to be read between tries. It says on
// standard error, under name, what it waits for, each time that changes,
// and how long it waited when it gives up.
//
// A try runs as without -wait: a SIGINT or SIGTERM then does what it
// would have done (by default it ends the process; a command that exec or
// effect runs gets it passed on). Between tries they end the wait: retry
// returns the signal, with the last error, and the caller exits 128+N
// after closing the session.
func (c *cli) retry(name string, wait time.Duration, again func(error) bool, try func() error) (os.Signal, error) {
	err := try()
	if wait <= 0 || err == nil || !again(err) {
		return nil, err
	}
	start := time.Now()
	deadline := start.Add(wait)
	pause, said := firstPause, ""
	for {
		if msg := err.Error(); msg != said {
			c.notef("runstate %s: waiting (at most %s more): %v", name, time.Until(deadline).Round(time.Millisecond), err)
			said = msg
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("%w (waited %s)", err, time.Since(start).Round(time.Millisecond))
		}
		if sig := pauseFor(min(pause, left)); sig != nil {
			return sig, fmt.Errorf("%w (the wait was ended by %v after %s)", err, sig, time.Since(start).Round(time.Millisecond))
		}
		pause = min(pause*3/2, maxPause)
		if err = try(); err == nil || !again(err) {
			return nil, err
		}
	}
}

// pauseFor sleeps d, or until SIGINT or SIGTERM (Windows: Ctrl-C) comes,
// and returns that signal.
func pauseFor(d time.Duration) os.Signal {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, forwardSignals...)
	defer signal.Stop(sigc)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case sig := <-sigc:
		return sig
	case <-t.C:
	}
	// One that came with the timer, or before Stop returned: after Stop
	// none comes, and one delivered before it is in sigc, where a Stop
	// after this look would drop it.
	signal.Stop(sigc)
	select {
	case sig := <-sigc:
		return sig
	default:
		return nil
	}
}

// signalStatus is the exit status of a process ended by sig: 128+N.
func signalStatus(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 128 + int(syscall.SIGINT)
}

// notYet reports whether err is one that a wait may see end: a live
// session runs the stage or the effect (ErrBusy), or an After stage is
// not done (ErrNotReady).
func notYet(err error) bool {
	return errors.Is(err, runstate.ErrBusy) || errors.Is(err, runstate.ErrNotReady)
}
