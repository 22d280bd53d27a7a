//go:build unix

package shell

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readmeBlock returns the first fenced block of the file at path whose
// first line starts with prefix.
func readmeBlock(t *testing.T, path, prefix string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, m := range regexp.MustCompile("(?ms)^```[a-z]*\n(.*?)^```$").FindAllStringSubmatch(string(b), -1) {
		if strings.HasPrefix(m[1], prefix) {
			return m[1]
		}
	}
	t.Fatalf("%s: no block starts with %q", path, prefix)
	return ""
}

// TestReadmeShowsThePipeline: README.md's "whole pipeline" is pipeline.sh's
// lines from its cd on, as they stand.
func TestReadmeShowsThePipeline(t *testing.T) {
	block := readmeBlock(t, "README.md", `cd "$1"`)
	script, err := os.ReadFile("pipeline.sh")
	require.NoError(t, err)
	_, tail, ok := strings.Cut(string(script), "\n"+`cd "$1"`+"\n")
	require.True(t, ok, "pipeline.sh has no line cd \"$1\"")
	lines := func(s string) []string {
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
			if l != "" {
				out = append(out, l)
			}
		}
		return out
	}
	assert.Equal(t, lines(`cd "$1"`+"\n"+tail), lines(block), "README.md's pipeline is not pipeline.sh's")
}

var normTime = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)

// TestReadmeTranscripts runs what the READMEs show: the second run of the
// pipeline prints README.md's transcript, and the pipeline in the
// repository's README.md (its runstate section) runs, then skips every
// stage and sends nothing the second time.
func TestReadmeTranscripts(t *testing.T) {
	e := setup(t)
	work := t.TempDir()

	run, outbox := filepath.Join(work, "gopkg-run"), filepath.Join(work, "outbox")
	e.complete(t, run, outbox)
	block := readmeBlock(t, "README.md", "$ examples/shell/pipeline.sh testdata/gopkg /tmp/gopkg-run /tmp/outbox\n")
	_, want, _ := strings.Cut(block, "\n")
	got := strings.ReplaceAll(e.complete(t, run, outbox), run, "/tmp/gopkg-run")
	assert.Equal(t, normTime.ReplaceAllString(want, "TIME"), normTime.ReplaceAllString(got, "TIME"),
		"README.md's second run is not what the pipeline prints now:\n%s", got)

	// The repository README's pipeline, with its /tmp paths moved into
	// this test's directory; it runs from the repository's root.
	script := readmeBlock(t, "../../README.md", "run=/tmp/gopkg-run;")
	run, outbox = filepath.Join(work, "root-run"), filepath.Join(work, "root-outbox")
	script = strings.NewReplacer("/tmp/gopkg-run", run, "/tmp/outbox", outbox).Replace(script)
	bash := func() string {
		cmd := exec.Command("bash", "-e", "-c", script)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "PATH="+e.path)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "the pipeline in README.md failed:\n%s", out)
		return string(out)
	}
	bash()
	assert.Len(t, outboxLines(t, outbox), 1)
	second := bash()
	assert.Equal(t, 3, strings.Count(second, ": skipped: "), second)
	assert.Contains(t, second, "notify:report: confirmed at seq")
	assert.Len(t, outboxLines(t, outbox), 1)
}
