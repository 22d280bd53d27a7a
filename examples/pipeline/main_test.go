package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
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
