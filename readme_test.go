package runstate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readmeProgram returns the README's complete program: its first Go block
// that starts with "package main".
func readmeProgram(t *testing.T) []byte {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```\n").FindAllSubmatch(readme, -1) {
		if bytes.HasPrefix(m[1], []byte("package main\n")) {
			return m[1]
		}
	}
	t.Fatal("README.md: no ```go block that starts with 'package main' (the complete program)")
	return nil
}

// funcSources returns the text of each function declared in src, from the
// func keyword to its closing brace (doc comments left out).
func funcSources(t *testing.T, name string, src []byte) (*ast.File, map[string]string) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
	require.NoError(t, err, "%s does not parse", name)
	funcs := map[string]string{}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok {
			funcs[fd.Name.Name] = string(src[fset.Position(fd.Type.Pos()).Offset:fset.Position(fd.End()).Offset])
		}
	}
	return f, funcs
}

// TestReadmeProgramIsTheExample keeps the README's program and the tested
// example (Example_readme, with its // Output:) from drifting apart: every
// function of the program but main is, character for character, the one in
// example_test.go, and the program is gofmt-clean and imports exactly the
// packages it uses.
func TestReadmeProgramIsTheExample(t *testing.T) {
	prog := readmeProgram(t)
	formatted, err := format.Source(prog)
	require.NoError(t, err)
	assert.Equal(t, string(formatted), string(prog), "README.md's program is not gofmt-clean")

	file, funcs := funcSources(t, "README.md", prog)
	exampleSrc, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	_, examples := funcSources(t, "example_test.go", exampleSrc)
	require.Contains(t, funcs, "main", "README.md's program has no main")
	require.Greater(t, len(funcs), 1, "README.md's program has only main: nothing is shared with the example")
	for name, src := range funcs {
		if name == "main" {
			continue
		}
		assert.Equal(t, examples[name], src, "README.md's func %s differs from example_test.go's: change both", name)
	}

	imported := map[string]bool{}
	for _, imp := range file.Imports {
		path := strings.Trim(imp.Path.Value, `"`)
		imported[path[strings.LastIndex(path, "/")+1:]] = true
	}
	used := map[string]bool{}
	ast.Inspect(file, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && imported[id.Name] {
				used[id.Name] = true
			}
		}
		return true
	})
	assert.Equal(t, imported, used, "README.md's program imports a package it does not use")
}

// TestReadmeProgramRuns builds the README's program as it stands (through a
// build overlay, so nothing is written into the module) and runs it twice
// in an empty directory: it must print what the README says it prints.
func TestReadmeProgramRuns(t *testing.T) {
	bin, out, err := buildOverlay(t, "readmeprogram", readmeProgram(t))
	require.NoError(t, err, "README.md's program does not build:\n%s", out)

	work := t.TempDir()
	run := func() string {
		cmd := exec.Command(bin)
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	first, second := run(), run()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, out := range []string{first, second} {
		assert.True(t, strings.Contains(string(readme), out), "README.md does not show what its program prints:\n%s", out)
	}
	assert.Equal(t, "inspect: running\nplan: running\nnotify: sending\ndone: cat logs/next-steps.txt in triage-run\n", first)
	assert.Equal(t, "done: cat logs/next-steps.txt in triage-run\n", second)
}

// TestDoReturningAwaitRecordsAnAwait holds what README.md and the package
// doc promise: a Do whose fn returns st.Await's error (as is, or wrapped)
// records an await, never a failure, and the stage waits for a person.
func TestDoReturningAwaitRecordsAnAwait(t *testing.T) {
	ctx := t.Context()
	for name, wrap := range map[string]func(error) error{
		"as is":   func(err error) error { return err },
		"wrapped": func(err error) error { return fmt.Errorf("review: %w", err) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			r, err := runstate.Open(dir, &runstate.Options{Request: "review"})
			require.NoError(t, err)
			defer r.Close()
			err = r.Do(ctx, "review", func(ctx context.Context, st *runstate.Stage) error {
				return wrap(st.Await("read the diff"))
			})
			require.ErrorIs(t, err, runstate.ErrNeedsPerson)
			var evs []string
			require.NoError(t, runstate.ReadLedger(dir, func(rec *runstate.Record) error {
				if rec.Stage == "review" {
					evs = append(evs, rec.Ev)
				}
				return nil
			}))
			assert.Equal(t, []string{"begin", "await"}, evs)
			s, err := r.Status()
			require.NoError(t, err)
			st, ok := s.Stage("review")
			require.True(t, ok)
			assert.Equal(t, runstate.StateAwaiting, st.State)
			assert.True(t, st.Review, "the stage awaits a review")
			assert.Zero(t, st.Failures, "an await counted as a failure")
		})
	}
}

// TestReadmeCommandsAreCI keeps the README's two commands for a newcomer
// as they are: the first shell block runs the example and the tests, and
// its test command is the one .ci/run runs.
func TestReadmeCommandsAreCI(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)```sh\n(.*?)```\n").FindSubmatch(readme)
	require.NotNil(t, m, "README.md has no ```sh block")
	var cmds []string
	for _, line := range strings.Split(strings.TrimSpace(string(m[1])), "\n") {
		cmd, _, _ := strings.Cut(line, "#")
		cmds = append(cmds, strings.TrimSpace(cmd))
	}
	assert.Equal(t, []string{"go run ./examples/pipeline", "go test -race ./..."}, cmds)
	ci, err := os.ReadFile(filepath.Join(".ci", "run"))
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^go test -race \./\.\.\.$`, string(ci), ".ci/run does not run the README's test command")
}

// TestReadmeOnRecordIsTheExample keeps README.md's OnRecord snippet the
// tested one: its function is, but for comments, ExampleOptions_onRecord's
// progress, and each line its comments say it prints is in that example's
// // Output.
func TestReadmeOnRecordIsTheExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)```go\n(OnRecord: .*?)```\n").FindSubmatch(readme)
	require.NotNil(t, m, "README.md has no ```go block that starts with 'OnRecord: '")
	snippet := m[1]
	src := "package p\n\nvar _ = runstate.Options{\n" + string(snippet) + "}\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "README.md", src, 0)
	require.NoError(t, err, "README.md's OnRecord snippet does not parse as an Options field:\n%s", snippet)
	funcLit := func(n ast.Node) *ast.FuncLit {
		var lit *ast.FuncLit
		ast.Inspect(n, func(n ast.Node) bool {
			if fl, ok := n.(*ast.FuncLit); ok && lit == nil {
				lit = fl
			}
			return lit == nil
		})
		return lit
	}
	print := func(fset *token.FileSet, n ast.Node) string {
		var b bytes.Buffer
		require.NoError(t, format.Node(&b, fset, n))
		return b.String()
	}
	readmeFn := funcLit(f)
	require.NotNil(t, readmeFn)

	exampleSrc, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	efset := token.NewFileSet()
	ef, err := parser.ParseFile(efset, "example_test.go", exampleSrc, 0)
	require.NoError(t, err)
	var exampleFn *ast.FuncLit
	for _, d := range ef.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "ExampleOptions_onRecord" {
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == 1 {
					if id, ok := as.Lhs[0].(*ast.Ident); ok && id.Name == "progress" {
						exampleFn = funcLit(as.Rhs[0])
					}
				}
				return exampleFn == nil
			})
		}
	}
	require.NotNil(t, exampleFn, "example_test.go: ExampleOptions_onRecord has no progress := func")
	assert.Equal(t, print(efset, exampleFn), print(fset, readmeFn), "README.md's OnRecord function differs from ExampleOptions_onRecord's progress: change both")

	_, output, ok := strings.Cut(string(exampleSrc[bytes.Index(exampleSrc, []byte("func ExampleOptions_onRecord")):]), "// Output:\n")
	require.True(t, ok)
	output, _, _ = strings.Cut(output, "\n}")
	printed := regexp.MustCompile(`// ((?:run |redo|skip) .*)`).FindAllStringSubmatch(string(snippet), -1)
	require.NotEmpty(t, printed, "README.md's OnRecord snippet no longer says what it prints")
	for _, p := range printed {
		assert.Contains(t, output, "\t// "+p[1]+"\n", "README.md's OnRecord snippet says it prints %q; ExampleOptions_onRecord's output has no such line", p[1])
	}
}

// TestPackageDocSnippetCompiles builds the package doc's first example
// (doc.go, "Using it") as it stands, in a function with the names it
// uses, through a build overlay: a renamed call or a changed signature
// fails here.
func TestPackageDocSnippetCompiles(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(src), "// stage through Do:\n//\n")
	require.True(t, ok, "doc.go: no example after 'stage through Do:'")
	var body strings.Builder
	for _, line := range strings.SplitAfter(rest, "\n") {
		code, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			break
		}
		body.WriteString("\t" + code)
	}
	require.NotZero(t, body.Len(), "doc.go: the example after 'stage through Do:' is empty")
	prog := "package main\n\nimport (\n\t\"context\"\n\n\t\"github.com/runstate/runstate\"\n)\n\nfunc main() {}\n\n" +
		"func example(ctx context.Context, plan []byte) error {\n" + body.String() + "\treturn err\n}\n"

	_, out, err := buildOverlay(t, "docsnippet", []byte(prog))
	require.NoError(t, err, "doc.go's example does not compile:\n%s\n%s", out, prog)
}

// buildOverlay builds prog as the main package internal/PKG of this
// module, which does not exist on disk (a build overlay: nothing is
// written into the module), and returns the program, go build's output
// and its error.
func buildOverlay(t *testing.T, pkg string, prog []byte) (bin string, out []byte, err error) {
	t.Helper()
	root, err := os.Getwd()
	require.NoError(t, err)
	tmp := t.TempDir()
	src := filepath.Join(tmp, "main.go")
	require.NoError(t, os.WriteFile(src, prog, 0o644))
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(root, "internal", pkg, "main.go"): src},
	})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "overlay.json"), overlay, 0o644))
	bin = filepath.Join(tmp, pkg)
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	out, err = exec.Command("go", "build", "-overlay", filepath.Join(tmp, "overlay.json"), "-o", bin, "./internal/"+pkg).CombinedOutput()
	return bin, out, err
}
