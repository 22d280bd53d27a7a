package pgstore_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeSnippetCompiles builds README.md's Go block, the DB calls a
// newcomer copies, as it stands (through a build overlay, so nothing is
// written into the module): a renamed method or a changed signature
// fails here.
func TestReadmeSnippetCompiles(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)```go\n(db, err := pgstore.Connect.*?)```\n").FindSubmatch(readme)
	require.NotNil(t, m, "README.md has no ```go block that starts with db, err := pgstore.Connect")
	buildSnippet(t, "README.md", string(m[1])+"\t_, _, _, _, _ = run, st, rep, names, ok\n")
}

// TestPackageDocSnippetCompiles builds the package doc's example (doc.go)
// the same way.
func TestPackageDocSnippetCompiles(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var body strings.Builder
	for _, line := range strings.SplitAfter(string(src), "\n") {
		if code, ok := strings.CutPrefix(line, "//\t"); ok {
			body.WriteString("\t" + code)
		} else if body.Len() > 0 {
			break // the first example only
		}
	}
	require.Contains(t, body.String(), "pgstore.Connect(", "doc.go's first example no longer connects")
	buildSnippet(t, "doc.go", body.String()+"\t_, _ = run, st\n")
}

// buildSnippet builds body, the statements of a doc's Go block, in a
// function that has the names they use (ctx, workDir, f) and returns err,
// through a build overlay, so nothing is written into the module.
func buildSnippet(t *testing.T, doc, body string) {
	t.Helper()
	prog := `package main

import (
	"context"
	"os"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore"
)

func main() {}

func snippet(ctx context.Context, workDir string, f *os.File) error {
` + body + `	return err
}

var (
	_ = runstate.Options{}
	_ = pgstore.Connect
	_ = os.Stdout
)
`
	root, err := os.Getwd()
	require.NoError(t, err)
	tmp := t.TempDir()
	src := filepath.Join(tmp, "main.go")
	require.NoError(t, os.WriteFile(src, []byte(prog), 0o644))
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(root, "internal", "readmesnippet", "main.go"): src},
	})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "overlay.json"), overlay, 0o644))
	bin := filepath.Join(tmp, "snippet")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	out, err := exec.Command("go", "build", "-overlay", filepath.Join(tmp, "overlay.json"), "-o", bin, "./internal/readmesnippet").CombinedOutput()
	require.NoError(t, err, "%s's Go block does not compile:\n%s\n%s", doc, out, prog)
}
