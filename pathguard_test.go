package runstate_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

// symlink makes a symbolic link, or ends the test where this system does
// not let the test make one (Windows without the privilege).
func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.Symlink(target, name); err != nil {
		if runtime.GOOS == "windows" {
			t.Skipf("cannot make symbolic links here: %v", err)
		}
		require.NoError(t, err)
	}
}

// TestOutputNeverLandsOnOwnFilesThroughLink: a symbolic link inside the
// run that leads to logs/ (or to the run directory itself) does not let
// WriteFile or Output reach runstate's own files, although it stays inside
// the run; the session goes on writing its ledger; a link to an ordinary
// directory of the run still works.
func TestOutputNeverLandsOnOwnFilesThroughLink(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "artifacts", "real"), 0o755))
	symlink(t, filepath.Join("..", "logs"), filepath.Join(dir, "artifacts", "cache"))
	symlink(t, "..", filepath.Join(dir, "artifacts", "top"))
	symlink(t, "real", filepath.Join(dir, "artifacts", "alias"))
	symlink(t, filepath.Join("..", "cache"), filepath.Join(dir, "artifacts", "real", "hop"))
	ledgerBefore, err := os.Stat(ledgerPath(dir))
	require.NoError(t, err)
	manifestBefore, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)

	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	for _, p := range []string{
		"artifacts/cache/ledger.jsonl",
		"artifacts/cache/next-steps.txt",
		"artifacts/cache/sessions/x.lock",
		"artifacts/cache/new/dir/x",
		"artifacts/top/manifest.json",
		"artifacts/top/Manifest.JSON",
		"artifacts/top/logs/ledger.jsonl",
		"artifacts/real/hop/ledger.jsonl",
		"artifacts/alias/hop/ledger.jsonl",
	} {
		err := st.WriteFile(p, []byte("not a ledger\n"))
		require.Error(t, err, "WriteFile(%s)", p)
		assert.ErrorIs(t, err, runstate.ErrInvalid, "WriteFile(%s)", p)
		assert.Contains(t, err.Error(), p)
		assert.Contains(t, err.Error(), "runstate's own files", "WriteFile(%s)", p)
		assert.ErrorIs(t, st.Output(p), runstate.ErrInvalid, "Output(%s)", p)
	}
	assert.NoDirExists(t, filepath.Join(dir, "logs", "new"), "no directory made through the link")

	// A link to runstate's files made after Output is refused at Complete.
	require.NoError(t, st.Output("artifacts/later/ledger.jsonl"))
	symlink(t, filepath.Join("..", "logs"), filepath.Join(dir, "artifacts", "later"))
	err = st.Complete()
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "artifacts/later/ledger.jsonl")
	require.NoError(t, st.Fail(err))
	st, err = r.Begin(ctx, "s")
	require.NoError(t, err)

	// The ledger is the file the session has open, the manifest as it was.
	ledgerAfter, err := os.Stat(ledgerPath(dir))
	require.NoError(t, err)
	assert.True(t, os.SameFile(ledgerBefore, ledgerAfter), "the ledger was not replaced")
	manifestAfter, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)
	assert.Equal(t, manifestBefore, manifestAfter)

	// A link to an ordinary directory of the run is followed.
	require.NoError(t, st.WriteFile("artifacts/alias/out.txt", []byte("ok")))
	require.NoError(t, st.Complete())
	data, err := os.ReadFile(filepath.Join(dir, "artifacts", "real", "out.txt"))
	require.NoError(t, err)
	assert.Equal(t, "ok", string(data))
	require.Len(t, events(checkLedger(t, dir), "complete", "s"), 1, "the session goes on acknowledging into the ledger")
}

// TestOutputOwnFileNamesInAnySpelling: an output may not name runstate's
// own files in any spelling a case-insensitive file system (macOS,
// Windows) reads as theirs, nor a Windows device name; names that only
// look alike are fine.
func TestOutputOwnFileNamesInAnySpelling(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	for _, p := range []string{
		"LOGS/ledger.jsonl",
		"Logs/next-steps.txt",
		"logs./ledger.jsonl",
		"logs /x",
		"logs::$INDEX_ALLOCATION/x",
		"Manifest.JSON",
		"MANIFEST.json",
		"manifest.json.",
		"manifest.json ",
		"manifest.json::$DATA",
		"MANIFE~1.JSO",
		"NUL",
		"nul.txt",
		"artifacts/con",
		"artifacts/Aux.json",
		"COM1",
		"lpt9.log",
		"artifacts/CONOUT$",
	} {
		err := st.WriteFile(p, []byte("x"))
		assert.ErrorIs(t, err, runstate.ErrInvalid, "WriteFile(%q)", p)
		if err != nil {
			assert.Contains(t, err.Error(), "output "+p, "WriteFile(%q) names the output", p)
		}
		assert.ErrorIs(t, st.Output(p), runstate.ErrInvalid, "Output(%q)", p)
	}
	for _, p := range []string{"logsbook/x", "catalogs/x", "artifacts/logs/x", "manifest.json.bak",
		"artifacts/manifest.json", "console.txt", "com10", "nul-results.txt", "lpt.txt"} {
		require.NoError(t, st.WriteFile(p, []byte("x")), "WriteFile(%q)", p)
	}
	require.NoError(t, st.Complete())
	checkLedger(t, dir)
}

// TestOwnFilesAreNotFollowedOutOfTheRun: when logs/, logs/ledger.jsonl,
// logs/tmp or another of runstate's own files is a symbolic link (here,
// out of the run), Open and Repair
// refuse the run and name the link; the file outside is neither appended
// to nor cut.
func TestOwnFilesAreNotFollowedOutOfTheRun(t *testing.T) {
	for _, rel := range []string{"logs", "logs/ledger.jsonl", "logs/tmp", "logs/ledger.wal", "logs/ledger.lock",
		"logs/sessions", "logs/handoff", "logs/next-steps.txt", "manifest.json"} {
		t.Run(rel, func(t *testing.T) {
			dir := buildRun(t)
			// A torn last line: Repair would cut it, Open move it aside.
			f, err := os.OpenFile(ledgerPath(dir), os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteString(`{"seq":13,"at":"2026-`)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			own := filepath.Join(dir, filepath.FromSlash(rel))
			if rel == "logs/ledger.wal" {
				require.NoError(t, os.WriteFile(own, make([]byte, 4096), 0o644))
			}
			outside := filepath.Join(t.TempDir(), "elsewhere")
			require.NoError(t, os.Rename(own, outside))
			symlink(t, outside, own)
			before := fileStates(t, filepath.Dir(outside))

			_, err = runstate.Open(dir, testOptions())
			require.Error(t, err, "Open")
			assert.ErrorIs(t, err, runstate.ErrInvalid)
			assert.Contains(t, err.Error(), own)
			assert.Contains(t, err.Error(), "symbolic link")

			_, err = runstate.Repair(dir, nil)
			require.Error(t, err, "Repair")
			assert.Contains(t, err.Error(), own)
			_, err = runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: 5, Force: true})
			require.Error(t, err, "Repair -truncate-at")
			assert.Contains(t, err.Error(), own)

			assert.Equal(t, before, fileStates(t, filepath.Dir(outside)), "nothing outside the run changed")
		})
	}
}

// TestOutputPathWithNULRefused: a NUL byte in an output path is refused at
// once, saying so.
func TestOutputPathWithNULRefused(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRun(t)
	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	for _, call := range []func(string) error{
		func(p string) error { return st.WriteFile(p, []byte("x")) },
		st.Output,
	} {
		err := call("artifacts/a\x00b.txt")
		require.Error(t, err)
		assert.ErrorIs(t, err, runstate.ErrInvalid)
		assert.Contains(t, err.Error(), "NUL byte")
	}
	_, err = r.Begin(ctx, "t", runstate.File("in\x00put"))
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "NUL byte")
}

// TestValidForEvidenceFromTheFutureExpires: a stage whose done time is
// after the clock's now (the clock was ahead when it completed: a VM
// snapshot, an NTP step back) has no proven age, so ValidFor evidence is
// expired, with a reason that says why, instead of staying valid until
// the clock catches up.
func TestValidForEvidenceFromTheFutureExpires(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "fetch", writeStage("artifacts/prices.json", "{}"), runstate.ValidFor(time.Hour)))
	require.NoError(t, r.Close())

	// Its complete record carries a time a day ahead.
	ahead := time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339Nano)
	at := regexp.MustCompile(`"at":"[^"]*"`)
	require.NoError(t, editLines(ledgerPath(dir), func(lines [][]byte) []byte {
		for i, l := range lines {
			if bytes.Contains(l, []byte(`"ev":"complete"`)) {
				lines[i] = at.ReplaceAll(l, []byte(`"at":"`+ahead+`"`))
			}
		}
		return rechain(lines)
	}))
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json"))) // replay the ledger

	r = openRun(t, dir, testOptions())
	st, err := r.Begin(ctx, "fetch", runstate.ValidFor(time.Hour))
	require.NoError(t, err, "evidence from the future is not valid")
	require.NoError(t, st.Complete())
	inv := events(checkLedger(t, dir), "invalidate", "fetch")
	require.Len(t, inv, 1)
	assert.Contains(t, inv[0].Reason, "evidence expired")
	assert.Contains(t, inv[0].Reason, "after this clock's now")

	// Evidence done now is valid again.
	_, err = r.Begin(ctx, "fetch", runstate.ValidFor(time.Hour))
	assert.ErrorIs(t, err, runstate.ErrDone)
}

// TestFileInputDirectoryRefused: a File input that is a directory is
// refused at Begin, saying what it is (the unix tests cover FIFOs and
// devices).
func TestFileInputDirectoryRefused(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	in := t.TempDir()
	before := readLedgerBytes(t, dir)
	_, err := r.Begin(ctx, "s", runstate.File(in))
	require.Error(t, err)
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), in)
	assert.Contains(t, err.Error(), "a directory, not a regular file")
	assert.Equal(t, before, readLedgerBytes(t, dir), "nothing recorded")
}

// TestWorkDirOwnFilesAreNotFollowed: a run in another store (here in
// memory) whose working directory has logs or logs/tmp as a symbolic
// link out of it is refused by OpenStore, naming the link, before the
// session records anything and before anything is made outside.
func TestWorkDirOwnFilesAreNotFollowed(t *testing.T) {
	for _, rel := range []string{"logs", "logs/tmp"} {
		t.Run(rel, func(t *testing.T) {
			dir := t.TempDir()
			own := filepath.Join(dir, filepath.FromSlash(rel))
			require.NoError(t, os.MkdirAll(filepath.Dir(own), 0o755))
			outside := filepath.Join(t.TempDir(), "elsewhere")
			require.NoError(t, os.Mkdir(outside, 0o755))
			symlink(t, outside, own)
			mem := runstatetest.NewMemStore()

			r, err := mem.Open(dir, testOptions())
			if r != nil {
				_ = r.Close()
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, runstate.ErrInvalid)
			assert.Contains(t, err.Error(), own)
			assert.Contains(t, err.Error(), "symbolic link")
			entries, err := os.ReadDir(outside)
			require.NoError(t, err)
			assert.Empty(t, entries, "nothing was made outside the working directory")
			assert.Empty(t, mem.Lines(), "nothing was recorded")
		})
	}
}

// TestOwnFilesOfTheWrongKindAreNamed: a file where runstate keeps a
// directory (logs, logs/tmp, logs/sessions, logs/handoff), or a directory
// where it keeps a file (the journal, the lock file, logs/run.json), is
// refused by Open, Repair and OpenStore with an error that names it, says
// what is there and what to do. Open said 'mkdir …: not a directory (is
// the directory writable?)', and of a journal that is a directory that it
// 'has 2 hard links'.
func TestOwnFilesOfTheWrongKindAreNamed(t *testing.T) {
	for _, c := range []struct {
		rel, want string
		dir       bool // make rel a directory, not a file
	}{
		{rel: "logs", want: "is a file, not a directory: runstate keeps the ledger and its other files in it; move it away"},
		{rel: "logs/tmp", want: "is a file, not a directory: runstate keeps the temp files of atomic writes in it; move it away"},
		{rel: "logs/sessions", want: "is a file, not a directory: runstate keeps the open sessions' lock files in it; move it away"},
		{rel: "logs/handoff", want: "is a file, not a directory: runstate keeps the open sessions' copies of next-steps.txt in it; move it away"},
		{rel: "logs/ledger.wal", dir: true, want: "is a directory, not runstate's file: move it away"},
		{rel: "logs/ledger.lock", dir: true, want: "is a directory, not runstate's file: move it away"},
		{rel: "logs/run.json", dir: true, want: "is a directory, not runstate's file: move it away"},
	} {
		t.Run(c.rel, func(t *testing.T) {
			check := func(what string, err error, p string) {
				t.Helper()
				require.Error(t, err, what)
				assert.ErrorIs(t, err, runstate.ErrInvalid, what)
				assert.Contains(t, err.Error(), p+" "+c.want, what)
				assert.NotContains(t, err.Error(), "writable", what)
				assert.NotContains(t, err.Error(), "hard links", what)
			}
			put := func(dir string) string {
				p := filepath.Join(dir, filepath.FromSlash(c.rel))
				require.NoError(t, os.RemoveAll(p))
				require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
				if c.dir {
					require.NoError(t, os.Mkdir(p, 0o755))
				} else {
					require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
				}
				return p
			}

			// A new run.
			dir := t.TempDir()
			p := put(dir)
			_, err := runstate.Open(dir, testOptions())
			check("Open of a new run", err, p)

			// A run that exists, with its journal (fsync on).
			dir = t.TempDir()
			r, err := runstate.Open(dir, &runstate.Options{Request: testRequest})
			require.NoError(t, err)
			require.NoError(t, r.Do(context.Background(), "a", writeStage("artifacts/a", "a")))
			require.NoError(t, r.Close())
			if c.rel == "logs" {
				return // the ledger goes with logs/: covered above
			}
			before := readLedgerBytes(t, dir)
			p = put(dir)
			_, err = runstate.Open(dir, &runstate.Options{Request: testRequest})
			check("Open of a run", err, p)
			_, err = runstate.Repair(dir, nil)
			check("Repair", err, p)
			assert.Equal(t, before, readLedgerBytes(t, dir), "nothing recorded")

			// The working directory of a run kept in another store.
			if c.rel == "logs/tmp" || c.rel == "logs/run.json" {
				work := t.TempDir()
				p := put(work)
				_, err := runstatetest.NewMemStore().Open(work, testOptions())
				check("OpenStore", err, p)
			}
		})
	}
}

// TestReadersDoNotFollowOwnLinks: the readers (Inspect, NextSteps,
// ReadLedger, Verify, the file store's Read, ReadWorkDirFile) do not
// follow a symbolic link at one of runstate's own names, as Open and
// Repair do not (TestOwnFilesAreNotFollowedOutOfTheRun): a run directory
// is not a way to make them read a file elsewhere. Where the file is
// needed (logs/, the ledger, the journal) they fail with the error Open
// gives, naming the link; a linked projection is not read (Inspect
// replays the ledger) and Verify reports it. They read the other run's
// records through the link, and RunElsewhere followed a linked
// logs/run.json to its address.
func TestReadersDoNotFollowOwnLinks(t *testing.T) {
	ctx := context.Background()
	other := buildRun(t) // what the links lead to: a valid run elsewhere
	require.NoError(t, os.WriteFile(filepath.Join(other, "logs", "run.json"), []byte(`{"address":"postgres://elsewhere/db?run=r"}`), 0o644))
	for _, c := range []struct {
		rel    string
		needed bool // the readers fail without it (else Verify reports it)
	}{
		{"logs", true},
		{"logs/ledger.jsonl", true},
		{"logs/ledger.wal", true},
		{"manifest.json", false},
		{"logs/next-steps.txt", false},
		{"logs/run.json", false},
	} {
		t.Run(c.rel, func(t *testing.T) {
			dir := t.TempDir()
			r, err := runstate.Open(dir, &runstate.Options{Request: "another request"}) // with its journal
			require.NoError(t, err)
			require.NoError(t, r.Close())
			own := filepath.Join(dir, filepath.FromSlash(c.rel))
			to := filepath.Join(other, filepath.FromSlash(c.rel))
			if c.rel == "logs/ledger.wal" {
				to = filepath.Join(t.TempDir(), "ledger.wal")
				data, err := os.ReadFile(own)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(to, data, 0o644))
			}
			require.NoError(t, os.RemoveAll(own))
			symlink(t, to, own)
			link := own + " is a symbolic link (to " + strconv.Quote(to) + ")"

			_, err = runstate.Open(dir, testOptions())
			require.ErrorIs(t, err, runstate.ErrInvalid, "Open")
			assert.Contains(t, err.Error(), link, "Open")

			st, ierr := runstate.Inspect(dir)
			_, nerr := runstate.NextSteps(dir)
			lerr := runstate.ReadLedger(dir, func(*runstate.Record) error { return nil })
			_, serr := runstate.NewFileStore(dir, nil).Read(ctx, runstate.Position{}, func([]byte) error { return nil })
			rep, verr := runstate.Verify(dir)
			if c.needed {
				for name, err := range map[string]error{"Inspect": ierr, "NextSteps": nerr, "ReadLedger": lerr, "Read": serr} {
					if assert.ErrorIs(t, err, runstate.ErrInvalid, name) {
						assert.Contains(t, err.Error(), link, name)
					}
				}
				if verr == nil {
					require.NotEmpty(t, rep.Problems, "Verify")
					verr = fmt.Errorf("%v", rep.Problems)
				}
				assert.Contains(t, verr.Error(), link, "Verify")
				return
			}
			for name, err := range map[string]error{"Inspect": ierr, "NextSteps": nerr, "ReadLedger": lerr, "Read": serr, "Verify": verr} {
				require.NoError(t, err, name)
			}
			assert.Equal(t, "another request", st.Request, "this run's records, not the other's")
			if c.rel == "logs/run.json" {
				_, err := runstate.ReadWorkDirFile(dir)
				require.ErrorIs(t, err, runstate.ErrInvalid, "ReadWorkDirFile")
				assert.Contains(t, err.Error(), link)
				addr, ok := runstate.RunElsewhere(dir)
				assert.False(t, ok, "RunElsewhere followed the link to %q", addr)
				return
			}
			if assert.Len(t, rep.Problems, 1, "Verify") {
				assert.Equal(t, own, rep.Problems[0].File)
				assert.Contains(t, rep.Problems[0].What, link)
				assert.Contains(t, rep.Problems[0].Fix, "move it away")
			}
		})
	}
}
