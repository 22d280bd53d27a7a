package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The cases an operator meets on a stuck run, with cat, jq and runstate.

// A ledger that holds no record (emptied beside a run's other files, or a
// run whose creation never finished) is not a run with nothing to show:
// log and export fail as status and verify do, naming the file.
func TestLogAndExportOfALedgerWithoutRecords(t *testing.T) {
	emptied := healthyRun(t)
	require.NoError(t, os.Truncate(ledgerPath(emptied), 0))
	never := filepath.Join(t.TempDir(), "never")
	require.NoError(t, os.MkdirAll(filepath.Join(never, "logs"), 0o755))
	require.NoError(t, os.WriteFile(ledgerPath(never), []byte(`{"seq":1,"at":"20`), 0o644)) // its create record torn

	for dir, want := range map[string]string{emptied: "the ledger is empty", never: "holds no complete record"} {
		require.Equal(t, 1, readCLI(t, dir, "status", dir).code)
		for _, args := range [][]string{{"log", dir}, {"log", "-json", dir}, {"export", dir}} {
			res := readCLI(t, dir, args...)
			assert.Equal(t, 1, res.code, "%q: %s", args, res.err)
			assert.Contains(t, res.err, filepath.Join(dir, "logs", "ledger.jsonl"), "%q", args)
			assert.Contains(t, res.err, want, "%q", args)
			assert.Empty(t, res.out, "%q", args)
			assert.NotContains(t, res.err, "records written before it", "%q", args)
		}
		f := follow(t, dir)
		assert.Equal(t, 1, f.exit(t), "log -follow on %s", dir)
	}
}

// A path that is a file (a ledger's path given for its run directory, an
// exported ledger) is said to be one, as the library says it to a writer,
// not as an error about DIR/logs/ledger.jsonl not being a directory.
func TestAFileIsNotARunDirectory(t *testing.T) {
	dir := healthyRun(t)
	ledger := ledgerPath(dir)
	other := filepath.Join(t.TempDir(), "exported.jsonl")
	require.NoError(t, os.WriteFile(other, []byte("{}\n"), 0o644))
	before := tree(t, dir)
	for _, p := range []string{ledger, other} {
		for _, args := range [][]string{
			{"status", p}, {"status", "-json", p}, {"log", p}, {"log", "-follow", p}, {"verify", p}, {"next", p},
			{"metrics", p}, {"export", p}, {"approve", p, "execute", "-by", "x"}, {"repair", p},
			{"exec", p, "s", "--", "true"}, {"plan", p, "s"}, {"ls", p},
		} {
			res := runCLI(t, args...)
			want := 1
			if args[0] == "exec" || args[0] == "plan" {
				want = 2 // DIR holds no run: a usage error
			}
			assert.Equal(t, want, res.code, "%q: %s", args, res.err)
			if args[0] == "ls" {
				assert.Contains(t, res.err, "runstate ls: "+p+" is a file, not a directory to look for runs under")
				continue
			}
			assert.Contains(t, res.err, p+" is a file, not a run directory: pass a directory", "%q", args)
			assert.NotContains(t, res.err, "not a directory", "%q: the operating system's words", args)
			assert.Empty(t, res.out, "%q", args)
			if p == ledger {
				assert.Contains(t, res.err, "(the run directory of this ledger is "+quoteArg(dir)+")", "%q", args)
			}
		}
	}
	assert.Equal(t, before, tree(t, dir))
}

// deadSessionRun is newRun's run with stage execute begun by a session
// that is gone, as a killed process leaves it.
func deadSessionRun(t *testing.T) (string, *runstate.Run) {
	t.Helper()
	dir, r := newRun(t)
	_, err := r.Begin(context.Background(), "execute", runstate.After("plan"))
	require.NoError(t, err)
	require.NoError(t, r.Close()) // leaves execute running, its session gone
	// A killed process leaves its session's lock file behind, unlocked.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "logs", "sessions", r.Session()+".lock"), nil, 0o600))
	return dir, r
}

// A stage whose session died mid-attempt is not "running": approve says
// it was interrupted, as status does, and writes nothing.
func TestApproveAStageWhoseSessionIsGone(t *testing.T) {
	dir, r := deadSessionRun(t)

	before := tree(t, dir)
	res := runCLI(t, "approve", dir, "execute", "-by", "alice")
	assert.Equal(t, 1, res.code, res.err)
	assert.Contains(t, res.err, "stage execute does not await a person: it is interrupted (attempt 1's session "+short(r.Session())+" is gone)")
	assert.NotContains(t, res.err, "it is running")
	assert.Equal(t, before, tree(t, dir), "a refused approve wrote to the run")
}

// An error of a store's Lister is printed once prefixed, and escaped.
func TestLsStoreErrorIsOneLine(t *testing.T) {
	o := &Options{Lists: map[string]Lister{"mem": func(context.Context, string) ([]Source, func(), error) {
		return nil, nil, errors.New("runstate: mem://x: cannot connect:\n\tdial: \x1b[31mrefused")
	}}}
	var out, errb bytes.Buffer
	code := Run([]string{"ls", "mem://x"}, &out, &errb, o)
	assert.Equal(t, 1, code)
	assert.True(t, strings.HasPrefix(errb.String(), "runstate ls: mem://x: cannot connect:"), errb.String())
	assert.NotContains(t, errb.String(), "\x1b")
}

// next shows the handoff as the ledger has it; a stage running, or an
// effect's intent, in a session that is gone is noted on standard error,
// as status counts it as a blocker. A handoff file that is gone is said to
// be missing.
func TestNextNotesWhatADeadSessionLeft(t *testing.T) {
	dir, r := deadSessionRun(t)

	res := readCLI(t, dir, "next", dir)
	assert.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.out, "execute (running")
	assert.Contains(t, res.err, "runstate: stage execute is not running: attempt 1's session "+short(r.Session())+" is gone; the next session to open the run records it as interrupted (runstate status "+quoteArg(dir)+" lists the blockers)")
	res = readCLI(t, dir, "next", "-json", dir)
	assert.Contains(t, res.err, "stage execute is not running")
	var n nextJSON
	require.NoError(t, json.Unmarshal([]byte(res.out), &n), "stdout stays one JSON value")

	require.NoError(t, os.Remove(filepath.Join(dir, "logs", "next-steps.txt")))
	res = readCLI(t, dir, "next", dir)
	assert.Equal(t, 0, res.code, res.err)
	assert.Contains(t, res.err, "runstate: "+filepath.Join(dir, "logs", "next-steps.txt")+" is missing: showing the handoff rebuilt from the ledger")
	assert.NotContains(t, res.err, "no such file")

	// A session that is alive is at work: no note.
	live := openRun(t, healthyRun(t))
	t.Cleanup(func() { live.Close() })
	_, err := live.Begin(context.Background(), "execute", runstate.After("plan"))
	require.NoError(t, err)
	// The session republishes the handoff once the stage has run a
	// little; wait for that, so that next reads still files.
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(live.Dir(), "logs", "next-steps.txt"))
		return strings.Contains(string(b), "execute (running")
	}, 10*time.Second, time.Millisecond)
	res = readCLI(t, live.Dir(), "next", live.Dir())
	assert.NotContains(t, res.err, "is not running")
}

// A directory under a root that ls cannot look into (another user's, 0700)
// may hold runs: ls says so and exits 1, instead of leaving them out
// silently.
func TestLsSaysWhereItCannotLook(t *testing.T) {
	root := t.TempDir()
	run := filepath.Join(root, "a")
	require.Equal(t, 0, runCLI(t, "plan", run, "-request", "r", "x").code)
	locked := filepath.Join(root, "locked")
	require.NoError(t, os.Mkdir(locked, 0o700))
	old := readDir
	t.Cleanup(func() { readDir = old })
	readDir = func(dir string) ([]os.DirEntry, error) {
		if dir == locked {
			return nil, &fs.PathError{Op: "open", Path: dir, Err: fs.ErrPermission}
		}
		return old(dir)
	}
	var out, errb bytes.Buffer
	code := Run([]string{"ls", root}, &out, &errb, nil)
	assert.Equal(t, 1, code, errb.String())
	assert.Equal(t, "runstate ls: cannot look for runs in "+locked+" (open "+locked+": permission denied): a run there is not listed\n", errb.String())
	assert.Contains(t, out.String(), run)
}
