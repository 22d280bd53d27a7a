package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/escape"
)

var lsCmd = &command{
	name:     "ls",
	dirOnly:  true,
	synopsis: "[-json] [-depth N] [ROOT...]",
	short:    "every run under the roots, one line each; what needs a person first",
	long: `Ls finds every run directory (one holding logs/ledger.jsonl) under each
ROOT (default: the current directory) and prints one line for each: the
directory, its request, progress (done/planned stages), its state, the
first thing that blocks it, and the age of its last ledger record. A
working directory of a run kept elsewhere (its logs/run.json names the
run's address: a run in PostgreSQL) has a line too, in the state
elsewhere, with the address; ls does not read that run (the file could
name any server, and connecting would send it your password): 'runstate
status DIR' or 'runstate ls ADDRESS' does.

A ROOT may also be the address of a store that holds runs, where the
command reads one (the runstate command built with pgstore: a database,
postgres://USER@HOST:PORT/DB[?schema=S]); ls then lists every run there
(or, with run=NAME, that one), each under its address.

The states, in the order ls sorts them:

  blocked   a person must act: a stage awaits approval or failed fatally,
            or a side effect's outcome is unknown
  failed    a stage's last attempt failed (retryable: run the pipeline again)
  stopped   nothing runs and planned work remains, or a stage was
            interrupted (its session died): run the pipeline again
  unknown   a stage is running, but whether its session is alive
            cannot be told (its lock file in logs/sessions is another
            user's): running, or interrupted; status says "alive or
            gone: cannot tell" of it. Run ls as the user that runs the
            run's sessions (this wins over failed and stopped)
  running   a live session is running a stage (this wins over failed
            and stopped)
  finished  every planned stage is done
  elsewhere a working directory of a run kept at another address

Ls descends at most -depth directories below a root, not into a run
directory, not through symbolic links, and not into .git or node_modules;
it gives up (and says so) after visiting 100,000 directories. Like status it
takes no lock and writes nothing.

With -json it prints a JSON array of {"dir" (or the address), "id", "request", "done",
"planned", "state", "blocker" (a runstate.Blocker, or absent), "last_record"
(RFC 3339), "age_seconds", "seq", "error", "address" (a working
directory's run)}.

Exit status 0; 3 when any run is blocked; 1 when a run or a root could not
be read (its line says why), or a directory below a root could not be
looked into (another user's: a message on standard error names it, as a run
there is not listed), and none is blocked. A run unknown does not change it
(status exits 0 for it too).`,
	min: 0, max: -1,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		asJSON := fs.Bool("json", false, "print JSON")
		depth := fs.Int("depth", 6, "descend at most `N` directories below each root")
		return func(c *cli, args []string) int {
			if len(args) == 0 {
				args = []string{"."}
			}
			return c.ls(args, *depth, *asJSON)
		}
	},
}

// lsMaxDirs bounds the directories ls visits.
const lsMaxDirs = 100_000

// lsRun is one line of ls, and its -json shape.
type lsRun struct {
	Dir        string            `json:"dir"`
	ID         string            `json:"id,omitempty"`
	Request    string            `json:"request,omitempty"`
	Done       int               `json:"done"`
	Planned    int               `json:"planned"`
	State      string            `json:"state"`
	Blocker    *runstate.Blocker `json:"blocker,omitempty"`
	LastRecord time.Time         `json:"last_record,omitzero"`
	Age        float64           `json:"age_seconds"`
	Seq        int64             `json:"seq"`
	Error      string            `json:"error,omitempty"`
	// Address is, for a working directory of a run kept elsewhere, the
	// run's address, where its line was read.
	Address string `json:"address,omitempty"`
}

// lsRank orders the states: what needs a person first.
var lsRank = map[string]int{"blocked": 0, "error": 1, "failed": 2, "stopped": 3, "unknown": 4, "running": 5, "finished": 6, "elsewhere": 7}

func (c *cli) ls(roots []string, depth int, asJSON bool) int {
	var dirs, workDirs []string
	visited, unreadable := 0, false
	var walk func(dir string, level int)
	walk = func(dir string, level int) {
		if visited >= lsMaxDirs {
			return
		}
		visited++
		if _, err := os.Lstat(ledgerIn(dir)); err == nil {
			// A ledger that is not a regular file (a FIFO, a device, a
			// directory, a symbolic link) makes a run too: listed in
			// state error, with why.
			dirs = append(dirs, dir)
			return
		}
		if _, ok := workDirOf(dir); ok {
			workDirs = append(workDirs, dir)
			return
		}
		if level >= depth {
			return
		}
		entries, err := readDir(dir)
		if err != nil {
			if level > 0 && !errors.Is(err, fs.ErrNotExist) { // gone meanwhile: nothing to list
				c.notef("runstate ls: cannot look for runs in %s (%v): a run there is not listed", dir, err)
				unreadable = true
			}
			if level == 0 {
				switch ferr := isFile(dir); {
				case ferr != nil:
					c.notef("runstate ls: %s is a file, not a directory to look for runs under", dir)
				case errors.Is(err, fs.ErrNotExist):
					c.notef("runstate ls: %v; give a directory that exists", err)
				default:
					c.notef("runstate ls: %v", err)
				}
				unreadable = true
			}
			return
		}
		for _, e := range entries {
			if !e.IsDir() || e.Name() == ".git" || e.Name() == "node_modules" {
				continue // a symbolic link is not a directory entry here
			}
			walk(filepath.Join(dir, e.Name()), level+1)
		}
	}
	ctx := context.Background()
	now := time.Now()
	var runs []lsRun
	for _, root := range roots {
		if list := c.lister(root); list != nil {
			srcs, closeAll, err := list(ctx, root)
			if err != nil {
				c.notef("runstate ls: %s", strings.TrimPrefix(err.Error(), "runstate: "))
				unreadable = true
				continue
			}
			for _, src := range srcs {
				runs = append(runs, lsOne(ctx, src, now))
			}
			closeAll()
			continue
		}
		if err := conninfoError(root); err != nil {
			c.notef("runstate ls: %v", err)
			unreadable = true
			continue
		}
		walk(filepath.Clean(root), 0)
	}
	if visited >= lsMaxDirs {
		fmt.Fprintf(c.err, "runstate ls: stopped after %d directories; give narrower roots or a smaller -depth\n", lsMaxDirs)
	}

	for _, d := range dirs {
		runs = append(runs, lsOne(ctx, &dirSource{dir: d}, now))
	}
	for _, d := range workDirs {
		runs = append(runs, lsWorkDir(d))
	}
	if runs == nil {
		runs = []lsRun{} // -json: [], not null
	}
	sort.SliceStable(runs, func(i, j int) bool {
		a, b := runs[i], runs[j]
		if lsRank[a.State] != lsRank[b.State] {
			return lsRank[a.State] < lsRank[b.State]
		}
		if !a.LastRecord.Equal(b.LastRecord) {
			return a.LastRecord.After(b.LastRecord)
		}
		return a.Dir < b.Dir
	})
	code := exitOK
	if unreadable {
		code = exitFail
	}
	for _, r := range runs {
		switch {
		case r.State == "blocked":
			code = exitBlocked
		case r.State == "error" && code == exitOK:
			code = exitFail
		}
	}
	if asJSON {
		if err := writeJSON(c.out, runs); err != nil {
			return c.fail(err)
		}
		return code
	}
	w := bufio.NewWriter(c.out)
	defer w.Flush()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DIR\tREQUEST\tDONE\tSTATE\tFIRST BLOCKER\tLAST RECORD")
	for _, r := range runs {
		blocker := "-"
		switch {
		case r.Error != "":
			blocker = oneLine(lsReason(r), 60)
		case r.State == "elsewhere":
			blocker = oneLine("run kept at "+r.Address, 60)
		case r.Blocker != nil:
			what := r.Blocker.Stage
			if what == "" {
				what = "effect " + r.Blocker.Key
			}
			blocker = oneLine(what+" "+r.Blocker.Kind+": "+r.Blocker.Reason, 60)
		}
		age := "-"
		if !r.LastRecord.IsZero() {
			age = ago(now.Sub(r.LastRecord)) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\t%s\n", escape.Text(r.Dir), oneLine(r.Request, 40), r.Done, r.Planned, r.State, blocker, age)
	}
	tw.Flush()
	return code
}

// lsReason is r's error for its line, without what the line shows
// already: a leading "runstate: " and the run's directory or address.
func lsReason(r lsRun) string {
	msg := strings.TrimPrefix(r.Error, "runstate: ")
	for _, where := range []string{r.Dir, r.Address} {
		if where != "" {
			msg = strings.TrimPrefix(msg, where+": ")
		}
	}
	return msg
}

// lister returns the Lister of arg's scheme when arg is an address that
// one lists (ls ADDRESS), or nil.
func (c *cli) lister(arg string) Lister {
	s, ok := scheme(arg)
	if !ok || !c.isAddress(arg) {
		return nil
	}
	return c.lists[s]
}

// lsWorkDir is ls's line for the working directory dir of a run kept
// elsewhere: its state is "elsewhere" and its address the one dir's
// logs/run.json names. ls does not read that run: the file could name
// any server, and connecting would hand it this user's password
// (PGPASSWORD, ~/.pgpass) for a directory ls merely walked past.
// 'runstate status DIR' reads it, when asked to.
func lsWorkDir(dir string) lsRun {
	addr, _ := workDirOf(dir)
	return lsRun{Dir: dir, Address: Redact(addr), State: "elsewhere"}
}

// lsOne reads the run src for ls.
func lsOne(ctx context.Context, src Source, now time.Time) lsRun {
	r := lsRun{Dir: src.Name()}
	st, err := src.Inspect(ctx)
	if lr, ok := src.(lastRecorder); ok {
		var seq int64
		if err == nil {
			seq = st.Seq
		}
		if at, err := lr.LastRecord(ctx, seq); err == nil && !at.IsZero() {
			r.LastRecord = at.UTC()
			r.Age = now.Sub(at).Seconds()
		}
	}
	if err != nil {
		r.State, r.Error = "error", err.Error()
		return r
	}
	r.ID, r.Request, r.Seq = st.ID, st.Request, st.Seq
	r.Done, r.Planned = st.Done, st.Done+st.Remaining
	if len(st.Plan) == 0 { // no plan: count the stages it knows
		r.Done, r.Planned = 0, len(st.Stages)
		for _, s := range st.Stages {
			if s.State == runstate.StateComplete || s.State == runstate.StateSkipped {
				r.Done++
			}
		}
	}
	alive := sessionsAlive(ctx, src, st)
	unsure := unsureOf(src, alive) // taken for alive: cannot tell
	first := func(kinds ...string) *runstate.Blocker {
		for _, b := range st.Blockers {
			for _, k := range kinds {
				if b.Kind == k {
					return &b
				}
			}
		}
		return nil
	}
	if b := first("awaiting", "fatal", "unconfirmed"); b != nil {
		r.State, r.Blocker = "blocked", b
		return r
	}
	var running, unknown, interrupted, failed *runstate.StageStatus
	for i, s := range st.Stages {
		switch {
		case s.State == runstate.StateRunning && unsure[s.Session] != nil:
			if unknown == nil {
				unknown = &st.Stages[i]
			}
		case s.State == runstate.StateRunning && alive[s.Session]:
			running = &st.Stages[i]
		case s.State == runstate.StateRunning, s.State == runstate.StateInterrupted:
			if interrupted == nil {
				interrupted = &st.Stages[i]
			}
		case s.State == runstate.StateFailed:
			if failed == nil {
				failed = &st.Stages[i]
			}
		}
	}
	switch {
	case running != nil:
		r.State = "running"
	case unknown != nil:
		// Running or interrupted: status says "alive or gone: cannot
		// tell" of its session.
		r.State = "unknown"
		r.Blocker = &runstate.Blocker{Kind: "unknown", Stage: unknown.Name,
			Reason: fmt.Sprintf("cannot tell whether session %s, which began attempt %d, is alive (%v)", short(unknown.Session), unknown.Attempt, unsure[unknown.Session]),
			Action: unsureAction(unsure[unknown.Session], "run ls or status as the user that runs the run's sessions: it tells a running stage from an interrupted one")}
	case failed != nil:
		r.State = "failed"
		r.Blocker = &runstate.Blocker{Kind: "failed", Stage: failed.Name, Reason: failed.Error,
			Action: "run the pipeline again: the stage is retried"}
	case interrupted != nil:
		r.State = "stopped"
		r.Blocker = &runstate.Blocker{Kind: "interrupted", Stage: interrupted.Name,
			Reason: fmt.Sprintf("attempt %d's session is gone", interrupted.Attempt),
			Action: "run the pipeline again: the stage begins anew"}
	case r.Planned > 0 && r.Done == r.Planned:
		r.State = "finished"
	default:
		r.State = "stopped"
	}
	return r
}

// readDir is os.ReadDir; a variable for tests.
var readDir = os.ReadDir

// ago is d, short: 45s, 12m, 3h, 5d.
func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(max(d, 0).Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
