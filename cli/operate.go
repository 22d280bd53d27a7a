package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/escape"
)

var approveCmd = &command{
	name:     "approve",
	synopsis: "DIR STAGE -by NAME [-note TEXT] [-timeout D]",
	short:    "clear a stage that awaits a person (a review, or a failure)",
	long: `Approve records that the person NAME cleared STAGE, which awaits a
person: a review (the stage's attempt ended with Await) becomes complete; a
failure that needed a person (NeedsPerson, or retries exhausted) may be
begun again with a fresh retry budget. The approve record is in the ledger,
fsync'd, when the command returns; the session it opens to write it appends
its own open and close records. Exit status 1 when STAGE does not await a
person.`,
	min: 2, max: 2,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		by := fs.String("by", "", "`NAME` of who approves (required)")
		note := fs.String("note", "", "`TEXT`: why, or what was checked")
		timeout := timeoutFlag(fs)
		return func(c *cli, args []string) int {
			if strings.TrimSpace(*by) == "" {
				return c.usageError("approve", "-by NAME is required")
			}
			check := func(st *runstate.Status) error {
				s, ok := st.Stage(args[1])
				switch {
				case !ok:
					return fmt.Errorf("stage %s is unknown to the run in %s", args[1], Redact(args[0]))
				case s.State == runstate.StateInterrupted:
					return fmt.Errorf("stage %s does not await a person: it is interrupted (attempt %d's session %s is gone): run the pipeline again, the stage begins anew", args[1], s.Attempt, short(s.Session))
				case s.State != runstate.StateAwaiting:
					return fmt.Errorf("stage %s does not await a person: it is %s", args[1], s.State)
				}
				return nil
			}
			return c.operate(args[0], *timeout, check, func(ctx context.Context, r *runstate.Run) (string, error) {
				return fmt.Sprintf("approved stage %s (by %s)", args[1], *by), r.Approve(ctx, args[1], *by, *note)
			})
		}
	},
}

var invalidateCmd = &command{
	name:     "invalidate",
	synopsis: "DIR STAGE -reason TEXT [-timeout D]",
	short:    "force a stage (and the stages after it) to be redone",
	long: `Invalidate records that STAGE's result no longer counts, with the reason
and the operating-system user who asked: the next run of the pipeline redoes
it, and the stages that depend on it through After are redone in turn. It
also clears a fatal failure. The record is in the ledger, fsync'd, when the
command returns.`,
	min: 2, max: 2,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		reason := fs.String("reason", "", "`TEXT`: why the stage must be redone (required)")
		timeout := timeoutFlag(fs)
		return func(c *cli, args []string) int {
			if strings.TrimSpace(*reason) == "" {
				return c.usageError("invalidate", "-reason TEXT is required")
			}
			check := func(st *runstate.Status) error {
				if _, ok := st.Stage(args[1]); !ok {
					return fmt.Errorf("stage %s is unknown to the run in %s", args[1], Redact(args[0]))
				}
				return nil
			}
			return c.operate(args[0], *timeout, check, func(ctx context.Context, r *runstate.Run) (string, error) {
				return "invalidated stage " + args[1], r.Invalidate(ctx, args[1], *reason)
			})
		}
	},
}

var resolveCmd = &command{
	name:     "resolve",
	synopsis: "DIR KEY (-sent RECEIPT | -not-sent) -by NAME [-note TEXT] [-timeout D]",
	short:    "settle a side effect whose outcome is unknown",
	long: `Resolve records a person's decision on the side effect KEY, whose outcome
is unknown (unconfirmed, in doubt, or an intent whose session died):
-sent RECEIPT says it happened, with its receipt, and it is never sent
again; -not-sent says it did not, so the next Effect call sends it. RECEIPT is recorded as
JSON: a valid JSON text as it is, anything else as a JSON string. Check the
receiving system before deciding. The record is in the ledger, fsync'd, when
the command returns. Exit status 1 when KEY is not awaiting a decision.`,
	min: 2, max: 2,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		sent := fs.String("sent", "", "the effect happened; `RECEIPT` is its receipt (JSON, or text)")
		notSent := fs.Bool("not-sent", false, "the effect did not happen: it may be sent again")
		by := fs.String("by", "", "`NAME` of who decided (required)")
		note := fs.String("note", "", "`TEXT`: how it was checked")
		timeout := timeoutFlag(fs)
		return func(c *cli, args []string) int {
			sentSet := false
			fs.Visit(func(f *flag.Flag) { sentSet = sentSet || f.Name == "sent" })
			if sentSet == *notSent {
				return c.usageError("resolve", "give exactly one of -sent RECEIPT and -not-sent")
			}
			if strings.TrimSpace(*by) == "" {
				return c.usageError("resolve", "-by NAME is required")
			}
			res := runstate.Resolution{Sent: sentSet, By: *by, Note: *note}
			what := "resolved effect " + args[1] + " as not sent"
			if sentSet {
				res.Receipt = receipt(*sent)
				what = fmt.Sprintf("resolved effect %s as sent, receipt %s", args[1], res.Receipt)
			}
			check := func(st *runstate.Status) error {
				for _, e := range st.Effects {
					if e.Key != args[1] {
						continue
					}
					if e.State != runstate.EffectUnconfirmed && e.State != runstate.EffectInDoubt && e.State != runstate.EffectIntent {
						return fmt.Errorf("effect %s is %s, not unconfirmed: there is nothing to resolve", args[1], e.State)
					}
					return nil
				}
				return fmt.Errorf("effect %s is unknown to the run in %s", args[1], Redact(args[0]))
			}
			return c.operate(args[0], *timeout, check, func(ctx context.Context, r *runstate.Run) (string, error) {
				return what + " (by " + *by + ")", r.Resolve(ctx, args[1], res)
			})
		}
	},
}

// receipt turns the -sent argument into JSON: as it is when it is JSON,
// else a JSON string.
func receipt(s string) json.RawMessage {
	if s != "" && json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	b, _ := json.Marshal(s)
	return b
}

// defaultTimeout is how long a writing command waits for the ledger lock
// unless -timeout says otherwise.
const defaultTimeout = 30 * time.Second

// timeoutFlag defines -timeout on a writing command's flags.
func timeoutFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("timeout", defaultTimeout, "how long to wait for the ledger lock, which a running session holds for each append (0: for ever); on timeout the command says which process holds it")
}

// operate opens the run in dir, calls fn, and closes the session, waiting
// at most timeout for the ledger lock at each step. fn returns what it did,
// for the message on success. The run must exist: check looks at its
// status first, so that a request the library would refuse is refused
// without opening a session (the library checks again, under the lock,
// and decides).
func (c *cli) operate(addr string, timeout time.Duration, check func(*runstate.Status) error, fn func(ctx context.Context, r *runstate.Run) (string, error)) int {
	return c.onSource(addr, func(ctx context.Context, src Source) int {
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		return c.operateOn(ctx, src, timeout, check, fn)
	})
}

// operateOn is operate on the opened src.
func (c *cli) operateOn(ctx context.Context, src Source, timeout time.Duration, check func(*runstate.Status) error, fn func(ctx context.Context, r *runstate.Run) (string, error)) int {
	// Inspect first: Open would create a run that is not there.
	st, err := src.Inspect(ctx)
	if err != nil {
		return c.fail(err)
	}
	// A stage running in a session that is gone is interrupted, as
	// status shows it and as the session opened below records it first.
	alive := sessionsAlive(ctx, src, st)
	for i, s := range st.Stages {
		if s.State == runstate.StateRunning && !alive[s.Session] {
			st.Stages[i].State = runstate.StateInterrupted
		}
	}
	if err := check(st); err != nil {
		return c.fail(err)
	}
	// Open with the run's own revision and environment: the status
	// reports those of the last session that opened, and an operator's
	// session should not change them.
	r, err := src.Open(ctx, &runstate.Options{Revision: st.Revision, Environment: st.Environment, LockTimeout: timeout})
	if err != nil {
		return c.fail(err)
	}
	what, err := fn(ctx, r)
	var seq int64
	if st, serr := r.Status(); serr == nil {
		seq = st.Seq
	}
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.out, escape.Page(fmt.Sprintf("%s: recorded at seq %d in %s", what, seq, src.Name())))
	return exitOK
}

var repairCmd = &command{
	name:     "repair",
	dirOnly:  true,
	synopsis: "[-truncate-at LINE [-force] | -accept-loss] [-json] [-timeout D] DIR",
	short:    "cut a torn ledger tail (kept aside) and rebuild the projections",
	long: `Repair takes the ledger lock and puts the run in DIR back in a state every
reader and writer accepts:

  - a torn last line (a writer died mid-append; it was never acknowledged)
    is moved to logs/ledger.jsonl.torn-<time> and cut off;
  - manifest.json and logs/next-steps.txt are rebuilt from the ledger, every
    line of it checked.

Damage in the middle of the ledger (an edited, deleted or reordered line) is
refused (exit 1) unless -truncate-at LINE is given: then the whole ledger is
first copied to logs/ledger.jsonl.bak-<time>, and the ledger is cut at the
start of LINE (the line 'runstate verify' advises), dropping it and every
line after it. -truncate-at is refused when the damage is before LINE, at line 1,
while a session has the run open, and, unless -force, when there is no
damage at or after LINE (a healthy ledger) or when the cut would drop records
that logs/ledger.wal or manifest.json shows were acknowledged. Records a power
loss damaged in the ledger that logs/ledger.wal holds whole are copied back
first, so no cut drops them.

A ledger that ends before records manifest.json shows were acknowledged
(whole records lost from its end, with no torn line to show for it: restored
from an old backup, copied badly, cut by a file system that lost its end) is
refused (exit 1), as Open refuses it: rebuilding the projections would drop
the last trace of those records and redo the stages they completed. Restore
logs/ledger.jsonl from a backup that holds them, or accept the loss with
-accept-loss: manifest.json and logs/next-steps.txt are first copied to
manifest.json.lost-<time> and logs/next-steps.txt.lost-<time>, then rebuilt
from the ledger as it is. -accept-loss is refused while a session has the
run open.

Repair appends no ledger record: the files it leaves next to the ledger
(torn-<time>, bak-<time>) and the projections (lost-<time>) are the trace of
what it cut or dropped. When it returns,
the cut, the saved copies and the rebuilt projections are durable
(fsync'd). Safe while sessions run, except with -truncate-at or -accept-loss.

With -json it prints the library's runstate.RepairReport: {"dir", "ledger",
"damage", "torn_bytes", "torn_saved", "backup", "cut_at", "cut_lines",
"cut_bytes", "records", "bytes", "rebuilt", "lost", "kept_aside"}.`,
	min: 1, max: 1,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		var o runstate.RepairOptions
		fs.IntVar(&o.TruncateAt, "truncate-at", 0, "cut the ledger at the start of `LINE` (a backup of the whole ledger is kept)")
		fs.BoolVar(&o.Force, "force", false, "with -truncate-at: cut even a ledger without damage at or after LINE")
		fs.BoolVar(&o.AcceptLoss, "accept-loss", false, "rebuild the projections even from a ledger that lost acknowledged records from its end (the old ones are kept aside)")
		asJSON := fs.Bool("json", false, "print JSON")
		timeout := timeoutFlag(fs)
		return func(c *cli, args []string) int {
			o.LockTimeout = *timeout
			if o.TruncateAt < 0 {
				return c.usageError("repair", "-truncate-at must be a line number, 2 or more")
			}
			if o.Force && o.TruncateAt == 0 {
				return c.usageError("repair", "-force only goes with -truncate-at")
			}
			if o.AcceptLoss && o.TruncateAt > 0 {
				return c.usageError("repair", "-accept-loss does not go with -truncate-at (add -force to drop acknowledged records with a cut)")
			}
			return c.repair(args[0], &o, *asJSON)
		}
	},
}

func (c *cli) repair(dir string, o *runstate.RepairOptions, asJSON bool) int {
	err := conninfoError(dir)
	if err == nil {
		err = isFile(dir)
	}
	var rep *runstate.RepairReport
	if err == nil {
		rep, err = runstate.Repair(dir, o)
	}
	if err != nil {
		c.fail(err)
		fmt.Fprintln(c.err, "runstate: nothing was changed")
		return exitFail
	}
	if asJSON {
		if err := writeJSON(c.out, rep); err != nil {
			return c.fail(err)
		}
		return exitOK
	}
	w := bufio.NewWriter(c.out)
	defer w.Flush()
	fmt.Fprintf(w, "repaired %s\n", escape.Text(dir))
	if rep.Damage == "" {
		fmt.Fprintf(w, "  damage:  none\n")
	} else {
		fmt.Fprintf(w, "  damage:  %s\n", escape.Page(rep.Damage))
	}
	if rep.Restored > 0 {
		fmt.Fprintf(w, "  restored: %d acknowledged records from logs/ledger.wal (a machine crash kept them out of the ledger)\n", rep.Restored)
	}
	if rep.TornSaved != "" {
		fmt.Fprintf(w, "  cut:     the torn tail, %d bytes, saved to %s\n", rep.TornBytes, rep.TornSaved)
	}
	if rep.Backup != "" {
		fmt.Fprintf(w, "  backup:  %s (the whole ledger before the cut)\n", rep.Backup)
		fmt.Fprintf(w, "  cut:     %d lines, %d bytes, from byte %d\n", rep.CutLines, rep.CutBytes, rep.CutAt)
	}
	if rep.Lost != "" {
		fmt.Fprintf(w, "  lost:    %s\n", escape.Page(rep.Lost))
		fmt.Fprintf(w, "  kept:    %s (the projections before the repair)\n", strings.Join(rep.KeptAside, ", "))
	}
	fmt.Fprintf(w, "  ledger:  %d records (%d bytes), every line checked\n", rep.Records, rep.Bytes)
	if len(rep.Rebuilt) > 0 {
		fmt.Fprintf(w, "  rebuilt: %s\n", strings.Join(rep.Rebuilt, ", "))
	}
	return exitOK
}
