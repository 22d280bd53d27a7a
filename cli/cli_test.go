package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bin is the runstate command (cmd/runstate, a main over this package),
// built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "runstate-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(tmp, "runstate")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/runstate").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(tmp)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

// result is how one run of the command ended.
type result struct {
	out, err string
	code     int
}

// cli runs the command as a user would and returns what it printed.
func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	return resultOf(t, cmd.Run(), &out, &errb)
}

// resultOf is what a command that ended with err printed, and its exit
// status; an error other than an exit status fails the test.
func resultOf(t *testing.T, err error, out, errb *bytes.Buffer) result {
	t.Helper()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{out.String(), errb.String(), code}
}

// readCLI runs a read command and checks that it changed no file in dir.
func readCLI(t *testing.T, dir string, args ...string) result {
	t.Helper()
	before := tree(t, dir)
	r := runCLI(t, args...)
	assert.Equal(t, before, tree(t, dir), "runstate %s wrote to the run directory", strings.Join(args, " "))
	return r
}

// tree hashes every file under root (by path relative to root).
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		h := sha256.Sum256(b)
		files[filepath.ToSlash(rel)] = hex.EncodeToString(h[:])
		return nil
	})
	require.NoError(t, err)
	return files
}

const request = "add tests for the billing parser"

var plan = []string{"inspect", "plan", "execute", "verify"}

// openRun opens (or creates) the test run in dir.
func openRun(t *testing.T, dir string) *runstate.Run {
	t.Helper()
	r, err := runstate.Open(dir, &runstate.Options{Request: request, Revision: "3f2a1c9",
		Environment: map[string]string{"env": "staging"}, NoSync: true})
	require.NoError(t, err)
	return r
}

// newRun creates a run with inspect and plan complete, still open.
func newRun(t *testing.T) (string, *runstate.Run) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	r := openRun(t, dir)
	ctx := context.Background()
	require.NoError(t, r.Plan(ctx, plan...))
	doStage(t, r, "inspect")
	doStage(t, r, "plan", runstate.After("inspect"))
	return dir, r
}

// doStage runs stage to completion, writing artifacts/<stage>.md.
func doStage(t *testing.T, r *runstate.Run, stage string, inputs ...runstate.Input) {
	t.Helper()
	err := r.Do(context.Background(), stage, func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/"+stage+".md", []byte("output of "+stage+"\n"))
	}, inputs...)
	require.NoError(t, err)
}

// healthyRun is a closed run with two of four stages complete.
func healthyRun(t *testing.T) string {
	dir, r := newRun(t)
	require.NoError(t, r.Close())
	return dir
}

// finishedRun is a closed run with every stage complete.
func finishedRun(t *testing.T) string {
	dir, r := newRun(t)
	doStage(t, r, "execute", runstate.After("plan"))
	doStage(t, r, "verify", runstate.After("execute"))
	require.NoError(t, r.Close())
	return dir
}

// awaitingRun is a closed run whose execute stage awaits a person.
func awaitingRun(t *testing.T) string {
	dir, r := newRun(t)
	err := r.Do(context.Background(), "execute", func(ctx context.Context, st *runstate.Stage) error {
		return runstate.NeedsPerson(errors.New("the diff touches the public API"), "review the API change")
	})
	require.Error(t, err)
	require.NoError(t, r.Close())
	return dir
}

// unconfirmedRun is a closed run with the effect ticket:1 unconfirmed.
func unconfirmedRun(t *testing.T) string {
	dir, r := newRun(t)
	_, err := r.Effect(context.Background(), "ticket:1", runstate.Effect{
		Do: func(ctx context.Context, key string) (json.RawMessage, error) {
			return nil, errors.New("tracker timed out")
		},
	})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	require.NoError(t, r.Close())
	return dir
}

func ledgerPath(dir string) string { return filepath.Join(dir, "logs", "ledger.jsonl") }

// ledgerLines returns the ledger's lines, each with its '\n'.
func ledgerLines(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(ledgerPath(dir))
	require.NoError(t, err)
	lines := strings.SplitAfter(string(b), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// editLine changes line n (1-based) of the ledger in place, keeping it
// valid JSON and its length, and its checksum right, and returns the byte
// offset of line n+1, where the chain breaks.
func editLine(t *testing.T, dir string, n int, old, new string) int64 {
	t.Helper()
	require.Equal(t, len(old), len(new))
	lines := ledgerLines(t, dir)
	require.Contains(t, lines[n-1], old)
	lines[n-1] = strings.Replace(lines[n-1], old, new, 1)
	if i := strings.LastIndex(lines[n-1], `,"crc":"`); i >= 0 {
		sum := crc32.Checksum([]byte(lines[n-1][:i]), crc32.MakeTable(crc32.Castagnoli))
		lines[n-1] = fmt.Sprintf(`%s,"crc":"%08x"}`+"\n", lines[n-1][:i], sum)
	}
	require.NoError(t, os.WriteFile(ledgerPath(dir), []byte(strings.Join(lines, "")), 0o644))
	var off int64
	for _, l := range lines[:n] {
		off += int64(len(l))
	}
	return off
}

// lineOf returns the 1-based number of the first ledger line containing s.
func lineOf(t *testing.T, dir, s string) int {
	t.Helper()
	for i, l := range ledgerLines(t, dir) {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("no ledger line contains %q", s)
	return 0
}

func statusJSONOf(t *testing.T, dir string) statusJSON {
	t.Helper()
	r := readCLI(t, dir, "status", "-json", dir)
	var s statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.out), &s), r.out+r.err)
	return s
}

func TestHelp(t *testing.T) {
	r := runCLI(t, "help")
	assert.Equal(t, 0, r.code)
	for _, c := range commands {
		assert.Contains(t, r.out, "  "+c.name+" ", "help lists %s", c.name)
	}
	for _, c := range commands {
		r := runCLI(t, c.name, "-h")
		assert.Equal(t, 0, r.code, c.name)
		assert.Contains(t, r.out, "usage: runstate "+c.name+" "+c.synopsis, c.name)
		assert.Equal(t, r.out, runCLI(t, "help", c.name).out, c.name)
	}
	assert.Contains(t, runCLI(t, "log", "-h").out, "-follow")
	assert.Contains(t, runCLI(t, "status", "-h").out, "-json")

	r = runCLI(t)
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.err, "usage: runstate COMMAND")
	r = runCLI(t, "help", "nope")
	assert.Equal(t, 2, r.code)
	r = runCLI(t, "nope")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.err, `unknown command "nope"`)
}

func TestUsageErrors(t *testing.T) {
	dir := healthyRun(t)
	before := tree(t, dir)
	for _, args := range [][]string{
		{"status"},
		{"status", dir, dir},
		{"status", "-bogus", dir},
		{"log", dir, "-since", "x"},
		{"log", dir, "-since", "-1"},
		{"metrics"},
		{"approve", dir, "execute"},
		{"approve", dir, "-by", "alice"},
		{"invalidate", dir, "plan"},
		{"resolve", dir, "ticket:1", "-by", "bob"},
		{"resolve", dir, "ticket:1", "-sent", "x", "-not-sent", "-by", "bob"},
		{"resolve", dir, "ticket:1", "-not-sent"},
		{"repair", dir, "-force"},
		{"repair", dir, "-truncate-at", "-3"},
	} {
		r := runCLI(t, args...)
		assert.Equal(t, 2, r.code, "%q: %s", args, r.err)
		assert.Contains(t, r.err, "usage: runstate "+args[0], "%q", args)
		assert.Empty(t, r.out, "%q", args)
	}
	assert.Equal(t, before, tree(t, dir), "a usage error wrote to the run")
}

func TestNotARun(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, args := range [][]string{
		{"status", missing}, {"log", missing}, {"verify", missing}, {"next", missing},
		{"metrics", missing}, {"approve", missing, "s", "-by", "x"}, {"repair", missing},
	} {
		r := runCLI(t, args...)
		assert.Equal(t, 1, r.code, "%q", args)
		assert.Contains(t, r.err, "missing", "%q: the error names the directory", args)
		assert.NoDirExists(t, missing, "%q created the directory", args)
	}
}

func TestStatusHealthy(t *testing.T) {
	dir := healthyRun(t)
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)

	r := readCLI(t, dir, "status", dir)
	assert.Equal(t, 0, r.code, r.err)
	assert.Empty(t, r.err)
	for _, want := range []string{
		"run       " + st.ID, "request   " + request, "revision  3f2a1c9", "env       env=staging",
		fmt.Sprintf("ledger    seq %d", st.Seq), "sessions  none open",
		"progress: 2 of 4 planned stages done (inspect, plan)",
		"next:     execute (not started)", "then:     verify",
		"blockers  none",
	} {
		assert.Contains(t, r.out, want)
	}
	assert.Regexp(t, `(?m)^STAGE\s+STATE\s+ATTEMPTS\s+LAST CHANGE\s+OUTPUTS\s+NOTE$`, r.out)
	assert.Regexp(t, `(?m)^inspect\s+complete\s+1\s+\S+Z seq 5\s+artifacts/inspect.md\s+-$`, r.out)
	assert.Regexp(t, `(?m)^execute\s+pending\s+0\s+-\s+-\s+-$`, r.out)

	// Flags after DIR work too.
	s := statusJSONOf(t, dir)
	assert.False(t, s.Blocked)
	assert.Equal(t, st.ID, s.ID)
	assert.Equal(t, "execute", s.Next)
	assert.Equal(t, 2, s.Done)
	assert.Len(t, s.Stages, 4)
	assert.Empty(t, s.Blockers)
	assert.Contains(t, s.Handoff, fmt.Sprintf("as of ledger seq %d", st.Seq))
	r2 := readCLI(t, dir, "status", dir, "-json")
	assert.Equal(t, 0, r2.code)
	assert.JSONEq(t, readCLI(t, dir, "status", "-json", dir).out, r2.out)
}

func TestStatusFinished(t *testing.T) {
	dir := finishedRun(t)
	r := readCLI(t, dir, "status", dir)
	assert.Equal(t, 0, r.code, r.err)
	assert.Contains(t, r.out, "progress: 4 of 4 planned stages done")
	assert.Contains(t, r.out, "next:     nothing: every planned stage is done")
	assert.Contains(t, r.out, "blockers  none")

	n := readCLI(t, dir, "next", dir)
	assert.Equal(t, 0, n.code)
	assert.Empty(t, n.err, "the file is current: no note")
	file, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	assert.Equal(t, string(file), n.out)

	v := readCLI(t, dir, "verify", dir)
	assert.Equal(t, 0, v.code, v.out)
	assert.Contains(t, v.out, "ok: "+dir)
}

// A stage begun and not ended: running while its session lives, a blocker
// (interrupted) once the session is gone, before any session records it.
func TestStatusMidRun(t *testing.T) {
	dir, r := newRun(t)
	_, err := r.Begin(context.Background(), "execute", runstate.After("plan"))
	require.NoError(t, err)
	// The session republishes the handoff once the stage has run a
	// little (the library's handoffLag); status must not see that as
	// its own write, on a loaded machine too: wait for it first.
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
		return strings.Contains(string(b), "execute (running")
	}, 10*time.Second, time.Millisecond)

	res := readCLI(t, dir, "status", dir)
	assert.Equal(t, 0, res.code, "a live session's running stage blocks nothing: %s", res.out)
	assert.Regexp(t, `(?m)^execute\s+running\s+1\s`, res.out)
	assert.Contains(t, res.out, r.Session()[len(r.Session())-8:]+" (pid ")
	assert.Contains(t, res.out, ", alive)")
	assert.Contains(t, res.out, "blockers  none")

	require.NoError(t, r.Close()) // leaves execute running, its session gone
	// A killed process leaves its session's lock file behind, unlocked.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "sessions", r.Session()+".lock"), nil, 0o600))
	res = readCLI(t, dir, "status", dir)
	assert.Equal(t, 3, res.code, res.out)
	assert.Regexp(t, `(?m)^execute\s+running\s+1\s`, res.out)
	assert.Contains(t, res.out, "blockers  1")
	assert.Contains(t, res.out, "execute (interrupted): attempt 1's session")
	s := statusJSONOf(t, dir)
	assert.True(t, s.Blocked)
	require.Len(t, s.Blockers, 1)
	assert.Equal(t, "interrupted", s.Blockers[0].Kind)
	assert.Equal(t, "execute", s.Blockers[0].Stage)

	// The next session records it; status then reports the library's blocker.
	openRun(t, dir).Close()
	res = readCLI(t, dir, "status", dir)
	assert.Equal(t, 3, res.code)
	assert.Regexp(t, `(?m)^execute\s+interrupted\s+1\s`, res.out)
}

func TestAwaitingAndApprove(t *testing.T) {
	dir := awaitingRun(t)
	res := readCLI(t, dir, "status", dir)
	assert.Equal(t, 3, res.code, res.out)
	assert.Contains(t, res.out, "execute (awaiting): review the API change")
	assert.Contains(t, res.out, "do: runstate approve "+quoteArg(dir)+" execute -by NAME")
	assert.Regexp(t, `(?m)^execute\s+awaiting\s+1\s.*the diff touches the public API$`, res.out)

	// A stage that does not await a person: refused, and nothing written
	// (not even a session's open and close records).
	before := tree(t, dir)
	res = runCLI(t, "approve", "-by", "alice", dir, "plan")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "plan does not await a person: it is complete")
	assert.Equal(t, before, tree(t, dir))

	res = runCLI(t, "approve", dir, "execute", "-by", "alice", "-note", "the API change is intended")
	assert.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.out, "approved stage execute (by alice): recorded at seq ")

	res = readCLI(t, dir, "status", dir)
	assert.Equal(t, 0, res.code, res.out)
	assert.Regexp(t, `(?m)^execute\s+pending\s+1\s.*approved by alice$`, res.out)
	assert.Contains(t, res.out, "revision  3f2a1c9", "an operator's session keeps the run's revision")
	assert.Contains(t, res.out, "env       env=staging")

	log := readCLI(t, dir, "log", dir, "-stage", "execute")
	assert.Regexp(t, `(?m)^\s+\d+  \S+Z  [0-9a-f]{8}  approve\s+execute\s+by alice; note: the API change is intended$`, log.out)
}

func TestUnconfirmedAndResolve(t *testing.T) {
	dir := unconfirmedRun(t)
	res := readCLI(t, dir, "status", dir)
	assert.Equal(t, 3, res.code, res.out)
	assert.Contains(t, res.out, "effect ticket:1 (unconfirmed): Do failed, it may have landed: tracker timed out")
	assert.Contains(t, res.out, "runstate resolve "+quoteArg(dir)+" ticket:1 -sent RECEIPT")

	res = runCLI(t, "resolve", dir, "ticket:nope", "-not-sent", "-by", "bob")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "effect ticket:nope is unknown")

	res = runCLI(t, "resolve", dir, "ticket:1", "-sent", `{"id":"BILL-7"}`, "-by", "bob", "-note", "found it in the tracker")
	assert.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.out, `resolved effect ticket:1 as sent, receipt {"id":"BILL-7"} (by bob)`)
	s := statusJSONOf(t, dir)
	assert.False(t, s.Blocked)
	require.Len(t, s.Effects, 1)
	assert.Equal(t, runstate.EffectConfirmed, s.Effects[0].State)
	assert.JSONEq(t, `{"id":"BILL-7"}`, string(s.Effects[0].Receipt))

	res = runCLI(t, "resolve", dir, "ticket:1", "-not-sent", "-by", "bob")
	assert.Equal(t, 1, res.code, "a confirmed effect is not resolved again")
	assert.Contains(t, res.err, "effect ticket:1 is confirmed, not unconfirmed")

	// -not-sent, and a receipt that is not JSON is recorded as a string.
	dir2 := unconfirmedRun(t)
	res = runCLI(t, "resolve", "-by", "carol", "-not-sent", dir2, "ticket:1")
	assert.Equal(t, 0, res.code, res.err)
	assert.Equal(t, runstate.EffectNotSent, statusJSONOf(t, dir2).Effects[0].State)
	assert.Equal(t, json.RawMessage(`"BILL-7"`), receipt("BILL-7"))
	assert.Equal(t, json.RawMessage(`7`), receipt("7"))
}

func TestInvalidate(t *testing.T) {
	dir := finishedRun(t)
	res := runCLI(t, "invalidate", dir, "plan", "-reason", "the ticket was re-scoped")
	assert.Equal(t, 0, res.code, res.err)
	s := statusJSONOf(t, dir)
	st, ok := s.Stage("plan")
	require.True(t, ok)
	assert.Equal(t, runstate.StatePending, st.State)
	assert.Equal(t, "the ticket was re-scoped", st.Reason)
	assert.Equal(t, "plan", s.Next)
	assert.Equal(t, 1, s.Metrics.Invalidations)

	before := tree(t, dir)
	res = runCLI(t, "invalidate", dir, "nope", "-reason", "x")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "stage nope is unknown")
	assert.Equal(t, before, tree(t, dir))
}

func TestLog(t *testing.T) {
	dir := finishedRun(t)
	lines := ledgerLines(t, dir)

	res := readCLI(t, dir, "log", dir)
	assert.Equal(t, 0, res.code, res.err)
	out := strings.Split(strings.TrimSuffix(res.out, "\n"), "\n")
	require.Len(t, out, len(lines))
	for i, l := range out {
		assert.Regexp(t, fmt.Sprintf(`^\s+%d  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  [0-9a-f]{8}  [a-z]+`, i+1), l)
	}
	assert.Contains(t, out[0], "create")
	assert.Contains(t, out[0], `request "`+request+`"`)
	assert.Regexp(t, `(?m)complete\s+plan#1\s+-> artifacts/plan.md \(sha256:[0-9a-f]{12}, 15 B\)$`, res.out)

	// -json prints the records in the ledger's own bytes, less each
	// line's checksum (the crc field).
	res = readCLI(t, dir, "log", "-json", dir)
	assert.Equal(t, regexp.MustCompile(`,"crc":"[0-9a-f]{8}"\}\n`).ReplaceAllString(strings.Join(lines, ""), "}\n"), res.out)

	res = readCLI(t, dir, "log", dir, "-stage", "plan")
	out = strings.Split(strings.TrimSuffix(res.out, "\n"), "\n")
	require.Len(t, out, 2)
	assert.Contains(t, out[0], "begin")
	assert.Contains(t, out[1], "complete")

	res = readCLI(t, dir, "log", "-since", "4", dir)
	out = strings.Split(strings.TrimSuffix(res.out, "\n"), "\n")
	require.Len(t, out, len(lines)-4)
	assert.Regexp(t, `^\s+5  `, out[0])

	// A torn tail is not shown; a damaged ledger stops with the line.
	appendTorn(t, dir)
	res = readCLI(t, dir, "log", dir)
	assert.Equal(t, 0, res.code, res.err)
	assert.Len(t, strings.Split(strings.TrimSuffix(res.out, "\n"), "\n"), len(lines))
	off := editLine(t, dir, 4, `"stage":"inspect"`, `"stage":"INSPECT"`)
	res = readCLI(t, dir, "log", dir)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, fmt.Sprintf("line 5 (byte %d)", off))
	assert.Len(t, strings.Split(strings.TrimSuffix(res.out, "\n"), "\n"), 4, "the good lines are shown")
}

// appendTorn appends a last line without its '\n', as a writer killed
// mid-append leaves it, and returns it.
func appendTorn(t *testing.T, dir string) string {
	t.Helper()
	torn := `{"seq":999,"at":"2026-01-0`
	f, err := os.OpenFile(ledgerPath(dir), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(torn)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return torn
}

// follower runs 'runstate log -follow' and collects its lines.
type follower struct {
	cmd   *exec.Cmd
	lines chan string
	errb  syncBuffer
}

// syncBuffer is a bytes.Buffer that a process writes while a test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func follow(t *testing.T, args ...string) *follower {
	t.Helper()
	f := &follower{cmd: exec.Command(bin, append([]string{"log", "-follow"}, args...)...), lines: make(chan string, 1000)}
	f.cmd.Stderr = &f.errb
	stdout, err := f.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, f.cmd.Start())
	t.Cleanup(func() { f.cmd.Process.Kill(); f.cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f.lines <- sc.Text()
		}
		close(f.lines)
	}()
	return f
}

// exit waits for the follower to end by itself and returns its exit
// status.
func (f *follower) exit(t *testing.T) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f.cmd.Wait() }()
	select {
	case <-done:
		return f.cmd.ProcessState.ExitCode()
	case <-time.After(10 * time.Second):
		// Killed and waited for here: a second Wait, the Cleanup's,
		// beside this one would wait for ever.
		f.cmd.Process.Kill()
		<-done
		t.Fatalf("log -follow still runs after 10s; stderr: %s", f.errb.String())
		return 0
	}
}

// appendDamage appends text, a damaged line, to the ledger.
func appendDamage(t *testing.T, dir, text string) {
	t.Helper()
	fl, err := os.OpenFile(ledgerPath(dir), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = fl.WriteString(text)
	require.NoError(t, err)
	require.NoError(t, fl.Close())
}

// next waits for the follower's next line.
func (f *follower) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-f.lines:
		require.True(t, ok, "log -follow ended: %s", f.errb.String())
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no line from log -follow within 10s")
		return ""
	}
}

func TestLogFollow(t *testing.T) {
	dir, r := newRun(t)
	n := len(ledgerLines(t, dir))
	f := follow(t, dir)
	for i := 1; i <= n; i++ {
		assert.Regexp(t, fmt.Sprintf(`^\s+%d  `, i), f.next(t))
	}

	// Another process appends: the lines appear.
	doStage(t, r, "execute", runstate.After("plan"))
	assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*begin\s+execute#1`, n+1), f.next(t))
	assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*complete\s+execute#1`, n+2), f.next(t))
	require.NoError(t, r.Close())
	assert.Contains(t, f.next(t), "close")

	// A torn tail is waited on; the next writer cuts it and appends.
	appendTorn(t, dir)
	time.Sleep(3 * pollEvery)
	r = openRun(t, dir)
	assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*open`, n+4), f.next(t))
	require.NoError(t, r.Close())
	assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*close`, n+5), f.next(t))
	assert.Empty(t, f.errb.String())

	// -json and -stage apply to what follows.
	fj := follow(t, "-json", "-stage", "verify", dir)
	r = openRun(t, dir)
	doStage(t, r, "verify", runstate.After("execute"))
	var rec runstate.Record
	require.NoError(t, json.Unmarshal([]byte(fj.next(t)), &rec))
	assert.Equal(t, "begin", rec.Ev)
	assert.Equal(t, "verify", rec.Stage)
	require.NoError(t, json.Unmarshal([]byte(fj.next(t)), &rec))
	assert.Equal(t, "complete", rec.Ev)
	require.NoError(t, r.Close())
}

// A damaged last line that is complete (it ends in '\n': no torn append)
// stops log -follow with the file, the line and what to do (exit 1),
// instead of waiting on it for ever as on a torn tail.
func TestLogFollowStopsOnADamagedLastLine(t *testing.T) {
	for name, bad := range map[string]string{
		"not a record": "{\"garbage\n",
		"not JSON":     "0000\n",
	} {
		t.Run(name, func(t *testing.T) {
			dir := healthyRun(t)
			n := len(ledgerLines(t, dir))
			f := follow(t, dir)
			for range n {
				f.next(t)
			}
			appendDamage(t, dir, bad)
			assert.Equal(t, exitFail, f.exit(t), "log -follow after a damaged last line")
			assert.Contains(t, f.errb.String(), fmt.Sprintf("%s line %d (byte %d): ", ledgerPath(dir), n+1, fileSize(t, ledgerPath(dir))-int64(len(bad))))
			assert.Contains(t, f.errb.String(), "; runstate verify "+dir+" lists every problem")
		})
	}
}

func TestVerify(t *testing.T) {
	dir := healthyRun(t)
	res := readCLI(t, dir, "verify", dir)
	assert.Equal(t, 0, res.code, res.out)
	var v verifyJSON
	res = readCLI(t, dir, "verify", "-json", dir)
	assert.Equal(t, 0, res.code)
	require.NoError(t, json.Unmarshal([]byte(res.out), &v))
	assert.True(t, v.OK)
	assert.Empty(t, v.Problems)
	assert.Equal(t, int64(len(ledgerLines(t, dir))), v.Records)

	// An altered artifact is named.
	art := filepath.Join(dir, "artifacts", "plan.md")
	require.NoError(t, os.WriteFile(art, []byte("edited by hand\n"), 0o644))
	res = readCLI(t, dir, "verify", dir)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.out, "problem: "+art+": ")
	assert.Contains(t, res.out, "FAILED: "+dir+": 1 problem(s)")
	res = readCLI(t, dir, "verify", "-json", dir)
	assert.Equal(t, 1, res.code)
	require.NoError(t, json.Unmarshal([]byte(res.out), &v))
	assert.False(t, v.OK)
	require.Len(t, v.Problems, 1)
	assert.Equal(t, art, v.Problems[0].File)

	// A torn tail, with the line and byte where it starts.
	dir = healthyRun(t)
	size := fileSize(t, ledgerPath(dir))
	appendTorn(t, dir)
	res = readCLI(t, dir, "verify", dir)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.out, fmt.Sprintf("problem: %s line %d (byte %d): torn last line", ledgerPath(dir), len(ledgerLines(t, dir)), size))

	// An edited line breaks the chain at the next one.
	dir = healthyRun(t)
	n := lineOf(t, dir, `"ev":"complete","session"`)
	off := editLine(t, dir, n, `"stage":"inspect"`, `"stage":"INSPECT"`)
	res = readCLI(t, dir, "verify", dir)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.out, fmt.Sprintf("problem: %s line %d (byte %d): prev hash does not match line %d", ledgerPath(dir), n+1, off, n))
	assert.Contains(t, res.out, fmt.Sprintf("cut it from line %d on (line %d may be the edited one), dropping acknowledged records seq %d-", n, n, n))
	assert.Contains(t, res.out, fmt.Sprintf("with: runstate repair -truncate-at %d -force %s (a copy", n, quoteArg(dir)))
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	require.NoError(t, err)
	return fi.Size()
}

func TestRepairTorn(t *testing.T) {
	dir := healthyRun(t)
	good, err := os.ReadFile(ledgerPath(dir))
	require.NoError(t, err)
	torn := appendTorn(t, dir)
	res := runCLI(t, "repair", dir)
	assert.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.out, fmt.Sprintf("cut:     the torn tail, %d bytes, saved to %s.torn-", len(torn), ledgerPath(dir)))
	now, err := os.ReadFile(ledgerPath(dir))
	require.NoError(t, err)
	assert.Equal(t, string(good), string(now))
	saved, err := filepath.Glob(ledgerPath(dir) + ".torn-*")
	require.NoError(t, err)
	require.Len(t, saved, 1)
	b, err := os.ReadFile(saved[0])
	require.NoError(t, err)
	assert.Equal(t, torn, string(b))
	assert.Equal(t, 0, runCLI(t, "verify", dir).code)

	// A healthy run: nothing cut, the projections rebuilt.
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	require.NoError(t, os.Remove(filepath.Join(dir, "logs", "next-steps.txt")))
	assert.Equal(t, 1, runCLI(t, "verify", dir).code)
	var rep runstate.RepairReport
	res = runCLI(t, "repair", "-json", dir)
	assert.Equal(t, 0, res.code, res.err)
	require.NoError(t, json.Unmarshal([]byte(res.out), &rep))
	assert.Empty(t, rep.Damage)
	assert.Len(t, rep.Rebuilt, 2)
	assert.Equal(t, 0, runCLI(t, "verify", dir).code)
}

func TestRepairMidFile(t *testing.T) {
	dir := healthyRun(t)
	n := lineOf(t, dir, `"ev":"begin","session"`)
	off := editLine(t, dir, n, `"stage":"inspect"`, `"stage":"INSPECT"`)
	whole, err := os.ReadFile(ledgerPath(dir))
	require.NoError(t, err)
	before := tree(t, dir)

	res := runCLI(t, "repair", dir)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, fmt.Sprintf("line %d (byte %d)", n+1, off))
	assert.Contains(t, res.err, fmt.Sprintf("-truncate-at %d -force %s (a copy", n, quoteArg(dir)), "the advice drops the edited line too, and says the cut needs -force")
	assert.Contains(t, res.err, fmt.Sprintf("dropping acknowledged records seq %d-", n), "the advice says what the cut drops")
	assert.Contains(t, res.err, "nothing was changed")
	res = runCLI(t, "repair", dir, "-truncate-at", fmt.Sprint(n+2))
	assert.Equal(t, 1, res.code, "a cut after the damage keeps it")
	assert.Contains(t, res.err, "would keep the damage")
	res = runCLI(t, "repair", dir, "-truncate-at", "1")
	assert.Equal(t, 1, res.code)
	assert.Equal(t, before, tree(t, dir), "a refused repair changed files")

	// Cut at the edited line itself: the chain cannot tell which of the two
	// lines was edited, so the operator may drop both.
	res = runCLI(t, "repair", "-truncate-at", fmt.Sprint(n), dir)
	assert.Equal(t, 1, res.code, "the cut drops records manifest.json shows were acknowledged")
	assert.Contains(t, res.err, "would drop acknowledged records")
	assert.Equal(t, before, tree(t, dir), "a refused repair changed files")
	res = runCLI(t, "repair", "-truncate-at", fmt.Sprint(n), "-force", dir)
	assert.Equal(t, 0, res.code, res.err)
	bak, err := filepath.Glob(ledgerPath(dir) + ".bak-*")
	require.NoError(t, err)
	require.Len(t, bak, 1)
	assert.Contains(t, res.out, "backup:  "+bak[0])
	b, err := os.ReadFile(bak[0])
	require.NoError(t, err)
	assert.Equal(t, string(whole), string(b), "the backup holds the whole ledger")
	assert.Len(t, ledgerLines(t, dir), n-1)
	v := runCLI(t, "verify", dir)
	assert.Equal(t, 0, v.code, v.out)
	s := statusJSONOf(t, dir)
	assert.Equal(t, "inspect", s.Next)

	// A healthy ledger is cut only with -force.
	dir = healthyRun(t)
	res = runCLI(t, "repair", dir, "-truncate-at", "4")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "has no damage")
	res = runCLI(t, "repair", dir, "-truncate-at", "4", "-force")
	assert.Equal(t, 0, res.code, res.err)
	assert.Len(t, ledgerLines(t, dir), 3)
	assert.Equal(t, 0, runCLI(t, "verify", dir).code)
}

func TestNextRebuilt(t *testing.T) {
	dir, r := newRun(t)
	p := filepath.Join(dir, "logs", "next-steps.txt")
	old, err := os.ReadFile(p)
	require.NoError(t, err)
	doStage(t, r, "execute", runstate.After("plan"))
	require.NoError(t, r.Close())
	require.NoError(t, os.WriteFile(p, old, 0o644)) // the handoff falls behind
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)

	res := readCLI(t, dir, "next", dir)
	assert.Equal(t, 0, res.code)
	assert.Contains(t, res.err, "does not match the ledger")
	assert.Contains(t, res.out, fmt.Sprintf("as of ledger seq %d", st.Seq))
	assert.Contains(t, res.out, "next:     verify")

	var n nextJSON
	res = readCLI(t, dir, "next", "-json", dir)
	require.NoError(t, json.Unmarshal([]byte(res.out), &n))
	assert.True(t, n.Rebuilt)
	assert.Equal(t, st.Seq, n.Seq)
	assert.Less(t, n.FileSeq, n.Seq)
}

func TestMetrics(t *testing.T) {
	a := finishedRun(t)
	b := healthyRun(t)
	r := openRun(t, b) // resume b: the done stages are skipped
	doStage(t, r, "inspect")
	doStage(t, r, "plan", runstate.After("inspect"))
	require.NoError(t, r.Close())

	res := readCLI(t, a, "metrics", a, b)
	assert.Equal(t, 0, res.code, res.err)
	assert.Regexp(t, `(?m)^runs\s+2$`, res.out)
	assert.Regexp(t, `(?m)^sessions\s+3$`, res.out)
	assert.Regexp(t, `(?m)^resumed sessions\s+1$`, res.out)
	assert.Regexp(t, `(?m)^skipped on resume\s+2\s`, res.out)
	assert.Regexp(t, `(?m)^duplicated work\s+0\s`, res.out)
	assert.Regexp(t, `(?m)^time to handoff\s+\S+\s`, res.out)

	var m metricsJSON
	res = readCLI(t, b, "metrics", "-json", a, b)
	require.NoError(t, json.Unmarshal([]byte(res.out), &m))
	require.Len(t, m.Runs, 2)
	assert.Equal(t, a, m.Runs[0].Dir)
	assert.Equal(t, 1, m.Runs[0].Metrics.Sessions)
	assert.Equal(t, 2, m.Runs[1].Metrics.Sessions)
	assert.Equal(t, 3, m.Total.Sessions)
	assert.Equal(t, 2, m.Total.SkippedOnResume)
	assert.Equal(t, m.Runs[1].Metrics.TimeToFirstRecord, m.Total.TimeToFirstRecord)

	// One run named twice (here a path spelt two ways) counts once.
	res = readCLI(t, b, "metrics", "-json", a, b, b+string(filepath.Separator)+".")
	assert.Equal(t, 0, res.code, res.err)
	m = metricsJSON{}
	require.NoError(t, json.Unmarshal([]byte(res.out), &m))
	require.Len(t, m.Runs, 2)
	assert.Equal(t, 3, m.Total.Sessions)
	assert.Contains(t, res.err, "is run "+m.Runs[1].ID+" at "+b+", which "+b+" named already: counted once")

	// A link to a run directory is that run.
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(b, link))
	res = readCLI(t, b, "metrics", "-json", b, link)
	assert.Equal(t, 0, res.code, res.err)
	m = metricsJSON{}
	require.NoError(t, json.Unmarshal([]byte(res.out), &m))
	require.Len(t, m.Runs, 1, "counted once: %s", res.err)

	// A copy of a run directory has the run's id, and is another run.
	cp := filepath.Join(t.TempDir(), "copy")
	require.NoError(t, os.CopyFS(cp, os.DirFS(b)))
	res = readCLI(t, b, "metrics", "-json", b, cp)
	assert.Equal(t, 0, res.code, res.err)
	m = metricsJSON{}
	require.NoError(t, json.Unmarshal([]byte(res.out), &m))
	require.Len(t, m.Runs, 2, "the copy counts")
	assert.Equal(t, m.Runs[0].ID, m.Runs[1].ID)
	assert.Equal(t, 4, m.Total.Sessions)
	assert.NotContains(t, res.err, "counted once")

	res = runCLI(t, "metrics", a, filepath.Join(t.TempDir(), "nope"))
	assert.Equal(t, 1, res.code)
	assert.Empty(t, res.out)
	assert.Contains(t, res.err, "nope")
}

// Every read command, on every kind of run, writes nothing.
func TestReadCommandsWriteNothing(t *testing.T) {
	runs := map[string]string{
		"healthy": healthyRun(t), "finished": finishedRun(t),
		"awaiting": awaitingRun(t), "unconfirmed": unconfirmedRun(t),
	}
	torn := healthyRun(t)
	appendTorn(t, torn)
	runs["torn"] = torn
	edited := healthyRun(t)
	editLine(t, edited, 4, `"stage":"inspect"`, `"stage":"INSPECT"`)
	runs["edited"] = edited
	altered := healthyRun(t)
	require.NoError(t, os.WriteFile(filepath.Join(altered, "artifacts", "plan.md"), []byte("x"), 0o644))
	runs["altered"] = altered
	behind := healthyRun(t)
	require.NoError(t, os.Remove(filepath.Join(behind, "manifest.json")))
	runs["no manifest"] = behind

	for name, dir := range runs {
		for _, args := range [][]string{
			{"status", dir}, {"status", "-json", dir}, {"log", dir}, {"log", "-json", dir},
			{"verify", dir}, {"verify", "-json", dir}, {"next", dir}, {"next", "-json", dir},
			{"metrics", dir}, {"metrics", "-json", dir},
		} {
			res := readCLI(t, dir, args...)
			assert.Contains(t, []int{0, 1, 3}, res.code, "%s: %q: %s", name, args, res.err)
		}
	}
	// The damaged ones fail where they must.
	assert.Equal(t, 1, runCLI(t, "verify", torn).code)
	assert.Equal(t, 1, runCLI(t, "verify", edited).code)
	assert.Equal(t, 1, runCLI(t, "log", edited).code)
	assert.Equal(t, 1, runCLI(t, "verify", altered).code)
	assert.Equal(t, 1, runCLI(t, "verify", behind).code)
	assert.Equal(t, 0, runCLI(t, "status", behind).code, "status reads a run without its manifest")
}

// parseInterleaved takes flags anywhere among the arguments.
func TestParseInterleaved(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  []string
		by   string
	}{
		{[]string{"DIR", "S", "-by", "x"}, []string{"DIR", "S"}, "x"},
		{[]string{"-by", "x", "DIR", "S"}, []string{"DIR", "S"}, "x"},
		{[]string{"DIR", "-by=x", "S"}, []string{"DIR", "S"}, "x"},
		{[]string{"-by", "x", "--", "-DIR", "-S"}, []string{"-DIR", "-S"}, "x"},
	} {
		fs := newFlagSet()
		by := fs.String("by", "", "")
		pos, err := parseInterleaved(fs, tc.args)
		require.NoError(t, err)
		assert.Equal(t, tc.pos, pos, "%q", tc.args)
		assert.Equal(t, tc.by, *by, "%q", tc.args)
	}
	_, err := parseInterleaved(newFlagSet(), []string{"DIR", "-nope"})
	assert.Error(t, err)
}

func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}
