package runstate

import (
	"go/ast"
	goparser "go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docParagraph returns the doc.go comment paragraph that starts with
// start, up to its next empty comment line, without the "// ".
func docParagraph(t *testing.T, start string) string {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(src), "\n// "+start)
	require.True(t, ok, "doc.go has no paragraph that starts with %q", start)
	para, _, _ := strings.Cut(start+rest, "\n//\n")
	return strings.ReplaceAll(para, "\n// ", "\n")
}

// jsonFields lists the JSON names of a struct type's fields.
func jsonFields(typ reflect.Type) []string {
	var names []string
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// TestDocNamesEveryField holds the package doc's description of the files
// to the code: every field of manifest.json and of a ledger record, and
// every event, is named there, and the doc names no field or event the
// code does not have.
func TestDocNamesEveryField(t *testing.T) {
	manifestDoc := docParagraph(t, "manifest.json is a JSON object:")
	for _, name := range jsonFields(reflect.TypeFor[manifest]()) {
		assert.Regexp(t, `\b`+name+`\b`, manifestDoc, "doc.go does not name manifest.json's field %q", name)
	}

	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	table := func(after, before string) []string {
		_, rest, ok := strings.Cut(string(src), after)
		require.True(t, ok, "doc.go: no %q", after)
		rest, _, ok = strings.Cut(rest, before)
		require.True(t, ok, "doc.go: no %q after %q", before, after)
		var names []string
		for _, m := range regexp.MustCompile(`(?m)^//\t([a-z_, ]+?)(?:  |$)`).FindAllStringSubmatch(rest, -1) {
			for _, n := range strings.Split(m[1], ",") {
				if n = strings.TrimSpace(n); n != "" {
					names = append(names, n)
				}
			}
		}
		return names
	}
	fields := table("is corruption. The fields:\n", "\n// What a record may hold")
	assert.Equal(t, append(jsonFields(reflect.TypeFor[Record]()), "crc"), fields, "the record fields doc.go lists")

	events := table("// The events:\n", "\n// logs/next-steps.txt is")
	// Every ev... constant of the package is an event.
	var evs []string
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := goparser.ParseFile(token.NewFileSet(), name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i >= len(vs.Values) || !regexp.MustCompile(`^ev[A-Z]`).MatchString(n.Name) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						evs = append(evs, strings.Trim(lit.Value, `"`))
					}
				}
			}
		}
	}
	require.Contains(t, evs, "create")
	assert.ElementsMatch(t, evs, events, "the events doc.go lists")
}
