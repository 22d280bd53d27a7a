package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os/signal"
	"time"

	"github.com/runstate/runstate"
)

// waitFlag registers -wait, of exec and effect.
func waitFlag(fs *flag.FlagSet, what string) *time.Duration {
	return fs.Duration("wait", 0, "`D`: while "+what+", wait and try again, for at most D (0: exit at once); SIGINT or SIGTERM ends the wait")
}

// Waits between tries: the first, the growth, the longest.
const (
	firstPause = 100 * time.Millisecond
	maxPause   = time.Second
)

// retry calls try until it returns an error that again does not accept,
// or nil, or until wait has passed (wait 0: once). Each try is a call
// that decides under the run's lock, on what every session recorded
// (Begin, Effect): nothing needs to be read between tries. It says on
// standard error, under name, what it waits for, each time that changes,
// and how long it waited when it gives up. SIGINT or SIGTERM ends the
// wait: the last error is returned.
func (c *cli) retry(name string, wait time.Duration, again func(error) bool, try func() error) error {
	err := try()
	if wait <= 0 || err == nil || !again(err) {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), forwardSignals...)
	defer stop()
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
			return fmt.Errorf("%w (waited %s)", err, time.Since(start).Round(time.Millisecond))
		}
		t := time.NewTimer(min(pause, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (the wait was ended by a signal after %s)", err, time.Since(start).Round(time.Millisecond))
		case <-t.C:
		}
		pause = min(pause*3/2, maxPause)
		if err = try(); err == nil || !again(err) {
			return err
		}
	}
}

// notYet reports whether err is one that a wait may see end: a live
// session runs the stage or the effect (ErrBusy), or an After stage is
// not done (ErrNotReady).
func notYet(err error) bool {
	return errors.Is(err, runstate.ErrBusy) || errors.Is(err, runstate.ErrNotReady)
}
