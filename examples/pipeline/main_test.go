package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README tells a newcomer to run this example, kill it, and run it
// again. This test does exactly that with the built program.
func buildPipeline(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pipeline")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func runPipeline(t *testing.T, bin, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-dir", dir, "-input", "input/notes.txt"}, args...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

func readTree(t *testing.T, root string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		files[filepath.ToSlash(rel)] = string(b)
		return err
	})
	require.NoError(t, err)
	return files
}

func TestPipelineRunsAndSkipsWhenDone(t *testing.T) {
	bin := buildPipeline(t)
	dir := filepath.Join(t.TempDir(), "run")
	first := runPipeline(t, bin, dir, "-delay", "0s")
	assert.Contains(t, first, "run   report")
	assert.Contains(t, first, "next:     nothing: every planned stage is done")
	second := runPipeline(t, bin, dir, "-delay", "0s")
	assert.Equal(t, 7, strings.Count(second, "already done, evidence holds"), second)
	assert.NotContains(t, second, "run   ")
}

func TestPipelineResumesAfterKill(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Log("Process.Kill on Windows is TerminateProcess, the same as kill -9 here")
	}
	bin := buildPipeline(t)
	want := filepath.Join(t.TempDir(), "want")
	runPipeline(t, bin, want, "-delay", "0s")

	dir := filepath.Join(t.TempDir(), "run")
	// Kill the first child once it has started the second stage (so
	// inspect is done), and the next ones a little later in their run,
	// wherever that lands.
	for i, after := range []time.Duration{0, 150 * time.Millisecond, 250 * time.Millisecond} {
		cmd := exec.Command(bin, "-dir", dir, "-input", "input/notes.txt", "-delay", "100ms")
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		if i == 0 {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() && !strings.HasPrefix(sc.Text(), "run   plan") {
			}
		}
		time.Sleep(after)
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
	}
	last := runPipeline(t, bin, dir, "-delay", "0s")
	assert.Contains(t, last, "skip  inspect", "the killed runs finished inspect: the resumed one must skip it")
	assert.Equal(t, readTree(t, filepath.Join(want, "artifacts")), readTree(t, filepath.Join(dir, "artifacts")))
	ents, err := os.ReadDir(filepath.Join(dir, "logs", "tmp"))
	require.NoError(t, err)
	assert.Empty(t, ents, "no temp files left behind")
}

// The repository's README shows this program killed in the middle of
// execute/finding-2: the handoff it left, and what the next run printed.
// Both must be what the program leaves and prints now.
func TestReadmeKilledPipeline(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	block := func(first string) string {
		var b strings.Builder
		in := false
		for _, line := range strings.SplitAfter(string(readme), "\n") {
			switch {
			case strings.HasPrefix(line, "```"):
				if in && strings.HasPrefix(b.String(), first) {
					return b.String()
				}
				in = !in
				b.Reset()
			case in:
				b.WriteString(line)
			}
		}
		t.Fatalf("README.md: no block starts with %q", first)
		return ""
	}
	handoff, resumed := block("runstate handoff: "), block("skip  execute/finding-1 ")
	const readmeDir = "/tmp/runstate-example-pipeline"
	norm := func(s, dir string) string {
		s = strings.ReplaceAll(s, dir, readmeDir)
		s = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`).ReplaceAllString(s, "UUID")
		return regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`).ReplaceAllString(s, "TIME")
	}

	bin := buildPipeline(t)
	dir := filepath.Join(t.TempDir(), "run")
	cmd := exec.Command(bin, "-dir", dir, "-input", "input/notes.txt", "-delay", "500ms")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "run   execute/finding-2") {
	}
	time.Sleep(250 * time.Millisecond) // in the middle of the stage, which the handoff shows after 50 ms
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	got, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	assert.Equal(t, norm(handoff, readmeDir), norm(string(got), dir), "README.md's handoff of the killed example is not what it leaves now")

	out := runPipeline(t, bin, dir, "-delay", "0s")
	for _, line := range strings.Split(strings.TrimSpace(resumed), "\n") {
		assert.Contains(t, norm(out, dir), norm(line, readmeDir)+"\n", "README.md shows the resumed run print this line")
	}
}
