package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/escape"
)

// maxReceipt bounds the receipt a command may print.
const maxReceipt = 1 << 20

var effectCmd = &command{
	name:     "effect",
	dirOnly:  true,
	workDir:  true,
	synopsis: "DIR KEY [-check CMD] [-payload TEXT] [-request TEXT] [-at ADDRESS] [-wait D] [-timeout D] -- CMD [ARGS...]",
	short:    "perform a side effect once: intent before, receipt after",
	long: `Effect performs the side effect KEY of the run in DIR once, across every
session, with the guarantees of the library's Run.Effect:

  - A confirmed KEY prints its stored receipt and runs nothing.
  - Otherwise an intent is recorded, durably, before CMD runs; CMD's
    standard output is the receipt (a JSON text as it is, anything else as
    a JSON string), recorded durably when it exits 0, and printed.
  - A KEY whose earlier attempt ended unconfirmed (its session died between
    the intent and the receipt, or CMD failed: it may have landed) is asked
    about with -check: the check exits 0 and prints the receipt when the
    effect landed (it is recorded as confirmed, and not sent again), exits
    1 when it did not (CMD runs again, same key), anything else when it
    cannot tell. Without -check, or when it cannot tell, the effect is
    unconfirmed and a person decides with 'runstate resolve'.

Both commands get the full idempotency key, "<run-id>:KEY", in
RUNSTATE_IDEMPOTENCY_KEY, to hand to the receiving system, and RUNSTATE_DIR,
RUNSTATE_RUN and RUNSTATE_EFFECT (KEY) too. -check CMD is one string run by
sh -c (cmd /C on Windows); CMD after -- is run as it is. Their standard error
goes to effect's; SIGINT and SIGTERM are passed on, as for exec. -payload
TEXT is recorded with the intent: the same KEY with another payload is
refused. DIR must hold a run, unless -request TEXT creates it; it may be
a working directory of a run kept elsewhere (-at: see 'runstate help
exec'). -wait D waits, trying again at most a second apart, while another
live session attempts KEY, for at most D: then the receipt it recorded is
printed, or, when its session died, KEY is settled as without -wait.
SIGINT or SIGTERM between tries ends the wait with 128+N.

Exit status: 0 the receipt is printed (sent now, found by the check, or
stored); 2 a usage error (nothing recorded); 121 another live session
attempts KEY; 122 the effect is unconfirmed: a person must resolve it; 125
runstate could not record it (when CMD landed but its confirmation was not
recorded, the error says its receipt and the resolve that records it); 126 CMD was found but could not be started
(a bad #! line, no execute permission): it did not run, and is recorded as
not sent, so the next effect sends it; 127 CMD was not found (checked
before anything is recorded).`,
	min: 2, max: 2, argv: true,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		check := fs.String("check", "", "`CMD`: a shell command that exits 0 and prints the receipt when the effect landed, 1 when it did not")
		payload := fs.String("payload", "", "`TEXT`: the effect's request, recorded with the intent (JSON, or text)")
		request := fs.String("request", "", "`TEXT`: the run's request; creates the run when DIR holds none")
		timeout := timeoutFlag(fs)
		waitFor := waitFlag(fs, "another live session attempts KEY (121)")
		return func(c *cli, args []string) int {
			defer survivePipe()()
			if *waitFor < 0 {
				return c.usageError("effect", "-wait must not be negative")
			}
			if err := runstate.CheckKey(args[1]); err != nil {
				return c.usageError("effect", invalid(err)+"; choose another key (nothing was recorded)")
			}
			if _, err := exec.LookPath(args[2]); err != nil {
				return c.failWith(exitNotFound, fmt.Errorf("effect %s: command %s: %v; install it or fix PATH (nothing was recorded)", args[1], quoteArg(args[2]), errors.Unwrap(err)))
			}
			r, code := c.openRun("effect", args[0], *request, 0, *timeout)
			if r == nil {
				return code
			}
			wait := newLockWait(*timeout)
			defer wait.stop()
			e := shellEffect{dir: r.Dir(), run: r.ID(), key: args[1], argv: args[2:], check: *check, errw: c.err, wait: wait}
			return c.closeRun(r, c.effect(r, &e, *payload, *waitFor))
		}
	},
}

// shellEffect is an effect whose Do and Check are commands.
type shellEffect struct {
	dir, run, key string
	argv          []string
	check         string
	errw          interface{ Write([]byte) (int, error) }
	wait          *lockWait       // Effect's context: paused while a command runs
	did, found    bool            // Do ran; Check found the effect
	landed        json.RawMessage // the receipt of a Do whose command exited 0
	notStarted    error           // Do's command could not be started: it did not run
}

func (e *shellEffect) env(full string) []string {
	abs, err := filepath.Abs(e.dir)
	if err != nil {
		abs = e.dir
	}
	return append(os.Environ(), "RUNSTATE_IDEMPOTENCY_KEY="+full, "RUNSTATE_DIR="+abs,
		"RUNSTATE_RUN="+e.run, "RUNSTATE_EFFECT="+e.key)
}

// do runs the command and returns its standard output as the receipt.
func (e *shellEffect) do(ctx context.Context, full string) (json.RawMessage, error) {
	e.did = true
	out, res := e.capture(e.argv, full)
	switch {
	case !res.started:
		e.notStarted = res.err
		return nil, fmt.Errorf("command %s could not be started: %w", quoteArg(e.argv[0]), res.err)
	case res.err != nil:
		return nil, fmt.Errorf("command %s: %w", quoteArg(e.argv[0]), res.err)
	case res.code != 0:
		return nil, fmt.Errorf("command %s %s", quoteArg(e.argv[0]), res.how())
	}
	e.landed = receipt(string(out))
	return e.landed, nil
}

// checkFn runs the check command: 0 found, with the receipt; 1 not found;
// anything else, cannot tell.
func (e *shellEffect) checkFn(ctx context.Context, full string) (json.RawMessage, bool, error) {
	sh := []string{"sh", "-c", e.check}
	if runtime.GOOS == "windows" {
		sh = []string{"cmd", "/C", e.check}
	}
	out, res := e.capture(sh, full)
	switch {
	case res.err != nil:
		return nil, false, fmt.Errorf("check %s: %w", quoteArg(e.check), res.err)
	case res.code == 0:
		e.found = true
		return receipt(string(out)), true, nil
	case res.code == 1:
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("check %s %s: it cannot tell", quoteArg(e.check), res.how())
}

func (e *shellEffect) capture(argv []string, full string) ([]byte, procResult) {
	e.wait.pause()
	defer e.wait.resume()
	out := &limitedBuffer{max: maxReceipt}
	res := runProc(proc{argv: argv, env: e.env(full), stdout: out, stderr: e.errw})
	if res.err == nil && out.over > 0 {
		res.err = fmt.Errorf("printed more than %d bytes: a receipt is one short JSON text or line", maxReceipt)
	}
	return bytes.TrimRight(out.buf, "\r\n"), res
}

func (c *cli) effect(r *runstate.Run, e *shellEffect, payload string, waitFor time.Duration) int {
	eff := runstate.Effect{Do: e.do}
	if payload != "" {
		eff.Request = receipt(payload)
	}
	if e.check != "" {
		eff.Check = e.checkFn
	}
	for _, es := range statusOf(r).Effects {
		if es.Key == e.key && es.State == runstate.EffectConfirmed {
			c.notef("runstate effect: %s: confirmed at seq %d: not sent again", e.key, es.Seq)
		}
	}
	var rec json.RawMessage
	tries := 0
	busy := func(err error) bool { return errors.Is(err, runstate.ErrBusy) }
	sig, err := c.retry("effect: "+e.key, waitFor, busy, func() (err error) {
		if tries++; tries > 1 {
			e.wait.resume() // paused between tries: -timeout bounds each wait for the lock
		}
		rec, err = r.Effect(e.wait, e.key, eff)
		if busy(err) {
			e.wait.pause()
		}
		return err
	})
	switch {
	case sig != nil:
		return c.failWith(signalStatus(sig), err)
	case errors.Is(err, runstate.ErrBusy):
		return c.failWith(exitBusy, err)
	case errors.Is(err, runstate.ErrUnconfirmed) && e.notStarted != nil:
		return c.notStarted(r, e)
	case errors.Is(err, runstate.ErrUnconfirmed):
		code := c.failWith(exitPerson, inDir(err, r.Dir()))
		if e.check == "" {
			// The library's "Check" is -check here.
			c.notef("runstate effect: %s: give -check CMD, and the next effect asks the receiving system whether it landed (runstate help effect)", e.key)
		}
		return code
	case errors.Is(err, runstate.ErrInvalid):
		return c.failWith(exitUsage, err)
	case err != nil && e.landed != nil:
		// The command landed, the confirmation was not recorded: the
		// receipt is only here now.
		c.notef("runstate effect: %s: the command exited 0 and printed the receipt %s: the effect landed, but its confirmation is not recorded (below); once the run can be written, record it with: runstate resolve %s %s -sent %s -by NAME (or let the next effect's -check find it)",
			e.key, e.landed, quoteArg(e.dir), quoteArg(e.key), quoteArg(string(e.landed)))
		return c.failWith(exitRunstate, err)
	case err != nil:
		return c.failWith(exitRunstate, err)
	}
	if e.found && !e.did {
		c.notef("runstate effect: %s: the check found that it landed: confirmed, not sent again", e.key)
	}
	var b bytes.Buffer
	if json.Compact(&b, rec) != nil {
		b.Reset()
		b.Write(rec)
	}
	b.WriteByte('\n')
	c.out.Write(escape.JSON(b.Bytes())) // the same JSON values, nothing a terminal acts on
	return exitOK
}

// notStarted settles an effect whose command could not be started (a bad
// #! line, no execute permission): it did not run, so it cannot have
// landed. The library recorded it as unconfirmed, as for any failed Do;
// it is resolved as not sent, durably, so that the next effect sends it.
func (c *cli) notStarted(r *runstate.Run, e *shellEffect) int {
	err := r.Resolve(e.wait, e.key, runstate.Resolution{By: "runstate effect",
		Note: "the command could not be started, so it did not run: " + e.notStarted.Error()})
	if err != nil {
		return c.failWith(exitPerson, fmt.Errorf("effect %s: command %s could not be started (%v), but recording that it was not sent failed: %w; resolve it with: runstate resolve %s %s -not-sent -by NAME",
			e.key, quoteArg(e.argv[0]), e.notStarted, err, quoteArg(r.Dir()), quoteArg(e.key)))
	}
	return c.failWith(exitCannot, fmt.Errorf("effect %s: command %s could not be started: %v; it did not run (recorded as not sent): check that it is an executable file and that its #! line names an interpreter that exists, then run effect again",
		e.key, quoteArg(e.argv[0]), e.notStarted))
}
