package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runstate/runstate"
)

// Exit statuses of exec, effect and await that are runstate's own. Every
// other status of exec is the command's.
const (
	exitBusy     = 121 // another live session runs the stage (or attempts the effect)
	exitPerson   = 122 // the stage awaits a person; the effect is unconfirmed
	exitFatal    = 123 // the stage failed fatally
	exitStale    = 124 // an input changed while the command ran
	exitRunstate = 125 // runstate could not do it: see the message
	exitCannot   = 126 // the command was found but could not be started
	exitNotFound = 127 // the command was not found
)

var execCmd = &command{
	name:     "exec",
	dirOnly:  true,
	workDir:  true,
	synopsis: "DIR STAGE [-in FILE] [-value NAME=V] [-after STAGE] [-out PATH] [-valid-for D] [-request TEXT] [-at ADDRESS] [-wait D] [-timeout D] -- CMD [ARGS...]",
	short:    "run a command as a stage: skipped when done and its evidence holds",
	long: `Exec runs CMD as the stage STAGE of the run in DIR, with the guarantees of
the library's Do:

  - When STAGE is complete (or skipped) and its evidence holds (the same
    -in file contents, -value values and -after stages' outputs, every
    output present with its recorded hash, not older than -valid-for), CMD
    is not run: one line on standard error says so and why; exit 0.
  - Otherwise the stage begins (one line on standard error says why it
    runs, as Stage.Reason and the begin record do: "first attempt",
    "input src/parser.go changed", "attempt 1 was interrupted ...") and
    CMD runs with RUNSTATE_DIR (DIR as an absolute path: the run
    directory, or the working directory), RUNSTATE_STAGE, RUNSTATE_ATTEMPT
    and RUNSTATE_RUN (the run's id) in its environment and exec's
    standard input. Its standard output and error go to exec's, and also
    to DIR/exec/STAGE.stdout and DIR/exec/STAGE.stderr, which are outputs
    of the stage (a "/" in STAGE makes subdirectories; other characters
    than letters, digits, ".", "_" and "-" are %XX-escaped, and so is the
    first of a part Windows takes for a device: aux is %61ux, and the "."
    that ends a directory's name or starts a ".stdout" or ".stderr" there:
    a.stdout/b keeps exec/a%2Estdout/b.stdout, so that it is not stage a's
    file; a part that would make a file name longer than 255 bytes keeps
    its start and ends in "~" and a hash of STAGE). Letters keep their case:
    where the file system ignores case (macOS, Windows), stages Build and
    build would share one file, and exec refuses the second before its
    begin, with nothing recorded.
  - Exit 0: every -out PATH must exist; the stage completes with the
    outputs and their hashes, durably. Non-zero: the stage fails
    (retryable, unless -person-exit or -fatal-exit names the status) and
    exec exits with the command's status.

SIGINT and SIGTERM sent to exec are passed to the command's process group;
a command that then ends with an error leaves the attempt unended, so the
next session records it as interrupted and runs it again (exit 128+signal).
If exec is killed (SIGKILL), the command is killed too (Linux: a parent-death
signal) and the next session records the attempt as interrupted. When the
command ends, what is left of its process group is killed. A standard
output or error that is a closed pipe (exec ... | head -1) stops neither
exec nor the record of how the stage ended: what cannot be shown is still
kept in DIR/exec.

-in FILE and -out PATH are paths as the shell sees them (relative to the
current directory); -out must be inside DIR. DIR must hold a run, unless
-request TEXT is given: it creates the run (and, for an existing run, must
be the run's request).

DIR may also be this machine's working directory of a run kept elsewhere
(the runstate command built from pgstore keeps runs in PostgreSQL, shared
by several machines): -at ADDRESS names the run the first time, and DIR's
logs/run.json names it after. The files are in DIR and the records at
ADDRESS; the outputs of -after stages done on another machine are put in
DIR before CMD runs. The same holds for effect, plan, skip and await.

-wait D makes exec wait while another live session runs STAGE or an
-after stage is not done yet, on this machine or on another that shares
the run, trying again at most a second apart, for at most D: a
pipeline goes on once the stage it needs is done elsewhere, instead of
exiting 121 or 125. Once the stage is done, exec skips it as usual. A
session that died does not keep STAGE busy: the next try records its
attempt as interrupted and runs STAGE here. An -after stage that failed
fatally or awaits a person is not waited for. After D the status is the
one without -wait; SIGINT or SIGTERM between tries ends the wait with
128+N (during a try, as without -wait).

Exit status: the command's, or 0 when it was skipped; 2 for a usage error
(nothing recorded); 121 another live session runs the stage; 122 the stage
awaits a person (runstate approve); 123 it failed fatally (runstate
invalidate); 124 an input changed while the command ran (the stage is
invalidated: run it again); 125 runstate could not record it, an -after
stage is not done, or the command exited 0 without writing an -out file
(the stage failed); 126 the command could not be started; 127 it was not
found (both: the stage failed); 128+N the command was killed by signal N.`,
	min: 2, max: 2, argv: true,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		var ev evidenceFlags
		ev.register(fs)
		request := fs.String("request", "", "`TEXT`: the run's request; creates the run when DIR holds none")
		maxAttempts := fs.Int("max-attempts", 0, "`N` retryable failures before the stage awaits a person (default 3)")
		personExit := fs.String("person-exit", "", "`CODES`: comma-separated exit statuses that need a person (the stage awaits approve)")
		fatalExit := fs.String("fatal-exit", "", "`CODES`: comma-separated exit statuses that are final (the stage fails fatally)")
		timeout := timeoutFlag(fs)
		wait := waitFlag(fs, "another live session runs STAGE (121) or an -after stage is not done (125)")
		return func(c *cli, args []string) int {
			o := execOptions{dir: args[0], stage: args[1], argv: args[2:], request: *request, maxAttempts: *maxAttempts, timeout: *timeout, wait: *wait, after: ev.after}
			var err error
			if o.person, err = exitCodes(*personExit); err != nil {
				return c.usageError("exec", "-person-exit: "+err.Error())
			}
			if o.fatal, err = exitCodes(*fatalExit); err != nil {
				return c.usageError("exec", "-fatal-exit: "+err.Error())
			}
			if *maxAttempts < 0 {
				return c.usageError("exec", "-max-attempts must be positive")
			}
			if *wait < 0 {
				return c.usageError("exec", "-wait must not be negative")
			}
			if err := checkStageName(o.stage); err != nil {
				return c.usageError("exec", err.Error())
			}
			if o.inputs, o.outs, err = ev.resolve(o.dir, o.stage); err != nil {
				return c.usageError("exec", err.Error())
			}
			for _, p := range o.outs {
				if p == stdPath(o.stage, "stdout") || p == stdPath(o.stage, "stderr") {
					return c.usageError("exec", fmt.Sprintf("-out %s is where exec keeps the command's output (an output already); drop it", filepath.Join(o.dir, filepath.FromSlash(p))))
				}
			}
			return c.exec(&o)
		}
	},
}

// splitArgv cuts the command line of a command that runs one (exec,
// effect) at its first "--": the part before is parsed, the part after is
// the command. For other commands it returns args unchanged.
func splitArgv(cmd *command, args []string) (head, argv []string, dashes bool) {
	if !cmd.argv {
		return args, nil, false
	}
	i := slices.Index(args, "--")
	if i < 0 {
		return args, nil, false
	}
	return args[:i], args[i+1:], true
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// evidenceFlags are the flags that say what a stage starts from and what
// it writes: exec's and await's.
type evidenceFlags struct {
	in, values, after, out multiFlag
	validFor               time.Duration
}

func (e *evidenceFlags) register(fs *flag.FlagSet) {
	fs.Var(&e.in, "in", "`FILE` whose content is evidence (repeatable)")
	fs.Var(&e.values, "value", "`NAME=V`: a value that is evidence (repeatable)")
	fs.Var(&e.after, "after", "`STAGE` whose outputs are evidence; it must be done (repeatable)")
	fs.Var(&e.out, "out", "`PATH` inside DIR that the command writes: an output, recorded with its hash (repeatable)")
	fs.DurationVar(&e.validFor, "valid-for", 0, "`DURATION` after which the evidence expires and the stage is redone")
}

// resolve checks the flags of stage against the file system and returns
// the inputs, and the -out paths relative to dir. Its errors are usage
// errors: nothing has been recorded.
func (e *evidenceFlags) resolve(dir, stage string) ([]runstate.Input, []string, error) {
	var inputs []runstate.Input
	// Begin refuses an input given twice, but after a session opened the
	// run, and by its ledger name ("after:b"): check here, by the flags.
	given := map[string]string{} // ledger name -> the flag that named it
	once := func(name, flag string) error {
		prev, dup := given[name]
		switch {
		case !dup:
			given[name] = flag
			return nil
		case prev == flag:
			return fmt.Errorf("%s is given twice; give each input once", flag)
		case strings.HasPrefix(prev, "-in ") && strings.HasPrefix(flag, "-in "):
			return fmt.Errorf("%s and %s are the same file (input %s); give it once", prev, flag, quoteArg(name))
		}
		return fmt.Errorf("%s and %s have the same name (input %s); give the -value another NAME", prev, flag, quoteArg(name))
	}
	for _, f := range e.in {
		fi, err := os.Stat(f)
		switch {
		case err != nil:
			return nil, nil, fmt.Errorf("-in %s: %v; give a file that exists", f, errors.Unwrap(err))
		case fi.IsDir():
			return nil, nil, fmt.Errorf("-in %s is a directory; give its files, one -in each", f)
		case !fi.Mode().IsRegular():
			// <(cmd) is a pipe: Begin refuses it, after a session opened.
			kind := fileKind(fi.Mode())
			switch {
			case fi.Mode()&fs.ModeNamedPipe != 0:
				kind = "a named pipe (a FIFO, or <(...) in the shell)"
			case kind == "":
				kind = "a special file"
			}
			return nil, nil, fmt.Errorf("-in %s is %s, not a regular file: an input is read whole when the stage begins and again when it ends; give what it holds as -value NAME=TEXT, or copy it to a file first", f, kind)
		}
		if err := once(inputName(f), "-in "+quoteArg(f)); err != nil {
			return nil, nil, err
		}
		inputs = append(inputs, runstate.File(f))
	}
	for _, v := range e.values {
		name, val, ok := strings.Cut(v, "=")
		if !ok || name == "" {
			return nil, nil, fmt.Errorf("-value %q: write it as NAME=VALUE", v)
		}
		if strings.HasPrefix(name, "after:") {
			return nil, nil, fmt.Errorf("-value %s: a NAME may not start with \"after:\" (the -after inputs are named so); choose another", quoteArg(name))
		}
		if err := once(name, "-value "+quoteArg(name)); err != nil {
			return nil, nil, err
		}
		inputs = append(inputs, runstate.Value(name, val))
	}
	for _, s := range e.after {
		if err := checkStageName(s); err != nil {
			return nil, nil, fmt.Errorf("-after: %v", err)
		}
		if s == stage {
			// Begin refuses it too, but after a session opened the run.
			return nil, nil, fmt.Errorf("-after %s names the stage itself: drop it, or name the stage that %s needs", quoteArg(s), quoteArg(stage))
		}
		if err := once("after:"+s, "-after "+quoteArg(s)); err != nil {
			return nil, nil, err
		}
		inputs = append(inputs, runstate.After(s))
	}
	if e.validFor < 0 {
		return nil, nil, errors.New("-valid-for must be positive")
	}
	if e.validFor > 0 {
		inputs = append(inputs, runstate.ValidFor(e.validFor))
	}
	var outs []string
	for _, p := range e.out {
		rel, err := insideDir(dir, p)
		if err != nil {
			return nil, nil, err
		}
		if err := runstate.CheckOutput(rel); err != nil {
			return nil, nil, fmt.Errorf("-out %s: %s", p, invalid(err))
		}
		outs = append(outs, rel)
	}
	return inputs, outs, nil
}

// inputName is the name the library records the -in file p under: its
// path relative to the working directory (Options.SourceDir's default),
// or its absolute path when it is outside.
func inputName(p string) string {
	wd, err := os.Getwd()
	if err != nil {
		return p
	}
	path := filepath.Clean(p)
	if !filepath.IsAbs(path) {
		path = filepath.Join(wd, path)
	}
	if rel, err := filepath.Rel(wd, path); err == nil && filepath.IsLocal(rel) {
		return filepath.ToSlash(rel)
	}
	return filepath.ToSlash(path)
}

// checkStageName refuses a stage name the library would refuse, before
// anything is recorded.
func checkStageName(name string) error {
	if err := runstate.CheckName("stage name", name); err != nil {
		return fmt.Errorf("%s; choose another name", invalid(err))
	}
	return nil
}

// invalid is the text of err, one of the library's ErrInvalid errors,
// without that error's own text in front: for a usage error.
func invalid(err error) string {
	return strings.TrimPrefix(err.Error(), runstate.ErrInvalid.Error()+": ")
}

// insideDir returns p relative to dir, or an error when p (as the shell
// sees it) is not inside dir. Symbolic links are checked when the stage
// records the output.
func insideDir(dir, p string) (string, error) {
	ad, err1 := filepath.Abs(dir)
	ap, err2 := filepath.Abs(p)
	if err := errors.Join(err1, err2); err != nil {
		return "", fmt.Errorf("-out %s: %v", p, err)
	}
	rel, ok := relInside(ad, ap)
	if !ok {
		// The same directory by another name: DIR or PATH through a
		// symbolic link (macOS's /tmp is /private/tmp; pwd -P).
		rd, err1 := filepath.EvalSymlinks(ad)
		rp, err2 := evalExisting(ap)
		if err1 == nil && err2 == nil {
			rel, ok = relInside(rd, rp)
		}
	}
	if !ok {
		return "", fmt.Errorf("-out %s is not inside the run directory %s; write the output there, e.g. -out %s", p, dir, filepath.Join(dir, filepath.Base(p)))
	}
	return filepath.ToSlash(rel), nil
}

// relInside returns p relative to dir, both absolute and clean, when p
// is inside dir.
func relInside(dir, p string) (string, bool) {
	rel, err := filepath.Rel(dir, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return "", false
	}
	return rel, true
}

// evalExisting is the absolute path p with the symbolic links of the part
// of it that exists resolved (an -out file need not exist yet, nor its
// directory).
func evalExisting(p string) (string, error) {
	rest := ""
	for {
		r, err := filepath.EvalSymlinks(p)
		if err == nil {
			return filepath.Join(r, rest), nil
		}
		parent := filepath.Dir(p)
		if !errors.Is(err, fs.ErrNotExist) || parent == p {
			return "", err
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}

// exitCodes parses "3,4" into exit statuses.
func exitCodes(s string) ([]int, error) {
	var codes []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 255 {
			return nil, fmt.Errorf("%q is not an exit status (1-255); give them comma-separated, e.g. 3,4", f)
		}
		codes = append(codes, n)
	}
	return codes, nil
}

type execOptions struct {
	dir, stage    string
	argv          []string
	request       string
	maxAttempts   int
	inputs        []runstate.Input
	outs          []string // relative to dir, slash-separated
	person, fatal []int
	timeout       time.Duration // -timeout: the bound of each wait for the ledger lock
	wait          time.Duration // -wait: how long to try again while the stage is busy or not ready
	after         []string      // the -after stages
}

// openRun opens the run in dir for a pipeline command, waiting at most
// timeout for the ledger lock in Open, Close and a stage's end (zero: for
// ever). Without request, dir must hold a run already: Open would create
// one. A run kept elsewhere (-at ADDRESS, or the address dir's
// runstate.WorkDirFile names) is opened by its store's Runner, with dir as
// its working directory. The second result is the exit status when the
// first is nil.
func (c *cli) openRun(name, dir, request string, maxAttempts int, timeout time.Duration) (*runstate.Run, int) {
	opts := &runstate.Options{Request: request, MaxAttempts: maxAttempts, LockTimeout: timeout, OnRecord: c.onRecord}
	if err := conninfoError(dir); err != nil {
		// It would be made a directory by that name, in the messages.
		return nil, c.usageError(name, err.Error())
	}
	c.where = dir
	addr := c.at
	if addr == "" {
		addr, _ = workDirOf(dir)
	}
	if addr != "" {
		return c.openAt(name, dir, addr, opts)
	}
	if err := isFile(dir); err != nil {
		return nil, c.usageError(name, err.Error())
	}
	ledger := ledgerIn(dir)
	_, noLedger := os.Stat(ledger)
	if _, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(runstate.WorkDirFile))); err == nil && noLedger != nil {
		// A working directory whose logs/run.json names no address any
		// more (emptied by a crash, edited): runstate.Open would start a
		// second run in files beside the one it was for.
		with := ""
		if len(c.runners) == 0 {
			with = ", with the runstate command that works on runs kept there (PostgreSQL: " + pgCommand + ")"
		}
		return nil, c.usageError(name, fmt.Sprintf("%s has a %s that names no run address (empty, damaged or not a regular file): if %s is the working directory of a run kept elsewhere, give -at ADDRESS (that run's address)%s; else use another directory", dir, runstate.WorkDirFile, dir, with))
	}
	if request == "" && noLedger != nil {
		elsewhere := ""
		if len(c.runners) > 0 {
			// A fleet's second machine: following the -request advice
			// alone would start a run in files beside the shared one.
			elsewhere = "; or, for a run kept elsewhere (PostgreSQL: made by another machine), give -at ADDRESS, the run's address, as this machine's first command on " + dir
		}
		return nil, c.usageError(name, fmt.Sprintf("%s holds no run (%s); give -request TEXT to create one%s", dir, ledger, elsewhere))
	}
	r, err := runstate.Open(dir, opts)
	if err != nil {
		return nil, c.failWith(exitRunstate, err)
	}
	return r, exitOK
}

// openAt opens the run at addr through the Runner of its scheme, with dir
// as its working directory; SIGINT ends the wait. An error that wraps
// runstate.ErrInvalid (no such run and no -request, a bad name) is a usage
// error: nothing was recorded.
func (c *cli) openAt(name, dir, addr string, opts *runstate.Options) (*runstate.Run, int) {
	runner := c.runner(addr)
	if runner == nil { // Run refused it already; a file can change between
		return nil, c.usageError(name, fmt.Sprintf("%s is a working directory of the run at %s: this runstate command cannot open that run", dir, Redact(addr)))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	r, release, err := runner(ctx, addr, dir, opts)
	if err != nil {
		if errors.Is(err, runstate.ErrInvalid) {
			return nil, c.failWith(exitUsage, err)
		}
		return nil, c.failWith(exitRunstate, err)
	}
	c.where, c.release = Redact(addr), release
	return r, exitOK
}

// failWith prints err on standard error and returns code.
func (c *cli) failWith(code int, err error) int {
	c.fail(err)
	return code
}

// closeRun closes r and returns code, or exitRunstate when closing failed
// and code was 0.
func (c *cli) closeRun(r *runstate.Run, code int) int {
	err := r.Close()
	if c.release != nil {
		c.release()
		c.release = nil
	}
	if err != nil {
		c.fail(err)
		if code == exitOK {
			return exitRunstate
		}
	}
	return code
}

// inDir names the run directory as the user typed it (dir) in the advice
// of the library's error, which names it by its absolute path (asTyped).
func inDir(err error, dir string) error {
	abs, aerr := filepath.Abs(dir)
	if aerr != nil {
		return err
	}
	return errors.New(asTyped(err.Error(), abs, dir))
}

// beginStatus maps an error of Begin to an exit status.
func beginStatus(err error) int {
	switch {
	case errors.Is(err, runstate.ErrBusy):
		return exitBusy
	case errors.Is(err, runstate.ErrNeedsPerson):
		return exitPerson
	case errors.Is(err, runstate.ErrFatal):
		return exitFatal
	case errors.Is(err, runstate.ErrInvalid):
		return exitUsage
	}
	return exitRunstate
}

// stdPath is where exec keeps the stream ("stdout" or "stderr") of stage,
// relative to the run directory: exec/STAGE.stdout. Each "/"-separated part
// of the name keeps letters, digits, ".", "_" and "-" and escapes other
// bytes as %XX; a name with an empty, "." or ".." part is one flat file. A
// part whose file name would be longer than maxFileName bytes keeps a
// readable prefix and ends in "~" and a hash of the whole stage name. A
// directory's name never ends in ".stdout", ".stderr" (in any case) or
// "." (dirName), so no stage's directory is another stage's file: stage
// "a" keeps exec/a.stdout, stage "a.stdout/b" exec/a%2Estdout/b.stdout.
func stdPath(stage, stream string) string {
	flat := false
	for part := range strings.SplitSeq(stage, "/") {
		if part == "" || part == "." || part == ".." {
			flat = true
		}
	}
	parts := []string{stage}
	if !flat {
		parts = strings.Split(stage, "/")
	}
	var b strings.Builder
	b.WriteString("exec/")
	for i, part := range parts {
		name := escapeName(part)
		room := maxFileName
		if i == len(parts)-1 {
			room -= len("." + stream)
		} else {
			name = dirName(name) + "/"
			room++
		}
		b.WriteString(shorten(name, room, stage))
	}
	b.WriteString("." + stream)
	return b.String()
}

// dirName is name, an escaped part of a stage name that is a directory
// under exec/, with the "." that would end it or start a ".stdout" or
// ".stderr" at its end escaped as %2E: a stage's file is always
// NAME.stdout or NAME.stderr, and a directory with such a name (or, in a
// file system that ignores case, one that differs only in case) would be
// that file, so that one of the two stages could never run. A trailing
// "." is escaped because Windows drops it: "a." would be "a". The mapping
// stays one-to-one: "%" is always escaped.
func dirName(name string) string {
	lower := strings.ToLower(name)
	for _, ext := range []string{".stdout", ".stderr", "."} {
		if strings.HasSuffix(lower, ext) {
			i := len(name) - len(ext)
			return name[:i] + "%2E" + name[i+1:]
		}
	}
	return name
}

// maxFileName is the longest file name exec makes: most file systems
// refuse more than 255 bytes.
const maxFileName = 255

// escapeName keeps letters, digits, ".", "_" and "-" of s and escapes
// other bytes as %XX. A name that Windows takes for a device (aux, CON,
// nul.txt, com1: the library refuses it as an output on every system)
// has its first byte escaped too.
func escapeName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9',
			ch == '.', ch == '_', ch == '-':
			b.WriteByte(ch)
		default:
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	name := b.String()
	if isDeviceName(name) {
		name = fmt.Sprintf("%%%02X", name[0]) + name[1:]
	}
	return name
}

// isDeviceName reports whether name, escaped (escapeName), is one that
// Windows takes for a device: CON, PRN, AUX, NUL, COM1-9 or LPT1-9, in
// any case, alone or before a ".".
func isDeviceName(name string) bool {
	base, _, _ := strings.Cut(name, ".")
	switch up := strings.ToUpper(base); {
	case up == "CON", up == "PRN", up == "AUX", up == "NUL":
		return true
	case len(up) == 4 && (up[:3] == "COM" || up[:3] == "LPT") && '1' <= up[3] && up[3] <= '9':
		return true
	}
	return false
}

// shorten returns name (escaped) when it has at most room bytes, else its
// first bytes, not cutting an escape, then "~" and 16 hex digits of the
// SHA-256 of stage, room bytes in all. A trailing "/" is kept.
func shorten(name string, room int, stage string) string {
	if len(name) <= room {
		return name
	}
	slash := ""
	if strings.HasSuffix(name, "/") {
		name, slash, room = name[:len(name)-1], "/", room-1
	}
	sum := sha256.Sum256([]byte(stage))
	tag := "~" + hex.EncodeToString(sum[:8])
	cut := room - len(tag)
	if i := strings.LastIndexByte(name[:cut], '%'); i >= cut-2 && i >= 0 {
		cut = i // do not split %XX
	}
	return name[:cut] + tag + slash
}

func (c *cli) exec(o *execOptions) int {
	defer survivePipe()()
	r, code := c.openRun("exec", o.dir, o.request, o.maxAttempts, o.timeout)
	if r == nil {
		return code
	}
	return c.closeRun(r, c.execStage(r, o))
}

func (c *cli) execStage(r *runstate.Run, o *execOptions) int {
	stdout, stderr := stdPath(o.stage, "stdout"), stdPath(o.stage, "stderr")
	if err := checkOutputs(r, o.stage, append([]string{stdout, stderr}, o.outs...)); err != nil {
		return c.failWith(exitRunstate, inDir(err, r.Dir()))
	}
	var st *runstate.Stage
	again := func(err error) bool {
		if !notYet(err) {
			return false
		}
		if !errors.Is(err, runstate.ErrNotReady) {
			return true // STAGE busy
		}
		for _, dep := range o.after {
			// A stage no session will finish without a person: no wait.
			if s := stageOf(r, dep); s.State == runstate.StateFatal || s.State == runstate.StateAwaiting {
				c.notef("runstate exec: %s: not waiting: %s is %s, which needs a person (runstate status %s)", o.stage, dep, s.State, quoteArg(r.Dir()))
				return false
			}
		}
		return true
	}
	sig, err := c.retry("exec: "+o.stage, o.wait, again, func() (err error) {
		ctx, cancel := lockCtx(o.timeout)
		defer cancel() // the attempt's own context does not end with it
		st, err = r.Begin(ctx, o.stage, o.inputs...)
		return err
	})
	if sig != nil {
		return c.failWith(signalStatus(sig), inDir(err, r.Dir()))
	}
	if errors.Is(err, runstate.ErrDone) {
		c.notef("runstate exec: %s: skipped: %s", o.stage, doneWhy(stageOf(r, o.stage)))
		return exitOK
	}
	if err != nil {
		return c.failWith(beginStatus(err), inDir(err, r.Dir()))
	}
	c.notef("runstate exec: %s: running (attempt %d): %s", o.stage, st.Attempt(), oneLine(st.Reason(), 200))
	// end records err as the attempt's failure and says so, and what it
	// made of the stage when that was its last retry (exec would exit 122
	// next time, which "run exec again" in err does not say).
	end := func(code int, err error) int {
		code = c.endStage(st, code, err)
		if then := failedThen(r, o.stage); then != "" {
			c.notef("runstate exec: %s: failed (attempt %d)%s", o.stage, st.Attempt(), then)
		}
		return code
	}

	abs, err := filepath.Abs(r.Dir())
	if err != nil {
		return end(exitRunstate, err)
	}
	for _, p := range append([]string{stdout, stderr}, o.outs...) {
		if err := st.Output(p); err != nil {
			return end(exitRunstate, err)
		}
	}
	files, err := createStd(abs, stdout, stderr)
	if err != nil {
		return end(exitRunstate, err)
	}
	env := append(os.Environ(),
		"RUNSTATE_DIR="+abs, "RUNSTATE_STAGE="+o.stage,
		"RUNSTATE_ATTEMPT="+strconv.Itoa(st.Attempt()), "RUNSTATE_RUN="+r.ID())
	res := runProc(proc{argv: o.argv, env: env, stdin: os.Stdin,
		stdout: &tee{file: files[0], term: c.out}, stderr: &tee{file: files[1], term: c.err}})
	for _, f := range files {
		if err := f.Close(); err != nil && res.err == nil {
			res.err = err
		}
	}

	switch {
	case !res.started:
		code, advice := exitCannot, "check that it is an executable file"
		if errors.Is(res.err, exec.ErrNotFound) || errors.Is(res.err, fs.ErrNotExist) {
			code, advice = exitNotFound, "install it or fix PATH"
		}
		return end(code, fmt.Errorf("command %s could not be started: %w; %s, then run exec again", quoteArg(o.argv[0]), res.err, advice))
	case res.forwarded != nil && res.code != 0:
		c.notef("runstate exec: %s: interrupted by signal %v: attempt %d is left unended; the next session records it as interrupted and runs it again", o.stage, res.forwarded, st.Attempt())
		return res.code
	case res.err != nil:
		return end(exitRunstate, fmt.Errorf("keeping the output of %s: %w", quoteArg(o.argv[0]), res.err))
	case res.code != 0:
		err := fmt.Errorf("command %s %s (its output: %s, %s)", quoteArg(o.argv[0]), res.how(), stdout, stderr)
		switch {
		case slices.Contains(o.person, res.code):
			err = runstate.NeedsPerson(err, fmt.Sprintf("%s %s: look at %s", quoteArg(o.argv[0]), res.how(), stderr))
		case slices.Contains(o.fatal, res.code):
			err = runstate.Fatal(err)
		}
		if ferr := st.Fail(err); ferr != nil {
			return c.failWith(exitRunstate, ferr)
		}
		c.notef("runstate exec: %s: failed (attempt %d): %v%s", o.stage, st.Attempt(), err, failedThen(r, o.stage))
		return res.code
	}
	for _, p := range o.outs {
		if _, err := os.Stat(filepath.Join(abs, filepath.FromSlash(p))); err != nil {
			return end(exitRunstate, fmt.Errorf("command %s exited 0 but did not write the output %s; write it, or drop -out", quoteArg(o.argv[0]), filepath.Join(r.Dir(), filepath.FromSlash(p))))
		}
	}
	if err := st.Complete(); err != nil {
		if errors.Is(err, runstate.ErrStale) {
			return c.failWith(exitStale, fmt.Errorf("%w; run exec again", err))
		}
		return end(exitRunstate, &notCompleteError{cmd: quoteArg(o.argv[0]), err: err})
	}
	return exitOK
}

// failedThen says what a failure of stage just recorded made of it, for
// the message: "" when exec may run it again, else what a person does.
func failedThen(r *runstate.Run, stage string) string {
	switch stageOf(r, stage).State {
	case runstate.StateAwaiting:
		return fmt.Sprintf("; it awaits a person now: runstate approve %s %s -by NAME", quoteArg(r.Dir()), quoteArg(stage))
	case runstate.StateFatal:
		return fmt.Sprintf("; that is final: fix the cause, then runstate invalidate %s %s -reason TEXT", quoteArg(r.Dir()), quoteArg(stage))
	}
	return ""
}

// notCompleteError is Complete's error err for a stage whose command cmd
// exited 0: the command ran, the stage is not complete.
type notCompleteError struct {
	cmd string
	err error
}

func (e *notCompleteError) Error() string {
	return fmt.Sprintf("command %s exited 0, but the stage could not be recorded complete, so it is not (the next exec runs the command again): %s",
		e.cmd, strings.TrimPrefix(e.err.Error(), "runstate: "))
}

func (e *notCompleteError) Unwrap() error { return e.err }

// endStage records err as the stage's failure, then prints it (a message
// that cannot be shown must not keep the failure from the ledger), and
// returns code.
func (c *cli) endStage(st *runstate.Stage, code int, err error) int {
	ferr := st.Fail(err)
	c.fail(err)
	if ferr != nil && !errors.Is(ferr, runstate.ErrClosed) {
		c.fail(ferr)
	}
	return code
}

// checkOutputs checks paths, the outputs of stage, before its begin (as
// Stage.Output would after it), unless the stage is done: a path that
// leads out of the run directory, or names a directory, is an error with
// nothing recorded, not a failed attempt on every try.
func checkOutputs(r *runstate.Run, stage string, paths []string) error {
	if s := stageOf(r, stage); s.State == runstate.StateComplete || s.State == runstate.StateSkipped {
		return nil // Begin skips it, or checks again after its begin
	}
	for _, stream := range []string{"stdout", "stderr"} {
		p := stdPath(stage, stream)
		other, err := spelledAs(osDir(r.Dir()), p)
		if err != nil {
			return fmt.Errorf("runstate: %s, where exec keeps the output of stage %s: %w", p, quoteArg(stage), err)
		}
		if other != "" {
			whose := "another stage's output"
			for _, s := range statusOf(r).Stages {
				if s.Name != stage && (stdPath(s.Name, "stdout") == other || stdPath(s.Name, "stderr") == other) {
					whose = "the output of stage " + quoteArg(s.Name)
				}
			}
			return fmt.Errorf("runstate: %s, where exec keeps the output of stage %s, is %s on this file system, which ignores case: %s, which exec would replace; rename one of the two stages (their names differ only in case), then run the stage again; nothing recorded", p, quoteArg(stage), other, whose)
		}
	}
	for _, p := range paths {
		if fi, err := os.Stat(filepath.Join(r.Dir(), filepath.FromSlash(p))); err == nil && fi.IsDir() {
			// The attempt would fail only after its work: an output is a file.
			if p == stdPath(stage, "stdout") || p == stdPath(stage, "stderr") {
				// Not a path the user named: an older exec kept the
				// output of a stage named "a.stdout/b" in exec/a.stdout/.
				return fmt.Errorf("runstate: %s, where exec keeps the output of stage %s, is a directory (another stage's output, kept there by an older runstate exec): move it away, then run the stage again; nothing recorded", p, quoteArg(stage))
			}
			return fmt.Errorf("runstate: output %s is a directory, and an output is a file: name a file (in it, say), then run the stage again; nothing recorded", p)
		}
		if err := r.CheckOutput(p); err != nil {
			if strings.HasPrefix(p, "exec/") {
				return fmt.Errorf("%w; exec keeps each stage's stdout and stderr under exec/ in the run directory: make exec/ a directory there (remove the link), then run the stage again; nothing recorded", err)
			}
			return fmt.Errorf("%w; give an output path inside the run directory, then run the stage again; nothing recorded", err)
		}
	}
	return nil
}

// osDir is the file system under the run directory that checkOutputs
// looks at: a variable, so that a test can give it one that ignores case
// (no file system here does).
var osDir = func(dir string) fs.StatFS { return os.DirFS(dir).(fs.StatFS) }

// spelledAs returns the name under which the file system keeps path (a
// stage's file under exec/, relative to fsys) when that is another name,
// which only a file system that ignores case does (macOS's and Windows's
// by default, exFAT, ext4 with casefold): there, exec/build.stdout is
// exec/Build.stdout, stage Build's output, which stage build's attempt
// would replace. It returns "" when path does not exist, or exists under
// its own name. A part that exists costs one more Lstat (its name in the
// other case), and a read of its directory only when that exists too.
func spelledAs(fsys fs.StatFS, path string) (string, error) {
	parts := strings.Split(path, "/")
	kept, other := parts[0], false // parts[0] is exec, every stage's
	for i := 1; i < len(parts); i++ {
		parent := strings.Join(parts[:i], "/")
		if _, err := fs.Lstat(fsys, parent+"/"+parts[i]); errors.Is(err, fs.ErrNotExist) {
			return "", nil
		} else if err != nil {
			return "", err
		}
		own := parts[i]
		if _, err := fs.Lstat(fsys, parent+"/"+swapCase(own)); !errors.Is(err, fs.ErrNotExist) {
			// Case may not tell names apart here: the directory says
			// which name it keeps.
			entries, err := fs.ReadDir(fsys, parent)
			if err != nil {
				return "", err
			}
			own = ""
			for _, e := range entries {
				if e.Name() == parts[i] || own == "" && strings.EqualFold(e.Name(), parts[i]) {
					own = e.Name()
				}
			}
			if own == "" { // gone meanwhile
				return "", nil
			}
		}
		kept, other = kept+"/"+own, other || own != parts[i]
	}
	if !other {
		return "", nil
	}
	return kept, nil
}

// swapCase is s with its ASCII letters in the other case (the letters exec
// keeps in a name: it escapes every other byte).
func swapCase(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z':
			return r - 'a' + 'A'
		case 'A' <= r && r <= 'Z':
			return r - 'A' + 'a'
		}
		return r
	}, s)
}

// createStd creates the files that keep the command's standard output
// and error, under the absolute run directory. An old one is removed and
// a new one created (O_EXCL), never written through: a hard link to a
// file outside the run, or a FIFO no one reads (a full one blocks the
// command's output for ever), left there is replaced.
func createStd(dir string, paths ...string) ([]*os.File, error) {
	var files []*os.File
	for _, p := range paths {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return nil, err
		}
		if err := os.Remove(full); err != nil && !errors.Is(err, fs.ErrNotExist) {
			for _, f := range files {
				f.Close()
			}
			return nil, fmt.Errorf("%w: exec replaces the file on each attempt; make %s writable", err, filepath.Dir(full))
		}
		f, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// stageOf is what r knows of stage (the zero StageStatus for a stage it
// never heard of).
func stageOf(r *runstate.Run, stage string) runstate.StageStatus {
	s, _ := statusOf(r).Stage(stage)
	return s
}

// doneWhy says why a stage that Begin found done is not run again.
func doneWhy(s runstate.StageStatus) string {
	if s.State == runstate.StateSkipped {
		return "the stage was skipped (" + oneLine(s.Reason, 200) + ")"
	}
	return fmt.Sprintf("complete since seq %d (attempt %d, %s) and its evidence holds: the same %d input(s), %d output(s) as recorded",
		s.DoneSeq, s.Attempt, s.DoneAt.UTC().Format(time.RFC3339), len(s.Inputs), len(s.Outputs))
}
