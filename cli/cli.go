// Package cli is the runstate command: the read commands (status, log,
// verify, next, metrics, export), the operator commands (approve,
// invalidate, resolve), repair, the pipeline commands (exec, effect, plan,
// skip, await) and ls, each as 'runstate help' describes it.
//
// It is a package so that a command can be built with more stores than
// the run directory: Run takes, in Options.Sources, an Opener per URL
// scheme, and the read and operator commands then take such an address
// wherever they take DIR (github.com/runstate/runstate/pgstore/cmd/runstate
// adds postgres://), and ls, given a Lister per scheme in Options.Lists,
// lists the runs a store at such an address holds. Given a Runner per
// scheme in Options.Runners, the pipeline commands take, as DIR, this
// machine's working directory of a run kept at such an address (-at
// ADDRESS names it the first time). The library's own command
// (cmd/runstate) is Run with no Options. repair works on run directories
// only.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/escape"
)

// Exit codes.
const (
	exitOK      = 0
	exitFail    = 1 // a check failed, or an error
	exitUsage   = 2 // the command line is wrong
	exitBlocked = 3 // status: something blocks the run
)

// cli is one invocation: where output and messages go, and the stores
// it can open besides run directories.
type cli struct {
	out     io.Writer
	err     io.Writer
	sources map[string]Opener
	lists   map[string]Lister
	runners map[string]Runner
	// addresses: Options.Usage.
	addresses string
	// at: a pipeline command's -at ADDRESS.
	at string
	// where names the run a pipeline command opened, for its messages:
	// DIR, or the address of a run kept elsewhere.
	where string
	// release: what the Runner that opened the run returned, called
	// after the Run is closed.
	release func()
	// said: the errors printed (fail), each once.
	said []string
	// onRecord: the Options.OnRecord of the session a pipeline command
	// opens (openRun).
	onRecord func(runstate.Record)
}

// command is one subcommand. setup defines its flags on fs and returns the
// function that runs it with the positional arguments.
type command struct {
	name     string
	synopsis string // after "runstate NAME "
	short    string // one line for 'runstate help'
	long     string // the paragraph(s) for 'runstate help NAME'
	min, max int    // positional arguments; max < 0: no limit
	// argv: the command line ends with "-- CMD [ARGS...]", passed after
	// the positional arguments and never parsed as flags.
	argv bool
	// dirOnly: the command works on run directories only; an address
	// (another store's URL) is refused.
	dirOnly bool
	// workDir: a pipeline command, which opens a session with DIR as the
	// run's working directory (openRun). DIR may also be the working
	// directory of a run kept in a store whose Runner is registered, and
	// -at ADDRESS names such a run.
	workDir bool
	setup   func(fs *flag.FlagSet) func(c *cli, args []string) int
}

// commands lists the subcommands in the order 'runstate help' shows them.
var commands []*command

func init() {
	commands = []*command{
		statusCmd, logCmd, verifyCmd, nextCmd, metricsCmd, exportCmd,
		approveCmd, invalidateCmd, resolveCmd, repairCmd,
		execCmd, effectCmd, planCmd, skipCmd, awaitCmd, lsCmd,
	}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// Main runs the command line of this process (os.Args) and exits with its
// exit status.
func Main(o *Options) {
	os.Exit(Run(os.Args[1:], os.Stdout, os.Stderr, o))
}

// Run executes the command line args (without the program's name),
// printing results to stdout and messages to stderr, and returns the exit
// status. o (nil: the zero Options) names the stores besides run
// directories. What a command makes durable is what its help says (the
// operator commands: one ledger record, durable when Run returns). Run may
// be called from several goroutines at once, with different writers; a
// command that follows (log -follow) or runs another (exec) returns when
// it ends, or on SIGINT.
func Run(args []string, stdout, stderr io.Writer, o *Options) int {
	c := &cli{out: stdout, err: stderr}
	if o != nil {
		c.addresses = o.Usage
		c.sources = map[string]Opener{}
		for k, v := range o.Sources {
			c.sources[strings.ToLower(k)] = v
		}
		c.lists = map[string]Lister{}
		for k, v := range o.Lists {
			c.lists[strings.ToLower(k)] = v
		}
		c.runners = map[string]Runner{}
		for k, v := range o.Runners {
			c.runners[strings.ToLower(k)] = v
		}
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, c.usage())
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if name == "help" && len(args) > 1 {
			cmd := lookup(args[1])
			if cmd == nil {
				fmt.Fprintf(stderr, "runstate: unknown command %q; run 'runstate help'\n", args[1])
				return exitUsage
			}
			fmt.Fprint(stdout, cmdHelp(cmd))
			return exitOK
		}
		fmt.Fprint(stdout, c.usage())
		return exitOK
	}
	cmd := lookup(name)
	if cmd == nil {
		fmt.Fprintf(stderr, "runstate: unknown command %q; run 'runstate help'\n", name)
		return exitUsage
	}
	fs := flag.NewFlagSet("runstate "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	runFn := cmd.setup(fs)
	at := atFlag(fs, cmd)
	args, argv, dashes := splitArgv(cmd, args[1:])
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, cmdHelp(cmd))
		return exitOK
	}
	if err != nil {
		return c.usageError(cmd.name, err.Error())
	}
	if f := fs.Lookup("timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d < 0 {
			// It would wait for ever, as 0 does, where a bound was meant.
			return c.usageError(cmd.name, "-timeout must not be negative (0 waits for ever)")
		}
	}
	switch {
	case cmd.argv && !dashes:
		return c.usageError(cmd.name, "missing -- before the command to run (runstate "+cmd.name+" ... -- CMD ARGS)")
	case cmd.argv && (len(argv) == 0 || argv[0] == ""):
		return c.usageError(cmd.name, "no command after --")
	case len(pos) < cmd.min:
		return c.usageError(cmd.name, "missing arguments")
	case cmd.max >= 0 && len(pos) > cmd.max:
		return c.usageError(cmd.name, fmt.Sprintf("too many arguments: %s", strings.Join(pos[cmd.max:], " ")))
	}
	for i, p := range pos {
		if p == "" {
			return c.usageError(cmd.name, "empty argument")
		}
		if cmd.dirOnly && (i == 0 || cmd.name == "ls") && c.isAddress(p) && (cmd.name != "ls" || c.lister(p) == nil) {
			msg := fmt.Sprintf("%s is an address, not a run directory: %s works on run directories only", Redact(p), cmd.name)
			s, _ := scheme(p)
			switch {
			case cmd.workDir && c.runners[s] != nil:
				msg = fmt.Sprintf("%s is an address, not a directory: %s writes its files in DIR, this machine's working directory of the run; give one (a new directory, say) with -at %s", Redact(p), cmd.name, Redact(p))
			case cmd.name == "ls" && (s == "postgres" || s == "postgresql"):
				msg += " in this command; the one that lists a database's runs is built with: " + pgCommand
			case cmd.workDir && (s == "postgres" || s == "postgresql"):
				msg += " in this command; the one that also works on runs in PostgreSQL is built with: " + pgCommand
			}
			return c.usageError(cmd.name, msg)
		}
		if i > 0 || !cmd.dirOnly || cmd.name == "ls" {
			continue
		}
		if to, ok := workDirOf(p); ok && (!cmd.workDir || c.runner(to) == nil) {
			// It would make a second run, in files, beside the one its
			// logs/run.json names.
			msg := fmt.Sprintf("%s is a working directory of the run at %s, not a run directory: %s works on run directories only", p, Redact(to), cmd.name)
			if s, _ := scheme(to); cmd.workDir && (s == "postgres" || s == "postgresql") {
				msg += " in this command; the one that also works on runs in PostgreSQL is built with: " + pgCommand
			}
			return c.usageError(cmd.name, msg)
		}
		if *at == "" {
			continue
		}
		if c.runner(*at) == nil {
			s, ok := scheme(*at)
			msg := fmt.Sprintf("-at %s: this runstate command keeps runs in directories only; leave out -at to use %s as a run directory", Redact(*at), p)
			switch {
			case !ok: // not shown: it could be a key=value DSN with a password
				msg = fmt.Sprintf("-at: what was given is not a run address (SCHEME://...): give the address of the run that %s is a working directory of, e.g. postgres://agent@db:5432/agents?run=NAME, or leave out -at to use %s as a run directory", p, p)
			case len(c.runners) > 0:
				msg = fmt.Sprintf("-at %s: this runstate command keeps no runs at %s:// addresses; leave out -at to use %s as a run directory", Redact(*at), s, p)
			case s == "postgres" || s == "postgresql":
				msg += ", or build the one that also works on runs in PostgreSQL: " + pgCommand
			}
			return c.usageError(cmd.name, msg)
		}
		if _, err := os.Stat(ledgerIn(p)); err == nil {
			return c.usageError(cmd.name, fmt.Sprintf("%s is a run directory (its logs/ledger.jsonl holds a run's records), not a working directory for the run at %s: give that run a directory of its own", p, Redact(*at)))
		}
		c.at = *at
	}
	if cmd.argv {
		pos = append(pos, argv...)
	}
	return runFn(c, pos)
}

// parseInterleaved parses flags that may come before, between or after
// the positional arguments (Go's flag package stops at the first
// non-flag), and returns the positional ones. Everything after "--" is
// positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if passwordSetting.MatchString(err.Error()) {
				// The flag package quotes the bad argument: a
				// connection string given where a flag goes.
				return nil, errors.New("a flag is malformed (not shown: it holds a password setting)")
			}
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// atFlag defines a pipeline command's -at flag on fs (nil for the other
// commands: an empty ADDRESS).
func atFlag(fs *flag.FlagSet, cmd *command) *string {
	if !cmd.workDir {
		return new(string)
	}
	return fs.String("at", "", "`ADDRESS`: the run is kept at ADDRESS (postgres://...?run=NAME, with the runstate command built from pgstore) and DIR is this machine's working directory of it; created with -request, and named by DIR's logs/run.json after, so that later commands need no -at (it keeps no password: give that in PGPASSWORD or ~/.pgpass)")
}

// usageError reports a bad command line and returns exitUsage.
func (c *cli) usageError(name, msg string) int {
	cmd := lookup(name)
	fmt.Fprintf(c.err, "runstate %s: %s\nusage: runstate %s %s\nrun 'runstate help %s' for more\n", cmd.name, escape.Page(msg), cmd.name, cmd.synopsis, cmd.name)
	return exitUsage
}

// fail prints err on standard error and returns exitFail. The message may
// quote a record (a stage's error, a name): what could act on a terminal
// is escaped (escape.Page).
func (c *cli) fail(err error) int {
	msg := err.Error()
	if !strings.HasPrefix(msg, "runstate") {
		msg = "runstate: " + msg
	}
	if c.repeats(msg, err) {
		return exitFail
	}
	c.said = append(c.said, msg)
	fmt.Fprintln(c.err, escape.Page(msg))
	return exitFail
}

// repeats reports whether an error printed before (fail) already says
// all that err (msg) says: the same text, or, for a Run made read-only
// by a failed write, the write error that every later call of the Run
// (the stage's Fail, Close) wraps again.
func (c *cli) repeats(msg string, err error) bool {
	said := func(s string) bool {
		s = strings.TrimPrefix(s, "runstate: ")
		for _, p := range c.said {
			if strings.Contains(p, s) {
				return true
			}
		}
		return false
	}
	if said(msg) {
		return true
	}
	var multi interface{ Unwrap() []error }
	if !errors.Is(err, runstate.ErrReadOnly) || !errors.As(err, &multi) {
		return false
	}
	for _, e := range multi.Unwrap() {
		if e != runstate.ErrReadOnly && said(e.Error()) {
			return true
		}
	}
	return false
}

// notef prints a message on standard error, one line: the names, reasons
// and paths in it may come from a record, so what could act on a terminal
// is escaped (escape.Page).
func (c *cli) notef(format string, args ...any) {
	fmt.Fprintln(c.err, escape.Page(fmt.Sprintf(format, args...)))
}

func (c *cli) usage() string {
	var b strings.Builder
	b.WriteString(`runstate shows and operates run directories written by the runstate library.

usage: runstate COMMAND [flags] DIR [args]

`)
	if c.addresses != "" {
		b.WriteString(strings.TrimSpace(c.addresses) + "\n\n")
	}
	groups := []struct {
		title string
		names []string
	}{
		{"Read commands (no lock, nothing written; each but export takes -json):", []string{"status", "log", "verify", "next", "metrics", "export"}},
		{"Operator commands (each appends one ledger record):", []string{"approve", "invalidate", "resolve"}},
		{"Maintenance:", []string{"repair"}},
		{"Pipeline commands (any language: stages and side effects as commands):", []string{"exec", "effect", "plan", "skip", "await"}},
		{"Many runs:", []string{"ls"}},
	}
	for _, g := range groups {
		b.WriteString(g.title + "\n")
		for _, n := range g.names {
			cmd := lookup(n)
			fmt.Fprintf(&b, "  %-11s %s\n", cmd.name, cmd.short)
		}
		b.WriteString("\n")
	}
	b.WriteString(`Flags may come before or after the arguments.
Exit status: 0 all well; 1 a check failed or an error; 2 usage error;
3 status or ls found something that blocks a run. exec, effect and
await have their own (see 'runstate help exec').

Run 'runstate help COMMAND' or 'runstate COMMAND -h' for one command.
`)
	return b.String()
}

func cmdHelp(cmd *command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: runstate %s %s\n\n%s\n", cmd.name, cmd.synopsis, strings.TrimSpace(cmd.long))
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	cmd.setup(fs)
	atFlag(fs, cmd)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		b.WriteString("\nflags:\n")
		fs.SetOutput(&b)
		fs.PrintDefaults()
	}
	return b.String()
}
