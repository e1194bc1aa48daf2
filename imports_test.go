package herd_test

import (
	"bufio"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestNoInternalImportsAcrossModules holds every nested module of this
// repository to the public API of the others: a package that users build
// (its _test.go files aside) imports no internal package of another module,
// the root module's included. An internal import across modules is an
// unversioned contract that breaks when the modules are upgraded one at a
// time.
func TestNoInternalImportsAcrossModules(t *testing.T) {
	bad, err := crossModuleInternalImports(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// TestCrossModuleInternalImportsFindsViolation checks the walk on a small
// tree that breaks the rule once in a package and once in a test file.
func TestCrossModuleInternalImportsFindsViolation(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/r\n")
	write("internal/x/x.go", "package x\n")
	write("pub/pub.go", "package pub\n\nimport _ \"example.com/r/internal/x\"\n")
	write("sub/go.mod", "module example.com/r/sub\n\nrequire example.com/r v0.0.0\n")
	write("sub/a.go", "package sub\n\nimport (\n\t_ \"example.com/r/internal/x\"\n\t_ \"example.com/r/pub\"\n\t_ \"example.com/r/sub/internal/y\"\n)\n")
	write("sub/a_test.go", "package sub\n\nimport _ \"example.com/r/internal/x\"\n")
	write("sub/internal/y/y.go", "package y\n")
	write("sub/testdata/t.go", "package t\n\nimport _ \"example.com/r/internal/x\"\n")

	bad, err := crossModuleInternalImports(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 1 || !strings.Contains(bad[0], "sub/a.go") || !strings.Contains(bad[0], `"example.com/r/internal/x"`) {
		t.Fatalf("violations = %q, want one, in sub/a.go", bad)
	}
}

// crossModuleInternalImports lists, as "file: imports path (internal to
// module)", every import in a non-test Go file under root of an internal
// package that belongs to another module of the tree.
func crossModuleInternalImports(root string) ([]string, error) {
	mods := map[string]string{} // directory → module path
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && skipDir(d.Name()) {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "go.mod" {
			m, err := modulePath(p)
			if err != nil {
				return err
			}
			mods[filepath.Dir(p)] = m
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(mods))
	for _, m := range mods {
		paths = append(paths, m)
	}
	// owner is the module that holds an import path: the longest module
	// path that is the import path or a prefix of it at a slash.
	owner := func(imp string) string {
		best := ""
		for _, m := range paths {
			if (imp == m || strings.HasPrefix(imp, m+"/")) && len(m) > len(best) {
				best = m
			}
		}
		return best
	}
	// moduleOf is the module whose go.mod is nearest above dir.
	moduleOf := func(dir string) string {
		for {
			if m, ok := mods[dir]; ok {
				return m
			}
			up := filepath.Dir(dir)
			if up == dir {
				return ""
			}
			dir = up
		}
	}

	var bad []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		from := moduleOf(filepath.Dir(p))
		for _, spec := range f.Imports {
			imp, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return err
			}
			if !isInternal(imp) {
				continue
			}
			if to := owner(imp); to != "" && to != from {
				bad = append(bad, fmt.Sprintf("%s: imports %q, internal to module %s", filepath.ToSlash(p), imp, to))
			}
		}
		return nil
	})
	slices.Sort(bad)
	return bad, err
}

func skipDir(name string) bool {
	return name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

func isInternal(imp string) bool {
	return slices.Contains(strings.Split(imp, "/"), "internal")
}

func modulePath(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no module line", gomod)
}
