//go:build unix

package shell

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// env is the environment the pipeline runs in: the runstate command just
// built first in PATH, and a copy of testdata/gopkg to work on.
type env struct {
	path, src, script string
}

func setup(t *testing.T) env {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	bin := t.TempDir()
	out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "runstate"), "../../cmd/runstate").CombinedOutput()
	require.NoError(t, err, "%s", out)
	src := filepath.Join(t.TempDir(), "gopkg")
	require.NoError(t, os.CopyFS(src, os.DirFS("../../testdata/gopkg")))
	script, err := filepath.Abs("pipeline.sh")
	require.NoError(t, err)
	return env{path: bin + string(os.PathListSeparator) + os.Getenv("PATH"), src: src, script: script}
}

// start starts the pipeline in a process group of its own.
func (e env) start(t *testing.T, run, outbox string, delay string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command("bash", e.script, e.src, run, outbox)
	cmd.Env = append(os.Environ(), "PATH="+e.path, "NOTIFY_DELAY="+delay)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	return cmd, &out
}

// complete runs the pipeline to its end and requires success.
func (e env) complete(t *testing.T, run, outbox string) string {
	t.Helper()
	cmd, out := e.start(t, run, outbox, "0")
	require.NoError(t, cmd.Wait(), "%s", out)
	return out.String()
}

// records reads the ledger's records (nil when there is no run yet).
func records(t *testing.T, run string) []runstate.Record {
	t.Helper()
	var recs []runstate.Record
	err := runstate.ReadLedger(run, func(r *runstate.Record) error {
		recs = append(recs, *r)
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	return recs
}

func has(recs []runstate.Record, ev, stage string) bool {
	for _, r := range recs {
		if r.Ev == ev && (r.Stage == stage || r.Key == stage) {
			return true
		}
	}
	return false
}

// outboxLines reads the notifications sent.
func outboxLines(t *testing.T, outbox string) []string {
	t.Helper()
	f, err := os.Open(outbox)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// The pipeline, SIGKILLed (the whole process group) at several moments and
// started again each time, ends with the outputs of an uninterrupted run;
// no completed stage is redone and the notification is sent once, also
// where the run's path holds a quote.
func TestPipelineSurvivesKills(t *testing.T) {
	e := setup(t)
	// A quote and a space in every path the script quotes: the effect's
	// -check command is one string that sh parses.
	work := filepath.Join(t.TempDir(), "it's a dir")
	require.NoError(t, os.Mkdir(work, 0o755))

	refRun, refOutbox := filepath.Join(work, "ref"), filepath.Join(work, "ref-outbox")
	e.complete(t, refRun, refOutbox)

	run, outbox := filepath.Join(work, "run"), filepath.Join(work, "outbox")
	moments := []struct {
		name string
		at   func() bool
	}{
		{"while vet runs", func() bool { return has(records(t, run), "begin", "vet") }},
		{"while test runs", func() bool { return has(records(t, run), "begin", "test") }},
		{"once test is complete", func() bool { return has(records(t, run), "complete", "test") }},
		// notify.sh waits 2s after it appended the line, before the
		// receipt: the kill lands between the intent and the confirm.
		{"after the notification was sent, before its receipt", func() bool { return len(outboxLines(t, outbox)) > 0 }},
	}
	for _, m := range moments {
		cmd, out := e.start(t, run, outbox, "2")
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		killed := false
		for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline) && !killed; {
			select {
			case err := <-exited:
				t.Fatalf("%s: the pipeline ended before the moment came: %v\n%s", m.name, err, out)
			case <-time.After(5 * time.Millisecond):
			}
			if m.at() {
				require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL))
				killed = true
			}
		}
		require.True(t, killed, "%s: the moment did not come within 45s\n%s", m.name, out)
		<-exited
		t.Logf("killed %s", m.name)
	}
	out := e.complete(t, run, outbox)
	assert.Contains(t, out, "runstate effect: notify:report: the check found that it landed", out)

	// The same outputs as the uninterrupted run.
	for _, p := range []string{"cover.out", "exec/vet.stdout", "exec/vet.stderr", "exec/report.stdout", "exec/report.stderr"} {
		want, err := os.ReadFile(filepath.Join(refRun, p))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(run, p))
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), p)
	}
	// One notification, with the report's last line.
	lines := outboxLines(t, outbox)
	require.Len(t, lines, 1, "the notification was sent %d times", len(lines))
	assert.Contains(t, lines[0], "total:")
	assert.Equal(t, len(outboxLines(t, refOutbox)), 1)

	// No completed stage was redone: one complete record each, and
	// no begin after it.
	recs := records(t, run)
	for _, stage := range []string{"vet", "test", "report"} {
		completes, begunAfter := 0, 0
		for _, r := range recs {
			switch {
			case r.Stage == stage && r.Ev == "complete":
				completes++
			case r.Stage == stage && r.Ev == "begin" && completes > 0:
				begunAfter++
			}
		}
		assert.Equal(t, 1, completes, "stage %s completed %d times", stage, completes)
		assert.Zero(t, begunAfter, "stage %s begun again after it completed", stage)
	}
	st, err := runstate.Inspect(run)
	require.NoError(t, err)
	assert.Zero(t, st.Metrics.DuplicatedWork)
	assert.Zero(t, st.Metrics.EffectsDuplicated)
	assert.GreaterOrEqual(t, st.Metrics.Interrupted, 2, "the kills interrupted stages")
	assert.Equal(t, 0, st.Remaining)

	// Once more: nothing runs, nothing is sent.
	before := len(recs)
	out = e.complete(t, run, outbox)
	assert.Equal(t, 3, strings.Count(out, ": skipped: "), out)
	assert.Len(t, outboxLines(t, outbox), 1)
	for _, r := range records(t, run)[before:] {
		assert.Contains(t, []string{"open", "close"}, r.Ev, "a finished pipeline wrote %s", mustJSON(r))
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
