package herd_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the most lines a function of the root package may span,
// from its func keyword to its closing brace.
const maxFuncLines = 60

// TestFunctionsAtMostSixtyLines holds every function of the root package
// (its _test.go files aside) to maxFuncLines lines.
func TestFunctionsAtMostSixtyLines(t *testing.T) {
	long, err := longFuncs(".", maxFuncLines)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range long {
		t.Error(l)
	}
}

// TestLongFuncsFindsLongFunction checks the check on a package with one
// function one line too long, and one just short enough.
func TestLongFuncsFindsLongFunction(t *testing.T) {
	dir := t.TempDir()
	body := func(name string, lines int) string {
		// The func line, lines-2 statements, the closing brace.
		return fmt.Sprintf("func %s() {\n%s}\n", name, strings.Repeat("\t_ = 0\n", lines-2))
	}
	src := "package p\n\n" + body("fits", maxFuncLines) + body("tooLong", maxFuncLines+1)
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	long, err := longFuncs(dir, maxFuncLines)
	if err != nil {
		t.Fatal(err)
	}
	if len(long) != 1 || !strings.Contains(long[0], "tooLong") {
		t.Errorf("longFuncs = %q, want tooLong alone", long)
	}
}

// longFuncs returns, for each function in the non-test Go files of dir
// that spans more than limit lines, its place, name and length.
func longFuncs(dir string, limit int) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var long []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			from, to := fset.Position(fd.Pos()), fset.Position(fd.End())
			if n := to.Line - from.Line + 1; n > limit {
				long = append(long, fmt.Sprintf("%s:%d: %s spans %d lines, more than %d", filepath.Base(name), from.Line, fd.Name.Name, n, limit))
			}
		}
	}
	return long, nil
}
