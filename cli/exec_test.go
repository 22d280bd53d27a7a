package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shellRun is a fresh run directory created by 'runstate plan', and a
// directory beside it for the test's files.
func shellRun(t *testing.T, stages ...string) (dir, work string) {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("the commands these tests run are sh scripts")
	}
	work = t.TempDir()
	dir = filepath.Join(work, "run")
	r := runCLI(t, append([]string{"plan", dir, "-request", "shell pipeline"}, stages...)...)
	require.Equal(t, 0, r.code, "plan: %s", r.err)
	return dir, work
}

// counted is a shell command that appends a line to the file count each
// time it runs, prints out on stdout and err on stderr.
func counted(count, out, err string) []string {
	return []string{"sh", "-c", `echo x >> "$0"; echo "$1"; echo "$2" >&2`, count, out, err}
}

func lines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(t, err)
	return strings.Count(string(b), "\n")
}

func execCLI(t *testing.T, dir, stage string, flags []string, argv ...string) result {
	t.Helper()
	args := append([]string{"exec", dir, stage}, flags...)
	return runCLI(t, append(append(args, "--"), argv...)...)
}

func stageStatus(t *testing.T, dir, stage string) runstate.StageStatus {
	t.Helper()
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	s, ok := st.Stage(stage)
	require.True(t, ok, "stage %s unknown", stage)
	return s
}

// A done stage whose evidence holds is not run again: exit 0, one line.
func TestExecSkipsDoneStage(t *testing.T) {
	dir, work := shellRun(t, "vet")
	src := filepath.Join(work, "src.go")
	require.NoError(t, os.WriteFile(src, []byte("package x\n"), 0o644))
	count := filepath.Join(work, "count")
	flags := []string{"-in", src, "-value", "model=m1"}

	r := execCLI(t, dir, "vet", flags, counted(count, "out", "err")...)
	require.Equal(t, 0, r.code, r.err)
	assert.Equal(t, "out\n", r.out, "the command's stdout reaches exec's")
	assert.Contains(t, r.err, "err\n", "and its stderr")
	assert.Contains(t, r.err, "runstate exec: vet: running (attempt 1): first attempt\n")
	assert.Equal(t, runstate.StateComplete, stageStatus(t, dir, "vet").State)

	r = execCLI(t, dir, "vet", flags, counted(count, "out", "err")...)
	require.Equal(t, 0, r.code, r.err)
	assert.Equal(t, 1, lines(t, count), "a done stage's command ran again")
	assert.Empty(t, r.out)
	assert.Equal(t, 1, strings.Count(r.err, "\n"), "one line on stderr: %q", r.err)
	assert.Contains(t, r.err, "runstate exec: vet: skipped: complete since seq")
	assert.Contains(t, r.err, "its evidence holds")
}

// A changed input, value or -after stage redoes the stage and says why.
func TestExecRedoesStaleStageAndSaysWhy(t *testing.T) {
	dir, work := shellRun(t, "vet", "test")
	src := filepath.Join(work, "src.go")
	require.NoError(t, os.WriteFile(src, []byte("package x\n"), 0o644))
	count := filepath.Join(work, "count")
	run := func(stage string, flags []string, out string) result {
		r := execCLI(t, dir, stage, flags, counted(count, out, "")...)
		require.Equal(t, 0, r.code, r.err)
		return r
	}
	run("vet", []string{"-in", src}, "v1")
	run("test", []string{"-after", "vet", "-value", "n=1"}, "t1")

	require.NoError(t, os.WriteFile(src, []byte("package y\n"), 0o644))
	r := run("vet", []string{"-in", src}, "v2")
	assert.Contains(t, r.err, "vet: running (attempt 2): input "+src+" changed\n")
	r = run("test", []string{"-after", "vet", "-value", "n=1"}, "t1")
	assert.Contains(t, r.err, "test: running (attempt 2): input after:vet changed", "vet's stdout changed, so test is redone")
	r = run("test", []string{"-after", "vet", "-value", "n=2"}, "t1")
	assert.Contains(t, r.err, "test: running (attempt 3): input n changed")
	assert.Equal(t, 5, lines(t, count))
}

// The command's stdout and stderr are kept as outputs of the stage, under
// exec/, and it sees the run in its environment.
func TestExecKeepsOutputAndSetsEnvironment(t *testing.T) {
	dir, _ := shellRun(t, "a/b")
	abs, err := filepath.Abs(dir)
	require.NoError(t, err)
	r := execCLI(t, dir, "a/b", []string{"-out", filepath.Join(dir, "artifacts", "x.txt")}, "sh", "-c",
		`mkdir -p "$RUNSTATE_DIR/artifacts" && echo x > "$RUNSTATE_DIR/artifacts/x.txt"; echo "$RUNSTATE_DIR $RUNSTATE_STAGE $RUNSTATE_ATTEMPT $RUNSTATE_RUN"; echo oops >&2`)
	require.Equal(t, 0, r.code, r.err)
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, abs+" a/b 1 "+st.ID+"\n", r.out)

	out, err := os.ReadFile(filepath.Join(dir, "exec", "a", "b.stdout"))
	require.NoError(t, err)
	assert.Equal(t, r.out, string(out))
	errOut, err := os.ReadFile(filepath.Join(dir, "exec", "a", "b.stderr"))
	require.NoError(t, err)
	assert.Equal(t, "oops\n", string(errOut))
	var paths []string
	for _, o := range stageStatus(t, dir, "a/b").Outputs {
		paths = append(paths, o.Path)
	}
	assert.Equal(t, []string{"artifacts/x.txt", "exec/a/b.stderr", "exec/a/b.stdout"}, paths)

	// An altered output redoes the stage, and says so.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "exec", "a", "b.stdout"), []byte("edited\n"), 0o644))
	r = execCLI(t, dir, "a/b", nil, "true")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.err, "a/b: running (attempt 2): output exec/a/b.stdout altered")
}

func TestStdPath(t *testing.T) {
	for stage, want := range map[string]string{
		"vet":            "exec/vet.stdout",
		"execute/file-3": "exec/execute/file-3.stdout",
		"a b:c":          "exec/a%20b%3Ac.stdout",
		"../x":           "exec/..%2Fx.stdout",
		"a//b":           "exec/a%2F%2Fb.stdout",
		"é":              "exec/%C3%A9.stdout",
	} {
		assert.Equal(t, want, stdPath(stage, "stdout"), stage)
	}
	// Names whose file name would pass 255 bytes keep a prefix and a hash.
	long := strings.Repeat("a", 256)
	for stage, prefix := range map[string]string{
		long:                            "exec/" + strings.Repeat("a", 255-len(".stdout")-17) + "~",
		long[:255] + "b":                "exec/" + strings.Repeat("a", 255-len(".stdout")-17) + "~",
		strings.Repeat("é", 128):        "exec/" + strings.Repeat("%C3%A9", 38) + "%C3~",
		strings.Repeat(" ", 100) + "/y": "exec/" + strings.Repeat("%20", 79) + "~",
	} {
		p := stdPath(stage, "stdout")
		assert.True(t, strings.HasPrefix(p, prefix), "%s: %s", stage, p)
		for part := range strings.SplitSeq(p, "/") {
			assert.LessOrEqual(t, len(part), 255, p)
		}
	}
	assert.NotEqual(t, stdPath(long, "stdout"), stdPath(long[:255]+"b", "stdout"), "the hash tells them apart")
}

// A stage name of the longest kind the library takes (256 bytes), whose
// escaped file name would be longer than a file system allows, runs: its
// output files have shortened names.
func TestExecLongStageName(t *testing.T) {
	for _, stage := range []string{strings.Repeat("s", 256), strings.Repeat("é", 128)} {
		dir, _ := shellRun(t, "plan")
		r := execCLI(t, dir, stage, nil, "echo", "hi")
		require.Equal(t, 0, r.code, r.err)
		assert.Equal(t, runstate.StateComplete, stageStatus(t, dir, stage).State)
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(stdPath(stage, "stdout"))))
		require.NoError(t, err)
		assert.Equal(t, "hi\n", string(b))
	}
}

// A failing command fails the stage with its exit status; -person-exit and
// -fatal-exit name the statuses that need a person or are final, and the
// next exec says so with its own status.
func TestExecFailureClasses(t *testing.T) {
	dir, _ := shellRun(t, "a", "b", "c")
	r := execCLI(t, dir, "a", nil, "sh", "-c", "exit 3")
	assert.Equal(t, 3, r.code, "exec exits with the command's status")
	assert.Contains(t, r.err, "a: failed (attempt 1): command sh exited 3")
	s := stageStatus(t, dir, "a")
	assert.Equal(t, runstate.StateFailed, s.State)
	assert.Equal(t, runstate.ClassRetryable, s.Class)
	r = execCLI(t, dir, "a", nil, "true")
	assert.Equal(t, 0, r.code, "a retryable failure is retried: %s", r.err)
	assert.Contains(t, r.err, "a: running (attempt 2): attempt 1 failed: command sh exited 3")

	r = execCLI(t, dir, "b", []string{"-person-exit", "4,5"}, "sh", "-c", "exit 4")
	assert.Equal(t, 4, r.code)
	assert.Contains(t, r.err, "it awaits a person now: runstate approve "+dir+" b -by NAME")
	assert.Equal(t, runstate.StateAwaiting, stageStatus(t, dir, "b").State)
	r = execCLI(t, dir, "b", nil, "true")
	assert.Equal(t, exitPerson, r.code, r.err)
	assert.Contains(t, r.err, "runstate approve "+dir+" b -by NAME")

	// Retries exhausted (-max-attempts): the stage awaits a person.
	for i := 1; i <= 2; i++ {
		r = execCLI(t, dir, "d", []string{"-max-attempts", "2"}, "sh", "-c", "exit 1")
		assert.Equal(t, 1, r.code)
		assert.Equal(t, i == 2, strings.Contains(r.err, "it awaits a person now"), "attempt %d: %s", i, r.err)
	}
	assert.Equal(t, exitPerson, execCLI(t, dir, "d", nil, "true").code)

	r = execCLI(t, dir, "c", []string{"-fatal-exit", "9"}, "sh", "-c", "exit 9")
	assert.Equal(t, 9, r.code)
	assert.Contains(t, r.err, "that is final: fix the cause, then runstate invalidate "+dir+" c -reason TEXT")
	assert.Equal(t, runstate.StateFatal, stageStatus(t, dir, "c").State)
	r = execCLI(t, dir, "c", nil, "true")
	assert.Equal(t, exitFatal, r.code, r.err)
}

// A command that is not found, cannot be started, or does not write its
// -out file fails the stage (it is not left running) with exec's own status.
func TestExecCommandNotFoundAndMissingOutput(t *testing.T) {
	dir, _ := shellRun(t, "a", "b")
	r := execCLI(t, dir, "a", nil, "no-such-command-runstate")
	assert.Equal(t, exitNotFound, r.code, r.err)
	assert.Contains(t, r.err, "no-such-command-runstate could not be started")
	assert.Equal(t, runstate.StateFailed, stageStatus(t, dir, "a").State)

	script := filepath.Join(t.TempDir(), "not-executable.sh")
	require.NoError(t, os.WriteFile(script, []byte("echo hi\n"), 0o644))
	r = execCLI(t, dir, "c", nil, script)
	assert.Equal(t, exitCannot, r.code, r.err)
	assert.Contains(t, r.err, "check that it is an executable file")
	assert.Equal(t, runstate.StateFailed, stageStatus(t, dir, "c").State)

	r = execCLI(t, dir, "b", []string{"-out", filepath.Join(dir, "b.txt")}, "true")
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "exited 0 but did not write the output "+filepath.Join(dir, "b.txt"))
	assert.Equal(t, runstate.StateFailed, stageStatus(t, dir, "b").State)
}

// Usage errors exit 2 and record nothing.
func TestExecUsageErrorsRecordNothing(t *testing.T) {
	dir, work := shellRun(t, "a")
	src := filepath.Join(work, "src.go")
	require.NoError(t, os.WriteFile(src, nil, 0o644))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", dir, "a", "-bogus", "--", "true"}, "flag provided but not defined: -bogus"},
		{[]string{"exec", dir, "a", "true"}, "missing -- before the command"},
		{[]string{"exec", dir, "a", "--"}, "no command after --"},
		{[]string{"exec", dir, "a", "-out", filepath.Join(work, "x"), "--", "true"}, "is not inside the run directory"},
		{[]string{"exec", dir, "a", "-out", dir, "--", "true"}, "is not inside the run directory"},
		{[]string{"exec", dir, "a", "-in", filepath.Join(work, "nope"), "--", "true"}, "give a file that exists"},
		{[]string{"exec", dir, "a", "-in", work, "--", "true"}, "is a directory"},
		{[]string{"exec", dir, "a", "-value", "novalue", "--", "true"}, "write it as NAME=VALUE"},
		{[]string{"exec", dir, "a", "-person-exit", "x", "--", "true"}, "is not an exit status"},
		{[]string{"exec", dir, "a", "-valid-for", "-1s", "--", "true"}, "-valid-for must be positive"},
		{[]string{"exec", filepath.Join(work, "none"), "a", "--", "true"}, "holds no run"},
		{[]string{"effect", dir, "k", "echo"}, "missing -- before the command"},
		{[]string{"skip", dir, "a"}, "-reason TEXT is required"},
		{[]string{"await", dir, "a"}, "-reason TEXT is required"},
		{[]string{"plan", filepath.Join(work, "none"), "a"}, "holds no run"},
		// What the library would refuse once the run is open: refused first.
		{[]string{"exec", dir, strings.Repeat("s", 300), "--", "true"}, "must be valid UTF-8 of at most 256 bytes; choose another name"},
		{[]string{"exec", dir, "a\x01b", "--", "true"}, "has a control character; choose another name"},
		{[]string{"exec", dir, "a", "-after", " b", "--", "true"}, "-after: stage name \" b\" starts or ends with a space"},
		{[]string{"exec", dir, "a", "-out", filepath.Join(dir, "logs", "x"), "--", "true"}, "is one of runstate's own files"},
		{[]string{"exec", dir, "a", "-out", filepath.Join(dir, "Manifest.json"), "--", "true"}, "is one of runstate's own files"},
		{[]string{"exec", dir, "a", "-out", filepath.Join(dir, "exec", "a.stderr"), "--", "true"}, "is where exec keeps the command's output"},
		{[]string{"exec", dir, "a", "-out", filepath.Join(dir, "MANIFE~1.JSO"), "--", "true"}, "is one of runstate's own files"},
		{[]string{"exec", dir, "a", "-out", filepath.Join(dir, "manifest.json."), "--", "true"}, "is one of runstate's own files"},
		{[]string{"exec", dir, "a", "-out", filepath.Join(dir, "out", "NUL.txt"), "--", "true"}, "is a device name on Windows"},
		{[]string{"await", dir, "a\nb", "-reason", "r"}, "has a control character"},
		{[]string{"await", dir, "a", "-reason", "r", "-out", filepath.Join(dir, "logs")}, "is one of runstate's own files"},
		{[]string{"skip", dir, "a\tb", "-reason", "r"}, "has a control character"},
		{[]string{"plan", dir, "a", "b\x7f"}, "has a control character"},
		{[]string{"plan", dir, "a", "b", "a"}, "stage a is named twice"},
		{[]string{"effect", dir, "k\x1b[2J", "--", "true"}, "has a control character; choose another key"},
		{[]string{"effect", dir, strings.Repeat("k", 5000), "--", "true"}, "more than 4096; choose another key"},
	} {
		before := tree(t, work)
		r := runCLI(t, tc.args...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.err)
		first, _, _ := strings.Cut(r.err, "\n")
		assert.Contains(t, first, tc.want, "%v", tc.args)
		assert.Equal(t, before, tree(t, work), "%v wrote to the run", tc.args)
	}
	// effect checks its command before it records an intent.
	before := tree(t, work)
	r := runCLI(t, "effect", dir, "k", "--", "no-such-command-runstate")
	assert.Equal(t, exitNotFound, r.code, r.err)
	assert.Contains(t, r.err, "install it or fix PATH (nothing was recorded)")
	assert.Equal(t, before, tree(t, work))
}

// A stage that a live session runs is busy for a second exec.
func TestExecBusy(t *testing.T) {
	dir, work := shellRun(t, "slow")
	started := filepath.Join(work, "started")
	first := startCLI(t, "exec", dir, "slow", "--", "sh", "-c", `touch "$0"; sleep 30`, started)
	waitFile(t, started)
	r := execCLI(t, dir, "slow", nil, "true")
	assert.Equal(t, exitBusy, r.code, r.err)
	assert.Contains(t, r.err, "is running in another session")
	ls := runCLI(t, "ls", work)
	assert.Equal(t, 0, ls.code, ls.err)
	assert.Regexp(t, `run\s+shell pipeline\s+0/1\s+running\s`, ls.out)
	first.stop(t)
	ls = runCLI(t, "ls", work)
	assert.Regexp(t, `run\s+shell pipeline\s+0/1\s+stopped\s+slow interrupted: attempt 1's session is gone`, ls.out)
}

func TestPlanSkipAwait(t *testing.T) {
	dir, work := shellRun(t, "a", "b")
	r := runCLI(t, "plan", dir, "a", "b")
	require.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "plan unchanged: a, b")
	r = runCLI(t, "plan", dir, "a", "b", "review")
	require.Equal(t, 0, r.code, r.err)
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "review"}, st.Plan)

	r = runCLI(t, "skip", dir, "b", "-reason", "docs only")
	require.Equal(t, 0, r.code, r.err)
	assert.Equal(t, runstate.StateSkipped, stageStatus(t, dir, "b").State)
	count := filepath.Join(work, "count")
	r = execCLI(t, dir, "b", nil, counted(count, "", "")...)
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.err, "b: skipped: the stage was skipped (docs only)")
	assert.Equal(t, 0, lines(t, count))

	require.Equal(t, 0, execCLI(t, dir, "a", nil, "echo", "diff").code)
	await := []string{"await", dir, "review", "-reason", "read the diff", "-after", "a"}
	r = runCLI(t, await...)
	assert.Equal(t, exitPerson, r.code, r.err)
	assert.Contains(t, r.err, "review awaits a person: read the diff; clear it with: runstate approve "+dir+" review -by NAME")
	r = runCLI(t, await...)
	assert.Equal(t, exitPerson, r.code, "still awaiting: %s", r.err)
	require.Equal(t, 0, runCLI(t, "approve", dir, "review", "-by", "alice").code)
	r = runCLI(t, await...)
	assert.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.err, "review: approved")

	// A redone -after stage with other outputs asks for the review again.
	require.Equal(t, 0, runCLI(t, "invalidate", dir, "a", "-reason", "redo").code)
	require.Equal(t, 0, execCLI(t, dir, "a", nil, "echo", "another diff").code)
	r = runCLI(t, await...)
	assert.Equal(t, exitPerson, r.code, r.err)
}

func TestHelpPipelineCommands(t *testing.T) {
	r := runCLI(t, "help")
	for _, name := range []string{"exec", "effect", "plan", "skip", "await", "ls"} {
		assert.Contains(t, r.out, "  "+name+" ")
		h := runCLI(t, "help", name)
		assert.Equal(t, 0, h.code)
		assert.Contains(t, h.out, "usage: runstate "+name)
	}
	h := runCLI(t, "exec", "-h")
	assert.Equal(t, 0, h.code)
	assert.Contains(t, h.out, "-person-exit")
}

func receiptOf(t *testing.T, dir, key string) json.RawMessage {
	t.Helper()
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	for _, e := range st.Effects {
		if e.Key == key {
			return e.Receipt
		}
	}
	return nil
}

// bg is the command running in the background.
type bg struct {
	cmd       *exec.Cmd
	out, errb *syncBuffer
	done      chan struct{}
	code      int
}

// startCLI starts the command in the background; stop kills it.
func startCLI(t *testing.T, args ...string) *bg {
	t.Helper()
	b := &bg{cmd: exec.Command(bin, args...), out: &syncBuffer{}, errb: &syncBuffer{}, done: make(chan struct{})}
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.errb
	require.NoError(t, b.cmd.Start())
	go func() {
		b.cmd.Wait()
		b.code = b.cmd.ProcessState.ExitCode()
		close(b.done)
	}()
	t.Cleanup(func() { b.stop(t) })
	return b
}

func (b *bg) stop(t *testing.T) {
	select {
	case <-b.done:
		return
	default:
	}
	b.cmd.Process.Kill()
	<-b.done
}

// wait waits for the command to end by itself.
func (b *bg) wait(t *testing.T) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%v did not end within 30s; stderr: %s", b.cmd.Args, b.errb.String())
	}
}

// waitFile waits until the file at path exists.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within 30s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// -request creates the run; an -after stage that is not done is refused
// before the command runs (exit 125), and a different -request is refused.
func TestExecRequestAndNotReady(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the commands these tests run are sh scripts")
	}
	work := t.TempDir()
	dir := filepath.Join(work, "run")
	count := filepath.Join(work, "count")
	r := execCLI(t, dir, "a", []string{"-request", "made by exec"}, counted(count, "", "")...)
	require.Equal(t, 0, r.code, r.err)
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, "made by exec", st.Request)

	r = execCLI(t, dir, "b", []string{"-after", "nothing"}, counted(count, "", "")...)
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "nothing")
	r = execCLI(t, dir, "b", []string{"-request", "another request"}, counted(count, "", "")...)
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "mismatch")
	assert.Equal(t, 1, lines(t, count), "only the first command ran")
}

// A command that exits 0 whose stage cannot be recorded complete (here
// the ledger was damaged meanwhile; for a run in PostgreSQL, a server
// that stayed down past the session's lease) exits 125 saying that the
// command ran, that the stage is not complete, and that the next exec
// runs the command again.
func TestExecWhoseCompleteFailsSaysTheStageIsNotComplete(t *testing.T) {
	dir, _ := shellRun(t, "build")
	r := runCLI(t, "exec", dir, "build", "--", "sh", "-c", `printf '{"seq":99}\n' >> "$RUNSTATE_DIR/logs/ledger.jsonl"`)
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "runstate: command sh exited 0, but the stage could not be recorded complete, so it is not (the next exec runs the command again): ")
	assert.Equal(t, 1, strings.Count(r.err, "record has no ev"), "the cause, said once (not again for the Fail and the Close it also made fail):\n%s", r.err)
}

// A stage whose name Windows takes for a device (aux, CON, nul.txt,
// com1) runs: its output files' names escape the name's first byte, as
// the library refuses a device name as an output on every system. exec
// refused such a stage with exit 125, saying to remove a link.
func TestExecStageNamedLikeAWindowsDevice(t *testing.T) {
	for stage, want := range map[string]string{
		"aux":     "exec/%61ux.stdout",
		"CON":     "exec/%43ON.stdout",
		"nul.txt": "exec/%6Eul.txt.stdout",
		"x/com1":  "exec/x/%63om1.stdout",
		"lpt1/y":  "exec/%6Cpt1/y.stdout",
		"console": "exec/console.stdout",
		"com10":   "exec/com10.stdout",
	} {
		assert.Equal(t, want, stdPath(stage, "stdout"), stage)
	}
	dir, _ := shellRun(t, "aux", "CON", "nul.txt", "x/com1")
	for _, stage := range []string{"aux", "CON", "nul.txt", "x/com1"} {
		r := execCLI(t, dir, stage, nil, "echo", "hi")
		require.Equal(t, exitOK, r.code, "%s: %s", stage, r.err)
		assert.Equal(t, runstate.StateComplete, stageStatus(t, dir, stage).State)
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(stdPath(stage, "stdout"))))
		require.NoError(t, err)
		assert.Equal(t, "hi\n", string(b))
	}
}

// An -out that names a directory is refused before the command runs, with
// nothing recorded: the attempt could only fail after its work (an output
// is a file), and exec said so after running it.
func TestExecOutThatIsADirectoryIsRefusedFirst(t *testing.T) {
	dir, work := shellRun(t, "build")
	count := filepath.Join(work, "count")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "out"), 0o755))
	r := execCLI(t, dir, "build", []string{"-out", filepath.Join(dir, "out")}, counted(count, "", "")...)
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "output out is a directory, and an output is a file")
	assert.Equal(t, 0, lines(t, count), "the command did not run")
	for _, line := range ledgerLines(t, dir) {
		assert.NotContains(t, line, `"stage":"build"`, "nothing recorded of the stage")
	}
}

// No stage's directory under exec/ is another stage's file: stage "a"
// keeps exec/a.stdout, and stage "a.stdout/b" made a directory of that
// name, so whichever ran second could never run (exit 125, advice about
// links or naming a file, which a pipeline cannot act on). Each runs, in
// either order, and keeps its own output. A directory name that differs
// only in case (one file on macOS and Windows) or ends in "." (Windows
// drops it) is escaped too.
func TestExecStageNamesDoNotCollideUnderExec(t *testing.T) {
	for stage, want := range map[string]string{
		"a.stdout/b":   "exec/a%2Estdout/b.stdout",
		"a.stderr/b":   "exec/a%2Estderr/b.stdout",
		"x/A.StdErr/c": "exec/x/A%2EStdErr/c.stdout",
		"a./b":         "exec/a%2E/b.stdout",
		"a../b":        "exec/a.%2E/b.stdout",
		"a.stdout":     "exec/a.stdout.stdout",
		"a.std/b":      "exec/a.std/b.stdout",
	} {
		assert.Equal(t, want, stdPath(stage, "stdout"), stage)
	}
	for _, order := range [][]string{{"a", "a.stdout/b"}, {"a.stdout/b", "a"}, {"x/A", "x/a.STDERR/y"}} {
		dir, _ := shellRun(t, order...)
		for _, stage := range order {
			r := execCLI(t, dir, stage, nil, "sh", "-c", `echo "out of $RUNSTATE_STAGE"; echo "err of $RUNSTATE_STAGE" >&2`)
			require.Equal(t, exitOK, r.code, "%v: %s: %s", order, stage, r.err)
		}
		for _, stage := range order {
			assert.Equal(t, runstate.StateComplete, stageStatus(t, dir, stage).State, "%v: %s", order, stage)
			for stream, want := range map[string]string{"stdout": "out of ", "stderr": "err of "} {
				b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(stdPath(stage, stream))))
				require.NoError(t, err)
				assert.Equal(t, want+stage+"\n", string(b), "%v: %s", order, stage)
			}
			r := execCLI(t, dir, stage, nil, "false")
			assert.Equal(t, exitOK, r.code, "%v: %s is skipped: its outputs hold: %s", order, stage, r.err)
			assert.Contains(t, r.err, stage+": skipped")
		}
	}
}

// A directory where exec keeps a stage's output (left by an older exec,
// which kept stage a.stdout/b's output in exec/a.stdout/) is refused before
// the command runs, with nothing recorded, and the message says what it
// is and what to do: it said to name a file, which the pipeline had not
// named.
func TestExecStdPathThatIsADirectory(t *testing.T) {
	dir, work := shellRun(t, "a")
	count := filepath.Join(work, "count")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "exec", "a.stdout"), 0o755))
	before := len(ledgerLines(t, dir))
	r := execCLI(t, dir, "a", nil, counted(count, "", "")...)
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "runstate: exec/a.stdout, where exec keeps the output of stage a, is a directory (another stage's output, kept there by an older runstate exec): move it away, then run the stage again; nothing recorded")
	assert.Equal(t, 0, lines(t, count), "the command did not run")
	for _, line := range ledgerLines(t, dir)[before:] {
		assert.NotContains(t, line, `"stage":"a"`, "nothing recorded of the stage")
	}
}

// A failure that is not the command's exit status (not found, not
// started, an -out not written) and that used the stage's last retry
// says the stage awaits a person now, and how to clear it, as a non-zero
// exit does: exec said "install it or fix PATH, then run exec again",
// and the next exec exited 122.
func TestExecLastRetryThatCouldNotRunSaysItAwaitsAPerson(t *testing.T) {
	dir, _ := shellRun(t, "a", "b")
	for attempt := 1; attempt <= 3; attempt++ {
		r := execCLI(t, dir, "a", nil, "no-such-command-runstate")
		assert.Equal(t, exitNotFound, r.code, r.err)
		awaits := "runstate exec: a: failed (attempt 3); it awaits a person now: runstate approve " + dir + " a -by NAME"
		if attempt < 3 {
			assert.NotContains(t, r.err, "awaits a person", "attempt %d", attempt)
		} else {
			assert.Contains(t, r.err, awaits)
		}
	}
	r := execCLI(t, dir, "a", nil, "true")
	assert.Equal(t, exitPerson, r.code, "what the message said: %s", r.err)

	r = execCLI(t, dir, "b", []string{"-max-attempts", "1", "-out", filepath.Join(dir, "b.txt")}, "true")
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "runstate exec: b: failed (attempt 1); it awaits a person now: runstate approve "+dir+" b -by NAME")
}

// Two stages that write one -out file redo each other on every exec, and
// the line that says why a stage runs names the other one, within the
// 200 bytes exec shows of a reason.
func TestExecTwoStagesThatWriteOneFile(t *testing.T) {
	dir, _ := shellRun(t, "a", "b")
	report := filepath.Join(dir, "report.txt")
	for _, stage := range []string{"a", "b"} {
		r := execCLI(t, dir, stage, []string{"-out", report}, "sh", "-c", `echo "$RUNSTATE_STAGE" > "$0"`, report)
		require.Equal(t, exitOK, r.code, "%s: %s", stage, r.err)
	}
	b := stageStatus(t, dir, "b")
	r := execCLI(t, dir, "a", []string{"-out", report}, "sh", "-c", `echo "$RUNSTATE_STAGE" > "$0"`, report)
	require.Equal(t, exitOK, r.code, r.err)
	assert.Contains(t, r.err, "runstate exec: a: running (attempt 2): output report.txt altered (")
	assert.Contains(t, r.err, fmt.Sprintf("; stage b records it too (seq %d): two stages writing one file redo each other: give each its own path\n", b.DoneSeq))
}
