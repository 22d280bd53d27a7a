package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// memRunner is a Runner for mem://NAME addresses: each NAME a memory
// store, its working directories marked with a logs/run.json naming the
// address, as pgstore's views mark theirs.
type memRunner struct {
	stores   map[string]*runstatetest.MemStore
	calls    []string // "ADDR WORKDIR REQUEST TIMEOUT" per call
	released int
}

func (m *memRunner) run(ctx context.Context, addr, workDir string, opts *runstate.Options) (*runstate.Run, func(), error) {
	m.calls = append(m.calls, fmt.Sprintf("%s %s %q %s", addr, workDir, opts.Request, opts.LockTimeout))
	name := strings.TrimPrefix(addr, "mem://")
	switch {
	case name == "down":
		return nil, nil, errors.New("mem: the store is down; try again")
	case m.stores[name] == nil && opts.Request == "":
		return nil, nil, fmt.Errorf("%w: %s holds no run: give -request TEXT to create it", runstate.ErrInvalid, addr)
	case m.stores[name] == nil:
		m.stores[name] = runstatetest.NewMemStore()
	}
	r, err := runstate.OpenStoreContext(ctx, m.stores[name].Session(), workDir, opts)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(workDir, runstate.WorkDirFile), []byte(`{"address":"`+addr+`"}`), 0o644); err != nil {
		_ = r.Close()
		return nil, nil, err
	}
	return r, func() { m.released++ }, nil
}

// The pipeline commands open a run kept in a registered store through
// its Runner: -at ADDRESS names it (with the working directory DIR, the
// request and -timeout), DIR's logs/run.json after; the stages' files are
// in DIR; the Runner's release is called once per command, after the Run
// is closed; an ErrInvalid from it is a usage error (exit 2) and another
// error exit 125. What cannot be a working directory is refused before
// the Runner is called.
func TestPipelineCommandsOpenARunOfARegisteredStore(t *testing.T) {
	m := &memRunner{stores: map[string]*runstatetest.MemStore{}}
	o := &Options{Runners: map[string]Runner{"Mem": m.run}}
	run := func(args ...string) result {
		var out, errb bytes.Buffer
		code := Run(args, &out, &errb, o)
		return result{out.String(), errb.String(), code}
	}
	w1, w2 := filepath.Join(t.TempDir(), "w1"), filepath.Join(t.TempDir(), "w2")

	res := run("plan", w1, "-at", "mem://ship", "-request", "ship it", "-timeout", "7s", "build", "review")
	require.Equal(t, 0, res.code, res.err)
	assert.Equal(t, "planned 2 stage(s): build, review (ledger seq 3 in mem://ship)\n", res.out)
	assert.Equal(t, []string{fmt.Sprintf("mem://ship %s %q %s", w1, "ship it", 7*time.Second)}, m.calls)
	assert.Equal(t, 1, m.released)

	res = run("exec", w1, "build", "-out", filepath.Join(w1, "out.txt"), "--", "sh", "-c", `echo built > "$RUNSTATE_DIR/out.txt"`)
	require.Equal(t, 0, res.code, res.err)
	assert.Equal(t, fmt.Sprintf("mem://ship %s %q %s", w1, "", defaultTimeout), m.calls[1], "DIR's logs/run.json names the run")
	assert.FileExists(t, filepath.Join(w1, "exec", "build.stdout"))
	assert.NoFileExists(t, filepath.Join(w1, "logs", "ledger.jsonl"), "the records are in the store")
	assert.Equal(t, 2, m.released)
	st, err := runstate.InspectStore(context.Background(), m.stores["ship"].Session())
	require.NoError(t, err)
	s, _ := st.Stage("build")
	assert.Equal(t, runstate.StateComplete, s.State)
	require.Len(t, s.Outputs, 2+1, "out.txt, exec/build.stdout and exec/build.stderr")

	res = run("await", w2, "review", "-at", "mem://ship", "-reason", "read it")
	assert.Equal(t, exitPerson, res.code, res.err)
	assert.Contains(t, res.err, "runstate approve "+w2+" review -by NAME")
	res = run("skip", w2, "docs", "-reason", "no user-facing change")
	require.Equal(t, 0, res.code, res.err)
	assert.Regexp(t, `^skipped stage docs \(ledger seq \d+ in mem://ship\)\n$`, res.out)
	res = run("effect", w2, "notify", "--", "echo", `{"id":1}`)
	require.Equal(t, 0, res.code, res.err)
	assert.Equal(t, "{\"id\":1}\n", res.out)
	assert.Equal(t, len(m.calls), m.released, "every opened run released")

	// Errors of the Runner: usage (2) for ErrInvalid, 125 for the rest.
	res = run("exec", t.TempDir(), "build", "-at", "mem://missing", "--", "true")
	assert.Equal(t, exitUsage, res.code, res.err)
	assert.Contains(t, res.err, "mem://missing holds no run: give -request TEXT to create it")
	res = run("plan", t.TempDir(), "a", "-at", "mem://down", "-request", "r")
	assert.Equal(t, exitRunstate, res.code, res.err)
	assert.Contains(t, res.err, "mem: the store is down; try again")
	assert.Equal(t, len(m.calls)-2, m.released, "a failed Runner has nothing to release")

	// Refused before the Runner is called.
	calls := len(m.calls)
	res = run("plan", "mem://ship", "a")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "mem://ship is an address, not a directory: plan writes its files in DIR, this machine's working directory of the run; give one (a new directory, say) with -at mem://ship")
	dir := filepath.Join(t.TempDir(), "run")
	require.Equal(t, 0, runCLI(t, "plan", dir, "-request", "a run in files", "a").code)
	res = run("plan", dir, "a", "-at", "mem://ship")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, dir+" is a run directory (its logs/ledger.jsonl holds a run's records), not a working directory for the run at mem://ship")
	res = run("plan", t.TempDir(), "a", "-at", "other://ship")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "-at other://ship: this runstate command keeps no runs at other:// addresses")
	res = run("plan", t.TempDir(), "a", "-at", "user=agent password=hunter2 host=db")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "-at: what was given is not a run address (SCHEME://...)")
	assert.NotContains(t, res.err, "hunter2", "a value that is no URL is not shown")
	damaged := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(damaged, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(damaged, runstate.WorkDirFile), nil, 0o644))
	for _, args := range [][]string{{"plan", damaged, "a"}, {"plan", damaged, "a", "-request", "r"}} {
		res = runCLI(t, args...)
		assert.Equal(t, exitUsage, res.code, args)
		assert.Contains(t, res.err, "has a logs/run.json that names no run address (empty, damaged or not a regular file)", args)
		assert.Contains(t, res.err, "give -at ADDRESS", args)
		assert.Contains(t, res.err, pgCommand, "the directory command says which command takes -at")
		assert.NoFileExists(t, filepath.Join(damaged, "logs", "ledger.jsonl"), "no run in files was started there")
	}
	res = run("status", w1, "-at", "mem://ship")
	assert.Equal(t, exitUsage, res.code, "-at is a pipeline command's flag")
	assert.Equal(t, calls, len(m.calls), "the Runner was not called")

	// The help of a pipeline command shows -at; the directory command
	// refuses both a working directory and -at.
	res = run("help", "exec")
	assert.Contains(t, res.out, "-at ADDRESS")
	res = runCLI(t, "exec", w1, "build", "--", "true")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, w1+" is a working directory of the run at mem://ship, not a run directory: exec works on run directories only")
	pgWork := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(pgWork, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(pgWork, runstate.WorkDirFile), []byte(`{"store":"postgres","address":"postgres://agent@db/agents?run=x"}`), 0o644))
	res = runCLI(t, "exec", pgWork, "build", "--", "true")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "is a working directory of the run at postgres://agent@db/agents?run=x")
	assert.Contains(t, res.err, pgCommand)
	res = runCLI(t, "plan", t.TempDir(), "a", "-at", "postgres://agent@db/agents?run=x")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "-at postgres://agent@db/agents?run=x: this runstate command keeps runs in directories only")
	assert.Contains(t, res.err, pgCommand)
}
