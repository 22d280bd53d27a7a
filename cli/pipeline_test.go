package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/flock"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Several identical 'runstate plan' started at once (a pipeline started
// twice, or by two CI jobs) record the plan once, and only the one that
// recorded it says "planned": the others say "plan unchanged". Each
// compared the plan it asked for with the one it read when it opened the
// run, so that one that opened before another recorded the plan said
// "planned" too, having recorded nothing.
func TestConcurrentPlanSaysWhoPlanned(t *testing.T) {
	for round := range 4 {
		dir, _ := shellRun(t, "setup") // another plan: each process below replaces it
		atOnce(t, round, dir, []string{"plan", dir, "fetch", "build", "test"}, []string{`"ev":"plan"`, `"fetch"`},
			"planned 3 stage(s): fetch, build, test (ledger seq ",
			"plan unchanged: fetch, build, test: planned already, nothing recorded (ledger seq ")
	}
}

// The same for skip: of several 'runstate skip' of one stage at once,
// one records it and says so; the others say it is skipped already.
func TestConcurrentSkipSaysWhoSkipped(t *testing.T) {
	for round := range 4 {
		dir, _ := shellRun(t, "deploy")
		atOnce(t, round, dir, []string{"skip", dir, "deploy", "-reason", "docs only"}, []string{`"ev":"skip"`},
			"skipped stage deploy (ledger seq ",
			"stage deploy is skipped already: nothing recorded (ledger seq ")
	}
}

// atOnce runs six processes of the command args on the run in dir at
// once (each waits for the ledger lock, held here, to open its session,
// so that they open together when it is let go), and checks that one
// record was written (a ledger line holding each of rec), that one process's output starts with did
// and the others' with already.
func atOnce(t *testing.T, round int, dir string, args, rec []string, did, already string) {
	t.Helper()
	const procs = 6
	outs := make([]string, procs)
	var wg sync.WaitGroup
	lock := flock.New(filepath.Join(dir, "logs", "ledger.lock"))
	require.NoError(t, lock.Lock())
	for i := range procs {
		wg.Go(func() {
			var out, errb bytes.Buffer
			cmd := exec.Command(bin, args...)
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := cmd.Run(); err != nil {
				outs[i] = "error: " + err.Error() + ": " + errb.String()
				return
			}
			outs[i] = out.String()
		})
	}
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, lock.Unlock())
	wg.Wait()
	dids, alreadies := 0, 0
	for _, out := range outs {
		switch {
		case strings.HasPrefix(out, did):
			dids++
		case strings.HasPrefix(out, already):
			alreadies++
		default:
			t.Errorf("round %d: unexpected output %q", round, out)
		}
	}
	records := 0
	for _, line := range ledgerLines(t, dir) {
		if !slices.ContainsFunc(rec, func(r string) bool { return !strings.Contains(line, r) }) {
			records++
		}
	}
	require.Equal(t, 1, records, "round %d: %s is recorded once", round, rec)
	assert.Equal(t, 1, dids, "round %d: only the process that recorded it says so:\n%s", round, strings.Join(outs, ""))
	assert.Equal(t, procs-1, alreadies, "round %d", round)
}

// An -after that names the stage itself is a usage error of exec and
// await, refused before a session opens: nothing is recorded, as the
// usage errors are. It was refused by Begin, in the library's words
// (After("a")), after the open record.
func TestAfterItselfIsAUsageError(t *testing.T) {
	dir, work := shellRun(t, "a")
	count := filepath.Join(work, "count")
	before := ledgerLines(t, dir)
	for _, args := range [][]string{
		{"exec", dir, "a", "-after", "a", "--", "sh", "-c", `echo x >> "$0"`, count},
		{"await", dir, "a", "-reason", "look", "-after", "a"},
	} {
		r := runCLI(t, args...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", args, r.err)
		assert.Contains(t, r.err, "runstate "+args[0]+": -after a names the stage itself: drop it, or name the stage that a needs\nusage: runstate "+args[0])
	}
	assert.Equal(t, before, ledgerLines(t, dir), "nothing recorded, not even a session")
	assert.Equal(t, 0, lines(t, count), "the command did not run")
}

// plan refuses a stage whose name starts with "-" (given after "--"),
// with nothing recorded: exec and await parse STAGE with their flags, so
// such a stage could never run, and the planned pipeline never end.
func TestPlanRefusesAStageExecCannotName(t *testing.T) {
	dir, _ := shellRun(t, "a")
	before := ledgerLines(t, dir)
	r := runCLI(t, "plan", dir, "a", "--", "-x")
	assert.Equal(t, exitUsage, r.code, r.err)
	assert.Contains(t, r.err, `runstate plan: stage -x starts with "-": exec and await would read it as a flag, so no pipeline could run it; choose another name`)
	assert.Equal(t, before, ledgerLines(t, dir), "nothing recorded")
	r = runCLI(t, "exec", dir, "-x", "--", "true")
	assert.Equal(t, exitUsage, r.code, "exec cannot name it: %s", r.err)
	r = runCLI(t, "plan", dir, "a", "-")
	assert.Equal(t, exitOK, r.code, `"-" alone is a name exec takes: %s`, r.err)
	r = runCLI(t, "exec", dir, "-", "--", "true")
	assert.Equal(t, exitOK, r.code, r.err)
}

// An input given twice (the same -value NAME or -after stage, one file
// as two paths, a -value named like an -in file or like an -after input)
// is a usage error of exec and await, refused before a session opens:
// nothing recorded. Begin refused them, after the open record, in the
// ledger's names (input "after:q" given twice).
func TestInputGivenTwiceIsAUsageError(t *testing.T) {
	dir, work := shellRun(t, "s")
	t.Chdir(work)
	require.NoError(t, os.WriteFile("f1", []byte("x\n"), 0o644))
	before := ledgerLines(t, dir)
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"-value", "a=1", "-value", "a=2"}, "-value a is given twice; give each input once"},
		{[]string{"-after", "q", "-after", "q"}, "-after q is given twice; give each input once"},
		{[]string{"-in", "f1", "-in", "./f1"}, "-in f1 and -in ./f1 are the same file (input f1); give it once"},
		{[]string{"-in", filepath.Join(work, "f1"), "-in", "f1"}, "-in " + filepath.Join(work, "f1") + " and -in f1 are the same file (input f1); give it once"},
		{[]string{"-in", "f1", "-value", "f1=3"}, "-in f1 and -value f1 have the same name (input f1); give the -value another NAME"},
		{[]string{"-value", "after:q=1"}, `-value after:q: a NAME may not start with "after:" (the -after inputs are named so); choose another`},
	} {
		for _, cmd := range [][]string{{"exec", dir, "s"}, {"await", dir, "s", "-reason", "look"}} {
			args := append(append(cmd, c.flags...), "--", "true")
			if cmd[0] == "await" {
				args = args[:len(args)-2]
			}
			r := runCLI(t, args...)
			assert.Equal(t, exitUsage, r.code, "%v: %s", args, r.err)
			assert.Contains(t, r.err, "runstate "+cmd[0]+": "+c.want+"\nusage:", "%v", args)
		}
	}
	assert.Equal(t, before, ledgerLines(t, dir), "nothing recorded, not even a session")
}

// A negative -timeout is a usage error, as a negative -wait is: it waited
// for ever, as 0 does, where a bound was meant (-timeout -5s for 5s).
func TestNegativeTimeoutIsAUsageError(t *testing.T) {
	dir, _ := shellRun(t, "a")
	before := ledgerLines(t, dir)
	for _, args := range [][]string{
		{"exec", dir, "a", "-timeout", "-5s", "--", "true"},
		{"effect", dir, "k", "-timeout", "-5s", "--", "true"},
		{"plan", dir, "a", "b", "-timeout", "-1ns"},
		{"skip", dir, "a", "-reason", "r", "-timeout", "-5s"},
		{"await", dir, "a", "-reason", "r", "-timeout", "-5s"},
		{"invalidate", dir, "a", "-reason", "r", "-timeout", "-5s"},
	} {
		r := runCLI(t, args...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", args, r.err)
		assert.Contains(t, r.err, "runstate "+args[0]+": -timeout must not be negative (0 waits for ever)\nusage:", "%v", args)
	}
	assert.Equal(t, before, ledgerLines(t, dir), "nothing recorded")
}
