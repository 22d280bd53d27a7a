package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ls lists every run under the roots, what needs a person first, reads
// only, does not descend into runs or through symbolic links, and exits 3
// when a run is blocked.
func TestLs(t *testing.T) {
	root := t.TempDir()
	mk := func(rel string, stages ...string) string {
		dir := filepath.Join(root, rel)
		r := runCLI(t, append([]string{"plan", dir, "-request", "run " + rel}, stages...)...)
		require.Equal(t, 0, r.code, r.err)
		return dir
	}
	fin := mk("a/finished", "x")
	require.Equal(t, 0, runCLI(t, "skip", fin, "x", "-reason", "nothing to do").code)
	mk("b/stopped", "x", "y")
	awaiting := mk("c/deep/awaiting", "x", "review")
	require.Equal(t, 0, runCLI(t, "skip", awaiting, "x", "-reason", "r").code)
	require.Equal(t, exitPerson, runCLI(t, "await", awaiting, "review", "-reason", "read the diff").code)
	failed := mk("d/failed", "x")
	if runtime.GOOS != "windows" {
		require.Equal(t, 3, execCLI(t, failed, "x", nil, "sh", "-c", "exit 3").code)
	}
	// A run inside a run directory is not looked for, nor one behind a link.
	mk("a/finished/artifacts/inner", "x")
	link := filepath.Join(root, "link")
	if err := os.Symlink(filepath.Join(root, "b"), link); err != nil {
		t.Logf("no symbolic link: %v", err)
	}

	trees := func() (all []map[string]string) {
		for _, d := range []string{"a", "b", "c", "d"} {
			all = append(all, tree(t, filepath.Join(root, d)))
		}
		return all
	}
	before := trees()
	r := runCLI(t, "ls", root)
	assert.Equal(t, before, trees(), "ls wrote to the runs")
	assert.Equal(t, exitBlocked, r.code, r.err)
	rows := strings.Split(strings.TrimSpace(r.out), "\n")
	require.Len(t, rows, 5, r.out)
	assert.Contains(t, rows[0], "FIRST BLOCKER")
	assert.Regexp(t, `^\S*c/deep/awaiting\s+run c/deep/awaiting\s+1/2\s+blocked\s+review awaiting: read the diff\s+\d+s ago$`, rows[1])
	if runtime.GOOS != "windows" {
		assert.Regexp(t, `d/failed .* 0/1\s+failed\s+x failed: command sh exited 3`, rows[2])
	}
	assert.Regexp(t, `b/stopped .* 0/2\s+stopped\s+-`, r.out)
	assert.Regexp(t, `a/finished .* 1/1\s+finished\s+-`, rows[4])

	r = runCLI(t, "ls", "-json", filepath.Join(root, "a"), filepath.Join(root, "b"))
	assert.Equal(t, exitOK, r.code, r.err)
	var runs []lsRun
	require.NoError(t, json.Unmarshal([]byte(r.out), &runs))
	require.Len(t, runs, 2)
	assert.Equal(t, "stopped", runs[0].State)
	assert.Equal(t, "finished", runs[1].State)
	assert.Equal(t, "run a/finished", runs[1].Request)
	assert.Equal(t, 1, runs[1].Done)

	r = runCLI(t, "ls", filepath.Join(root, "nowhere"))
	assert.Equal(t, exitFail, r.code, r.err)
	assert.Contains(t, r.err, "give a directory that exists")

	r = runCLI(t, "ls", "-depth", "1", root)
	assert.Equal(t, exitOK, r.code, r.err)
	assert.Equal(t, 1, strings.Count(r.out, "\n"), "no run within one level: %s", r.out)
}

// ls takes an address a Lister was registered for: its runs are listed
// among the directories' under their names, sorted with them, and
// released after; a Lister's error is a message and exit status 1 (3
// still wins when a run is blocked).
func TestLsListsTheRunsOfARegisteredStore(t *testing.T) {
	awaiting := awaitingRun(t) // blocked
	finished := filepath.Join(t.TempDir(), "fin")
	r := runCLI(t, "plan", finished, "-request", "a finished run", "x")
	require.Equal(t, 0, r.code, r.err)
	require.Equal(t, 0, runCLI(t, "skip", finished, "x", "-reason", "nothing to do").code)
	closed := 0
	o := &Options{Lists: map[string]Lister{"Mem": func(_ context.Context, addr string) ([]Source, func(), error) {
		if addr != "mem://db" {
			return nil, nil, fmt.Errorf("mem: no store at %s: give mem://db", addr)
		}
		return []Source{&renamedDir{dirSource: dirSource{dir: awaiting}, name: "mem://db?run=billing"}}, func() { closed++ }, nil
	}}}
	run := func(args ...string) result {
		var out, errb bytes.Buffer
		code := Run(args, &out, &errb, o)
		return result{out.String(), errb.String(), code}
	}
	res := run("ls", "-json", "mem://db", filepath.Dir(finished))
	assert.Equal(t, exitBlocked, res.code, res.err)
	var runs []lsRun
	require.NoError(t, json.Unmarshal([]byte(res.out), &runs), res.out)
	require.Len(t, runs, 2, res.out)
	assert.Equal(t, "mem://db?run=billing", runs[0].Dir)
	assert.Equal(t, "blocked", runs[0].State)
	assert.False(t, runs[0].LastRecord.IsZero(), "the Source's LastRecord")
	assert.Equal(t, finished, runs[1].Dir)
	assert.Equal(t, "finished", runs[1].State)
	assert.Equal(t, 1, closed, "the Lister's runs released once")

	res = run("ls", "mem://elsewhere", filepath.Dir(finished))
	assert.Equal(t, exitFail, res.code)
	assert.Contains(t, res.err, "runstate ls: mem: no store at mem://elsewhere: give mem://db")
	assert.Contains(t, res.out, finished, "the other roots are still listed")
}

// ls lists a working directory of a run kept elsewhere (its logs/run.json
// names the address) under the directory, in the state elsewhere, with
// the address, and does not descend into it. It does not read the run:
// the file could name any server, and connecting would send it the
// user's password. The same with and without an Opener for the scheme.
func TestLsListsWorkingDirectoriesOfRunsKeptElsewhere(t *testing.T) {
	root := t.TempDir()
	finished := filepath.Join(root, "fin")
	require.Equal(t, 0, runCLI(t, "plan", finished, "-request", "a finished run", "x").code)
	require.Equal(t, 0, runCLI(t, "skip", finished, "x", "-reason", "nothing to do").code)
	work := filepath.Join(root, "machine", "work")
	require.NoError(t, os.MkdirAll(filepath.Join(work, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(work, "logs", "run.json"), []byte(`{"address":"mem://agent:secret@db?run=billing"}`), 0o644))
	// An output directory inside the working directory that looks like a
	// run directory: ls does not descend into a working directory.
	inner := filepath.Join(work, "artifacts", "copy")
	require.NoError(t, os.MkdirAll(filepath.Join(inner, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(inner, "logs", "ledger.jsonl"), nil, 0o644))
	opened := 0
	o := &Options{Sources: map[string]Opener{"mem": func(_ context.Context, addr string) (Source, error) {
		opened++
		return nil, fmt.Errorf("mem: not to be opened: %s", addr)
	}}}
	for _, opts := range []*Options{o, nil} {
		var out, errb bytes.Buffer
		code := Run([]string{"ls", "-json", root}, &out, &errb, opts)
		assert.Equal(t, exitOK, code, errb.String())
		var runs []lsRun
		require.NoError(t, json.Unmarshal(out.Bytes(), &runs), out.String())
		require.Len(t, runs, 2, out.String())
		assert.Equal(t, finished, runs[0].Dir, "finished sorts before elsewhere")
		assert.Equal(t, work, runs[1].Dir)
		assert.Equal(t, "elsewhere", runs[1].State)
		assert.Equal(t, "mem://agent:xxxxx@db?run=billing", runs[1].Address, "the address, without its password")
		assert.Empty(t, runs[1].Error)

		out.Reset()
		code = Run([]string{"ls", root}, &out, &errb, opts)
		assert.Equal(t, exitOK, code, errb.String())
		assert.Contains(t, out.String(), "elsewhere  run kept at mem://agent:xxxxx@db?run=billing")
		assert.NotContains(t, out.String(), "secret")
	}
	assert.Zero(t, opened, "ls did not open the run the working directory names")
}

// An error line's FIRST BLOCKER leaves out what the line shows already,
// so that its 60 characters say what went wrong.
func TestLsReasonLeavesOutWhatTheLineShows(t *testing.T) {
	for _, c := range []struct {
		r    lsRun
		want string
	}{
		{lsRun{Dir: "w", Address: "pg://h?run=a", Error: "runstate: pg://h?run=a: pgstore: cannot connect"}, "pgstore: cannot connect"},
		{lsRun{Dir: "pg://h?run=a", Error: "runstate: pg://h?run=a: pgstore: no run \"a\""}, "pgstore: no run \"a\""},
		{lsRun{Dir: "runs/x", Error: "runstate: runs/x: ledger is corrupt"}, "ledger is corrupt"},
		{lsRun{Dir: "runs/x", Error: "read runs/x/logs/ledger.jsonl: permission denied"}, "read runs/x/logs/ledger.jsonl: permission denied"},
	} {
		assert.Equal(t, c.want, lsReason(c.r), c.r.Error)
	}
}
