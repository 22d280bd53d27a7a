package main

import (
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The "agent logic" of the example: mechanical stand-ins for what a model
// would do. It finds the exported declarations of a Go package that lack a
// doc comment, writes one for each, and rewrites the file.

// finding is an exported declaration without a doc comment.
type finding struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Name    string `json:"name"`
	Kind    string `json:"kind"`    // func, method, type
	Comment string `json:"comment"` // the doc comment to add (plan)
}

// goFiles lists the non-test .go files of dir, sorted.
func goFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if e.Type().IsRegular() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// undocumented parses file in dir and returns its exported declarations
// that have no doc comment, with the comment to add.
func undocumented(dir, file string) ([]finding, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join(dir, file), nil, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	var out []finding
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Doc != nil || !d.Name.IsExported() {
				continue
			}
			kind := "func"
			if d.Recv != nil && len(d.Recv.List) == 1 {
				kind = "method"
				if !ast.IsExported(strings.TrimLeft(types.ExprString(d.Recv.List[0].Type), "*")) {
					continue
				}
			}
			out = append(out, finding{File: file, Line: fset.Position(d.Pos()).Line, Name: d.Name.Name, Kind: kind,
				Comment: funcComment(d)})
		case *ast.GenDecl:
			if d.Tok != token.TYPE || d.Doc != nil || len(d.Specs) != 1 {
				continue
			}
			ts := d.Specs[0].(*ast.TypeSpec)
			if !ts.Name.IsExported() || ts.Doc != nil {
				continue
			}
			out = append(out, finding{File: file, Line: fset.Position(d.Pos()).Line, Name: ts.Name.Name, Kind: "type",
				Comment: typeComment(ts)})
		}
	}
	return out, nil
}

func funcComment(d *ast.FuncDecl) string {
	var params []string
	for _, p := range d.Type.Params.List {
		typ := types.ExprString(p.Type)
		if len(p.Names) == 0 {
			params = append(params, "a "+typ)
		}
		for _, n := range p.Names {
			params = append(params, fmt.Sprintf("%s (%s)", n.Name, typ))
		}
	}
	var results []string
	if d.Type.Results != nil {
		for _, r := range d.Type.Results.List {
			n := len(r.Names)
			if n == 0 {
				n = 1
			}
			for range n {
				results = append(results, types.ExprString(r.Type))
			}
		}
	}
	var b strings.Builder
	b.WriteString(d.Name.Name)
	switch {
	case len(params) > 0 && len(results) > 0:
		fmt.Fprintf(&b, " takes %s and returns %s.", join(params), join(results))
	case len(params) > 0:
		fmt.Fprintf(&b, " takes %s.", join(params))
	case len(results) > 0:
		fmt.Fprintf(&b, " returns %s.", join(results))
	default:
		b.WriteString(" takes no arguments and returns nothing.")
	}
	return b.String()
}

func typeComment(ts *ast.TypeSpec) string {
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return fmt.Sprintf("%s is a %s.", ts.Name.Name, types.ExprString(ts.Type))
	}
	var fields []string
	for _, f := range st.Fields.List {
		for _, n := range f.Names {
			if n.IsExported() {
				fields = append(fields, n.Name)
			}
		}
	}
	if len(fields) == 0 {
		return fmt.Sprintf("%s is a struct type.", ts.Name.Name)
	}
	return fmt.Sprintf("%s is a struct type with the fields %s.", ts.Name.Name, join(fields))
}

func join(s []string) string {
	switch len(s) {
	case 1:
		return s[0]
	case 2:
		return s[0] + " and " + s[1]
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// addComments returns src with a doc comment line above each finding's
// line, gofmt'd.
func addComments(src []byte, fs []finding) ([]byte, error) {
	lines := strings.SplitAfter(string(src), "\n")
	sorted := append([]finding(nil), fs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Line > sorted[j].Line })
	for _, f := range sorted {
		if f.Line < 1 || f.Line > len(lines) {
			return nil, fmt.Errorf("%s: line %d is out of range: the file changed since the plan", f.File, f.Line)
		}
		at := f.Line - 1
		lines = append(lines[:at], append([]string{"// " + f.Comment + "\n"}, lines[at:]...)...)
	}
	return format.Source([]byte(strings.Join(lines, "")))
}
