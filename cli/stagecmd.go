package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/escape"
)

var planCmd = &command{
	name:     "plan",
	dirOnly:  true,
	workDir:  true,
	synopsis: "DIR STAGE... [-request TEXT] [-at ADDRESS] [-timeout D]",
	short:    "record the stages a pipeline has, in order",
	long: `Plan records the work that exists in the run in DIR: the stages, in order,
that status, next and ls count as done and remaining. Planning the same
stages again records nothing; another list replaces the plan. The record is
durable when plan returns. DIR must hold a run, unless -request TEXT creates
it (a pipeline's first line: runstate plan DIR -request TEXT STAGE...).
DIR may be a working directory of a run kept elsewhere (-at: see
'runstate help exec').

Plan is safe to run while other sessions work on the run: it opens a
session of its own and appends under the ledger lock, as they do (waiting
at most -timeout for it). The plan recorded last, by plan or by a
session's own Run.Plan, is the run's plan. Standard output says what this
plan did: "planned N stage(s): ..." when it recorded the plan, "plan
unchanged: ...: planned already, nothing recorded" when the run had that
plan already (also when another plan, started at the same time, recorded
it first: of two identical plans at once, one says "planned").

Exit status: 0 the run has the plan (recorded now or already); 2 a usage
error (nothing recorded); 1 the plan could not be recorded; 125 the run
could not be opened or created (the ledger lock was not free within
-timeout, say).`,
	min: 2, max: -1,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		request := fs.String("request", "", "`TEXT`: the run's request; creates the run when DIR holds none")
		timeout := timeoutFlag(fs)
		return func(c *cli, args []string) int {
			for i, name := range args[1:] {
				if err := checkStageName(name); err != nil {
					return c.usageError("plan", err.Error())
				}
				if strings.HasPrefix(name, "-") && name != "-" {
					// Given after "--"; exec's and await's STAGE is
					// parsed with their flags, and no "--" there can
					// make it a name: the pipeline could never run it.
					return c.usageError("plan", fmt.Sprintf("stage %s starts with \"-\": exec and await would read it as a flag, so no pipeline could run it; choose another name", quoteArg(name)))
				}
				if slices.Contains(args[1:i+1], name) {
					return c.usageError("plan", fmt.Sprintf("stage %s is named twice; name each stage once", quoteArg(name)))
				}
			}
			var old []string
			return c.pipeline("plan", args[0], *request, *timeout, func(ctx context.Context, r *runstate.Run) error {
				old = statusOf(r).Plan
				return r.Plan(ctx, args[1:]...)
			}, func(_ *runstate.Status, wrote func(ev string) (bool, bool)) string {
				list := strings.Join(args[1:], ", ")
				if yes, known := wrote("plan"); yes || !known && !slices.Equal(old, args[1:]) {
					return fmt.Sprintf("planned %d stage(s): %s", len(args)-1, list)
				}
				// Planned already: before this session opened the run,
				// or by another process since (two pipelines started at
				// once).
				return "plan unchanged: " + list + ": planned already, nothing recorded"
			})
		}
	},
}

var skipCmd = &command{
	name:     "skip",
	dirOnly:  true,
	workDir:  true,
	synopsis: "DIR STAGE -reason TEXT [-at ADDRESS] [-timeout D]",
	short:    "record that a stage is not needed (it counts as done)",
	long: `Skip records that STAGE of the run in DIR is not needed, with the reason:
it counts as done, and exec skips it. A stage that is done already is left
as it is: nothing recorded, and standard output says "stage STAGE is
complete already" (or "skipped already": also when another skip of it,
started at the same time, recorded it first). The record is durable when
skip returns.

Skip is safe to run while other sessions work on the run: it opens a
session of its own and appends under the ledger lock, as they do (waiting
at most -timeout for it). A stage that a live session is running is not
skipped (exit 1, nothing recorded): let that attempt end first. DIR may
be a working directory of a run kept elsewhere (-at: see 'runstate help
exec').

Exit status: 0 the stage is skipped or done; 2 a usage error (nothing
recorded); 1 it could not be skipped (a live session runs it); 125 the
run could not be opened.`,
	min: 2, max: 2,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		reason := fs.String("reason", "", "`TEXT`: why the stage is not needed (required)")
		timeout := timeoutFlag(fs)
		return func(c *cli, args []string) int {
			if strings.TrimSpace(*reason) == "" {
				return c.usageError("skip", "-reason TEXT is required")
			}
			if err := checkStageName(args[1]); err != nil {
				return c.usageError("skip", err.Error())
			}
			return c.pipeline("skip", args[0], "", *timeout, func(ctx context.Context, r *runstate.Run) error {
				return r.Skip(ctx, args[1], *reason)
			}, func(st *runstate.Status, wrote func(ev string) (bool, bool)) string {
				s, _ := st.Stage(args[1])
				if yes, known := wrote("skip"); yes || !known && s.State == runstate.StateSkipped && s.Reason == *reason {
					return "skipped stage " + args[1]
				}
				// Done already: before this session opened the run, or
				// by another process since.
				return fmt.Sprintf("stage %s is %s already: nothing recorded", args[1], s.State)
			})
		}
	},
}

var awaitCmd = &command{
	name:     "await",
	dirOnly:  true,
	workDir:  true,
	synopsis: "DIR STAGE -reason TEXT [-in FILE] [-value NAME=V] [-after STAGE] [-out PATH] [-valid-for D] [-at ADDRESS] [-timeout D]",
	short:    "a stage that a person must approve: exit 0 once approved",
	long: `Await makes STAGE of the run in DIR a person's review: the first time, it
begins the stage with the evidence given (as exec's flags), records the -out
files as its outputs and records that it awaits a person with the reason
(what to review), durably, and exits 122. While it awaits, await exits 122
again. Once a person ran 'runstate approve DIR STAGE -by NAME', the stage is
complete, and await exits 0 (as long as its evidence holds: a changed input
or output asks for a review again). So a pipeline line

  runstate await DIR review -reason "read the diff" -after execute || exit

stops the pipeline until the review is done. DIR may be a working
directory of a run kept elsewhere (-at: see 'runstate help exec').

Exit status: 0 approved; 122 awaits a person; 121 another live session runs
the stage; 123 it failed fatally; 2 a usage error; 125 runstate could not
record it.`,
	min: 2, max: 2,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		reason := fs.String("reason", "", "`TEXT`: what the person is asked to review or decide (required)")
		var ev evidenceFlags
		ev.register(fs)
		timeout := timeoutFlag(fs)
		return func(c *cli, args []string) int {
			if strings.TrimSpace(*reason) == "" {
				return c.usageError("await", "-reason TEXT is required")
			}
			if err := checkStageName(args[1]); err != nil {
				return c.usageError("await", err.Error())
			}
			inputs, outs, err := ev.resolve(args[0], args[1])
			if err != nil {
				return c.usageError("await", err.Error())
			}
			return c.await(args[0], args[1], *reason, inputs, outs, *timeout)
		}
	},
}

func (c *cli) await(dir, stage, reason string, inputs []runstate.Input, outs []string, timeout time.Duration) int {
	defer survivePipe()()
	r, code := c.openRun("await", dir, "", 0, timeout)
	if r == nil {
		return code
	}
	if err := checkOutputs(r, stage, outs); err != nil {
		return c.closeRun(r, c.failWith(exitRunstate, inDir(err, dir)))
	}
	ctx, cancel := lockCtx(timeout)
	st, err := r.Begin(ctx, stage, inputs...)
	cancel()
	switch {
	case errors.Is(err, runstate.ErrDone):
		c.notef("runstate await: %s: approved: %s", stage, doneWhy(stageOf(r, stage)))
		return c.closeRun(r, exitOK)
	case err != nil:
		return c.closeRun(r, c.failWith(beginStatus(err), inDir(err, dir)))
	}
	for _, p := range outs {
		if err := st.Output(p); err != nil {
			return c.closeRun(r, c.endStage(st, exitRunstate, err))
		}
	}
	err = st.Await(reason)
	if !errors.Is(err, runstate.ErrNeedsPerson) {
		return c.closeRun(r, c.endStage(st, exitRunstate, err))
	}
	c.notef("runstate await: %s awaits a person: %s; clear it with: runstate approve %s %s -by NAME", stage, reason, quoteArg(dir), quoteArg(stage))
	return c.closeRun(r, exitPerson)
}

// pipeline opens the run in dir (creating it with request), calls fn,
// closes the session and prints what say makes of it; each step waits at
// most timeout for the ledger lock (zero: for ever). say gets the run's
// status after fn and wrote, which tells whether this session wrote a
// record of an event (and whether that is known): what fn asked for may
// have been recorded by another process first, after this session read
// the run at its open, so that fn recorded nothing.
func (c *cli) pipeline(name, dir, request string, timeout time.Duration, fn func(ctx context.Context, r *runstate.Run) error, say func(st *runstate.Status, wrote func(ev string) (yes, known bool)) string) int {
	rec := newRecorder()
	c.onRecord = rec.note
	r, code := c.openRun(name, dir, request, 0, timeout)
	if r == nil {
		return code
	}
	ctx, cancel := lockCtx(timeout)
	err := fn(ctx, r)
	cancel()
	if err != nil {
		code := exitFail
		if errors.Is(err, runstate.ErrInvalid) {
			code = exitUsage
		}
		return c.closeRun(r, c.failWith(code, err))
	}
	st := statusOf(r)
	if code := c.closeRun(r, exitOK); code != exitOK {
		return code
	}
	what := say(st, func(ev string) (bool, bool) { return rec.wrote(ev, 10*time.Second) })
	fmt.Fprintln(c.out, escape.Page(fmt.Sprintf("%s (ledger seq %d in %s)", what, st.Seq, c.where)))
	return exitOK
}

// recorder keeps the events of the records a session wrote, as
// Options.OnRecord reports them.
type recorder struct {
	mu     sync.Mutex
	evs    map[string]bool
	closed chan struct{} // closed when the session's close record is reported
}

func newRecorder() *recorder {
	return &recorder{evs: map[string]bool{}, closed: make(chan struct{})}
}

func (w *recorder) note(rec runstate.Record) {
	if rec.Seq == 0 { // a notice, not a record
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.evs[rec.Ev] = true
	if rec.Ev == "close" {
		close(w.closed)
	}
}

// wrote reports whether the session wrote a record of event ev. It is
// known once the session's close record is reported: OnRecord reports
// records in ledger order, so then none of the session's is still to
// come. The report may come after Close returned (from the goroutine
// that waited for another process's lock), so wrote waits for it, at
// most max: known is false when it did not come, or when the session's
// open record was not reported either (a Runner that does not pass
// Options.OnRecord on).
func (w *recorder) wrote(ev string, max time.Duration) (yes, known bool) {
	w.mu.Lock()
	opened := w.evs["open"]
	w.mu.Unlock()
	if !opened {
		return false, false
	}
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-w.closed:
		known = true
	case <-t.C:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.evs[ev], known
}

// statusOf is r's status, or an empty one.
func statusOf(r *runstate.Run) *runstate.Status {
	st, err := r.Status()
	if err != nil {
		return &runstate.Status{}
	}
	return st
}
