package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Text a stage (or whoever wrote the record) chose: cursor moves, a line
// erase and a "blockers: none" that would hide the real blockers, hidden
// text, a bidi override, a C1 control, a window-title sequence.
const (
	hostileErr    = "boom\x1b[1A\x1b[2K\nblockers: none\x1b[8m"
	hostileReason = "\x1b[8mreview \u202eexe.txt\u202c"
	hostileStage  = "evil\u202etxt.exe"
	hostileKey    = "mail\u202e1"
	hostileBy     = "ann\x1b]0;pwned\x07"
	hostileSkip   = "not needed\r\u009b2J"
)

// hostileRun is a closed run whose texts hold terminal controls: a request
// and a revision, an environment, stage names, an output path, an error,
// reasons, an approval's by and note, an effect key and its error.
func hostileRun(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "run\x1b[2J")
	ctx := context.Background()
	r, err := runstate.Open(dir, &runstate.Options{Request: "fix\x1b[2J billing\u202e", Revision: "rev\x1b[31m",
		Environment: map[string]string{"k\u202e": "v\x1b[8m"}, NoSync: true})
	require.NoError(t, err)
	require.NoError(t, r.Plan(ctx, "inspect", "review", hostileStage, "verify", "deploy"))
	require.NoError(t, r.Do(ctx, "inspect", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/out\x1b[1A\u202e.txt", []byte("x"))
	}))
	err = r.Do(ctx, "review", func(ctx context.Context, st *runstate.Stage) error {
		return st.Await("look\x1b[5m")
	})
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
	require.NoError(t, r.Approve(ctx, "review", hostileBy, "ok\x1b[0m\nfine"))
	err = r.Do(ctx, hostileStage, func(ctx context.Context, st *runstate.Stage) error {
		return runstate.NeedsPerson(errors.New(hostileErr), hostileReason)
	})
	require.ErrorContains(t, err, "boom")
	require.NoError(t, r.Skip(ctx, "verify", hostileSkip))
	_, err = r.Effect(ctx, hostileKey, runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, errors.New("timeout\x1b[31m")
	}})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	require.NoError(t, r.Close())
	return dir
}

// assertInert checks that text holds nothing a terminal acts on: valid
// UTF-8, no control character but the newlines between lines, no bidi
// control or other unprintable rune.
func assertInert(t *testing.T, what, text string) {
	t.Helper()
	assert.True(t, utf8.ValidString(text), "%s is valid UTF-8", what)
	for i, c := range text {
		if c == '\n' {
			continue
		}
		if c < 0x20 || c == 0x7f || (c >= 0x80 && !strconv.IsPrint(c)) {
			line := strings.Count(text[:i], "\n") + 1
			assert.Failf(t, "a control reaches the terminal", "%s line %d holds %U: %q", what, line, c, strings.Split(text, "\n")[line-1])
			return
		}
	}
}

func TestTextFromStagesNeverDrivesTheTerminal(t *testing.T) {
	dir := hostileRun(t)

	file, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	assertInert(t, "logs/next-steps.txt", string(file))
	assert.Contains(t, string(file), `evil\u202etxt.exe awaiting: \x1b[8mreview \u202eexe.txt\u202c`, "the reason is shown, escaped")
	assert.Contains(t, string(file), "blockers: 2\n", "the real blockers stay visible")

	outputs := map[string]result{}
	for _, args := range [][]string{
		{"status", dir}, {"log", dir}, {"next", dir}, {"metrics", dir}, {"verify", dir},
		{"log", "-stage", hostileStage, dir}, {"approve", dir, "nope\x1b[2J", "-by", "x"},
	} {
		res := runCLI(t, args...)
		name := "runstate " + strings.Join(args[:len(args)-1], " ")
		if _, seen := outputs[args[0]]; !seen {
			outputs[args[0]] = res
		}
		assertInert(t, name+" (stdout)", res.out)
		assertInert(t, name+" (stderr)", res.err)
	}
	status := outputs["status"].out
	assert.Equal(t, exitBlocked, outputs["status"].code)
	assert.Contains(t, status, "blockers  2\n")
	assert.Contains(t, status, `boom\x1b[1A\x1b[2K blockers: none\x1b[8m`, "the error is shown, escaped")
	assert.Contains(t, status, `evil\u202etxt.exe (awaiting): \x1b[8mreview \u202eexe.txt\u202c`)
	assert.Contains(t, status, `do: runstate approve $'`, "a directory with a control is quoted for bash, escaped")
	assert.Contains(t, status, `effect mail\u202e1 (unconfirmed): Do failed, it may have landed: timeout\x1b[31m`)
	log := outputs["log"].out
	assert.Contains(t, log, `by ann\x1b]0;pwned\a; note: ok\x1b[0m fine`)
	assert.Contains(t, log, `not needed \u009b2J`)
	assert.Contains(t, log, `-> artifacts/out\x1b[1A\u202e.txt`)
	assert.Equal(t, string(file), outputs["next"].out, "next prints the file; it is escaped already")

	// The ledger keeps the texts as given, and -json is exact JSON of
	// them, with no control a terminal acts on when it is printed.
	var errs []string
	require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error {
		errs = append(errs, r.Error, r.Reason, r.By)
		return nil
	}))
	assert.Contains(t, errs, hostileErr)
	assert.Contains(t, errs, hostileReason)
	assert.Contains(t, errs, hostileBy)
	assert.Contains(t, errs, hostileSkip)

	res := runCLI(t, "status", "-json", dir)
	assertInert(t, "runstate status -json", res.out)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(res.out), &st))
	s, ok := st.Stage(hostileStage)
	require.True(t, ok)
	assert.Equal(t, hostileErr, s.Error)
	assert.Equal(t, hostileReason, s.Reason)
	assert.Equal(t, string(file), st.Handoff)

	res = runCLI(t, "log", "-json", dir)
	assertInert(t, "runstate log -json", res.out)
	var seen []string
	sc := bufio.NewScanner(strings.NewReader(res.out))
	for sc.Scan() {
		var r runstate.Record
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), sc.Text())
		seen = append(seen, r.Error, r.Reason, r.By, r.Stage, r.Key)
	}
	for _, want := range []string{hostileErr, hostileReason, hostileBy, hostileSkip, hostileStage, hostileKey} {
		assert.Contains(t, seen, want, "log -json holds the text exactly")
	}

	res = runCLI(t, "next", "-json", dir)
	assertInert(t, "runstate next -json", res.out)

	// An operator command's own output, and its error, are escaped too.
	assert.Contains(t, outputs["approve"].err, `nope\x1b[2J`)
	res = runCLI(t, "approve", dir, hostileStage, "-by", "x\u202e")
	require.Zero(t, res.code, res.err)
	assertInert(t, "runstate approve", res.out)
	assert.Contains(t, res.out, `\u202e`)
}

// A handoff file that another program (or an older runstate) wrote with
// controls in it is escaped by 'runstate next', not printed as it is.
func TestNextEscapesAForeignHandoff(t *testing.T) {
	dir := healthyRun(t)
	p := filepath.Join(dir, "logs", "next-steps.txt")
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, append(data, "\x1b[1A\x1b[2Kall clear\u202e \xff\n"...), 0o644))
	res := readCLI(t, dir, "next", dir)
	assert.Zero(t, res.code)
	assertInert(t, "runstate next", res.out)
	assert.Contains(t, res.out, `\x1b[1A\x1b[2Kall clear\u202e \xff`)
}

// An effect's intent whose session is gone is in doubt: status says that
// the next Effect call asks the receiving system, and what a person does
// only without a Check; after the next Open, the library says the same.
func TestStatusSaysTheNextRunChecksAnInDoubtEffect(t *testing.T) {
	dir, r := newRun(t)
	_, err := r.Effect(context.Background(), "ticket:1", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		require.NoError(t, r.Close()) // the session ends before the confirmation
		return json.RawMessage(`"sent"`), nil
	}})
	require.Error(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "sessions", r.Session()+".lock"), nil, 0o600))

	check := func(what string) {
		t.Helper()
		res := readCLI(t, dir, "status", dir)
		assert.Equal(t, exitBlocked, res.code, "%s: %s", what, res.out)
		assert.Contains(t, res.out, "effect ticket:1 (in-doubt): ", what)
		assert.Contains(t, res.out, "do: run the pipeline again: its next Effect call for this key asks the receiving system (Check) and settles it; "+
			"only if it has no Check, or Check fails, must a person check the receiving system, then: runstate resolve "+quoteArg(dir)+" ticket:1 -sent RECEIPT", what)
		assert.NotContains(t, res.out, "(unconfirmed)", what)
		s := statusJSONOf(t, dir)
		require.Len(t, s.Blockers, 1, what)
		assert.Equal(t, "in-doubt", s.Blockers[0].Kind, what)
		m := readCLI(t, dir, "metrics", dir)
		assert.Regexp(t, `(?m)^effects unconfirmed\s+0\s`, m.out, what)
	}
	check("before the next Open")
	openRun(t, dir).Close()
	check("after the next Open")
	m := readCLI(t, dir, "metrics", dir)
	assert.Regexp(t, `(?m)^effects in doubt\s+1\s`, m.out)

	// A person may still settle it before the next run, as the do: line says.
	res := runCLI(t, "resolve", dir, "ticket:1", "-not-sent", "-by", "bob")
	require.Zero(t, res.code, res.err)
	assert.False(t, statusJSONOf(t, dir).Blocked)
}

// TestStatusJSONActionsNameTheRunDirectory: status -json's blocker
// Actions, the library's and the command's own (an intent whose session
// is gone), name the run directory by its absolute path, quoted for a
// shell, not the placeholder DIR; the text output names it as typed,
// also when typed as a relative path.
func TestStatusJSONActionsNameTheRunDirectory(t *testing.T) {
	dir, r := newRun(t)
	require.Error(t, r.Do(context.Background(), "execute", func(ctx context.Context, st *runstate.Stage) error {
		return runstate.NeedsPerson(errors.New("the diff touches the public API"), "review the API change")
	}))
	_, err := r.Effect(context.Background(), "ticket:1", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		require.NoError(t, r.Close()) // the session ends before the confirmation
		return json.RawMessage(`"sent"`), nil
	}})
	require.Error(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "sessions", r.Session()+".lock"), nil, 0o600))

	s := statusJSONOf(t, dir)
	assert.Equal(t, dir, s.Address)
	actions := map[string]string{}
	for _, b := range s.Blockers {
		actions[b.Kind] = b.Action
		assert.NotContains(t, b.Action, " DIR ", b.Kind)
	}
	assert.Equal(t, "runstate approve "+quoteArg(dir)+" execute -by NAME -note TEXT", actions["awaiting"])
	assert.Contains(t, actions["in-doubt"], "then: runstate resolve "+quoteArg(dir)+" ticket:1 -sent RECEIPT -by NAME (or -not-sent)")

	rel := relToWD(t, dir)
	res := readCLI(t, dir, "status", rel)
	assert.Equal(t, exitBlocked, res.code, res.err)
	assert.Contains(t, res.out, "do: runstate approve "+quoteArg(rel)+" execute -by NAME -note TEXT", "as typed")
	assert.Contains(t, res.out, "then: runstate resolve "+quoteArg(rel)+" ticket:1 -sent RECEIPT", "as typed")
}

// relToWD is dir relative to the test's working directory: the run as a
// user in that directory may type it.
func relToWD(t *testing.T, dir string) string {
	t.Helper()
	wd, err := os.Getwd()
	require.NoError(t, err)
	rel, err := filepath.Rel(wd, dir)
	require.NoError(t, err)
	return rel
}

// TestVerifyFixesNameTheRunAsTyped: verify's fixes (a torn tail, an
// edited line, a projection that is gone) name the run as the user typed
// it, a relative path too, not the absolute path the library's fixes
// name it by; -json keeps the library's fixes and says that address.
func TestVerifyFixesNameTheRunAsTyped(t *testing.T) {
	dir := healthyRun(t)
	appendTorn(t, dir)
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	rel := relToWD(t, dir)

	res := readCLI(t, dir, "verify", rel)
	assert.Equal(t, exitFail, res.code, res.err)
	assert.Contains(t, res.out, "    fix: runstate repair "+quoteArg(rel)+" moves it aside", "a torn tail")
	assert.Contains(t, res.out, "    fix: the next Open or runstate repair "+quoteArg(rel)+" rebuilds it", "manifest.json")
	for _, line := range strings.Split(res.out, "\n") {
		if strings.HasPrefix(line, "    fix: ") {
			assert.NotContains(t, line, " "+quoteArg(dir), "the absolute path")
		}
	}
	var v verifyJSON
	res = readCLI(t, dir, "verify", "-json", rel)
	require.NoError(t, json.Unmarshal([]byte(res.out), &v), res.out)
	assert.Equal(t, dir, v.Address)
	require.NotEmpty(t, v.Problems)
	assert.Contains(t, v.Problems[0].Fix, "runstate repair "+quoteArg(dir)+" moves it aside")

	dir = healthyRun(t)
	n := lineOf(t, dir, `"ev":"complete","session"`)
	editLine(t, dir, n, `"stage":"inspect"`, `"stage":"INSPECT"`)
	rel = relToWD(t, dir)
	res = readCLI(t, dir, "verify", rel)
	assert.Equal(t, exitFail, res.code, res.err)
	assert.Contains(t, res.out, "with: runstate repair -truncate-at "+strconv.Itoa(n)+" -force "+quoteArg(rel)+" (a copy", "an edited line")
}

// TestAsTypedNamesEveryArgumentThatIsTheRun: the run's address is named
// as typed wherever it is an argument, also before a comma or at the end
// of the text (Verify's "the next Open, or runstate repair DIR, copies
// them"), and nowhere it is only the start of a longer path.
func TestAsTypedNamesEveryArgumentThatIsTheRun(t *testing.T) {
	for text, want := range map[string]string{
		"the next Open, or runstate repair /r/a, copies them": "the next Open, or runstate repair run, copies them",
		"runstate repair /r/a moves it aside":                 "runstate repair run moves it aside",
		"then: runstate status /r/a":                          "then: runstate status run",
		"runstate verify /r/a; or (runstate log /r/a)":        "runstate verify run; or (runstate log run)",
		"runstate repair /r/ab moves it aside":                "runstate repair /r/ab moves it aside",
		"runstate repair /r/a/x":                              "runstate repair /r/a/x",
	} {
		assert.Equal(t, want, asTyped(text, "/r/a", "run"), text)
	}
}

// The pipeline commands and ls print names, reasons and directories that
// may come from a record or a file name: escaped, as every read command
// escapes them.
func TestPipelineCommandsAndLsNeverDriveTheTerminal(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the commands these tests run are sh scripts")
	}
	dir := hostileRun(t)
	stage2 := "new\u202etxt.exe"
	key2 := "mail\u202e2"
	for _, tc := range []struct {
		args []string
		want string // in stderr or stdout, escaped
	}{
		{[]string{"exec", dir, "verify", "--", "true"}, `skipped: the stage was skipped (not needed \u009b2J)`},
		{[]string{"exec", dir, stage2, "--", "true"}, `runstate exec: new\u202etxt.exe: running (attempt 1)`},
		{[]string{"exec", dir, stage2, "--", "true"}, `runstate exec: new\u202etxt.exe: skipped`},
		{[]string{"exec", dir, "x\u202e", "--", "sh", "-c", "exit 3"}, `runstate exec: x\u202e: failed (attempt 1)`},
		{[]string{"await", dir, "rev\u202e", "-reason", "look\u202e"}, `rev\u202e awaits a person: look\u202e`},
		{[]string{"skip", dir, "s\u202e", "-reason", "r"}, `skipped stage s\u202e (ledger seq`},
		{[]string{"plan", dir, "inspect", "review", hostileStage, "p\u202e"}, `evil\u202etxt.exe, p\u202e (ledger seq`},
		{[]string{"effect", dir, key2, "--", "printf", "\"sent\u202e\""}, `"sent\u202e"`},
		{[]string{"effect", dir, key2, "--", "true"}, `runstate effect: mail\u202e2: confirmed at seq`},
		{[]string{"ls", filepath.Dir(dir)}, `run\x1b[2J`},
	} {
		res := runCLI(t, tc.args...)
		name := "runstate " + strings.Join(tc.args[:2], " ")
		assertInert(t, name+" (stdout)", res.out)
		assertInert(t, name+" (stderr)", res.err)
		assert.Contains(t, res.out+res.err, tc.want, name)
	}
}

// A tab in text a person gave (a reason, here) is printed as a tab in the
// command's messages: it only moves the cursor forward on its line, and
// "read\tthe diff" with a backslash is not what was written. Every other
// control is still escaped.
func TestMessagesKeepTabs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	require.Zero(t, runCLI(t, "plan", dir, "review", "-request", "tabs").code)
	for range 2 { // beginning the review, then finding it awaiting
		res := runCLI(t, "await", dir, "review", "-reason", "read\tthe diff\x1b[8m")
		assert.Equal(t, 122, res.code, res.err)
		assert.Contains(t, res.err, "read\tthe diff\\x1b[8m")
		assert.NotContains(t, res.err, `read\tthe`)
		assertInert(t, "runstate await", strings.ReplaceAll(res.err, "\t", " "))
	}
}
