// SPDX-License-Identifier: Apache-2.0

package apisurface

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
)

// Surface is what one package exports, each name as `go doc` would be asked for it: "Name",
// "Type.Method" or "Type.Field".
type Surface struct {
	Names []string // sorted
}

// Len is the number of exported identifiers.
func (s Surface) Len() int { return len(s.Names) }

// Count reads the package in dir as `go doc -all` does (its non-test files that build on
// this platform, cgo ones included) and lists its exported identifiers.
func Count(dir string) (Surface, error) {
	ctx := build.Default
	ctx.CgoEnabled = true
	bp, err := ctx.ImportDir(dir, 0)
	if err != nil {
		return Surface{}, fmt.Errorf("apisurface: %s: %w", dir, err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range append(append([]string{}, bp.GoFiles...), bp.CgoFiles...) {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return Surface{}, fmt.Errorf("apisurface: %w", err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, bp.ImportPath)
	if err != nil {
		return Surface{}, fmt.Errorf("apisurface: %s: %w", dir, err)
	}
	var s Surface
	add := func(prefix, name string) {
		if ast.IsExported(name) {
			s.Names = append(s.Names, prefix+name)
		}
	}
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			for _, name := range v.Names {
				add("", name)
			}
		}
	}
	values(p.Consts)
	values(p.Vars)
	for _, f := range p.Funcs {
		add("", f.Name)
	}
	for _, t := range p.Types {
		add("", t.Name)
		values(t.Consts)
		values(t.Vars)
		for _, f := range t.Funcs {
			add("", f.Name)
		}
		for _, m := range t.Methods {
			add(t.Name+".", m.Name)
		}
		for _, spec := range t.Decl.Specs {
			ts, ok := spec.(*ast.TypeSpec)
			if !ok || ts.Name.Name != t.Name {
				continue
			}
			var fields *ast.FieldList
			switch x := ts.Type.(type) {
			case *ast.StructType:
				fields = x.Fields
			case *ast.InterfaceType:
				fields = x.Methods
			}
			if fields == nil {
				continue
			}
			for _, f := range fields.List {
				for _, n := range f.Names {
					add(t.Name+".", n.Name)
				}
				if len(f.Names) == 0 {
					if name := embeddedName(f.Type); name != "" {
						add(t.Name+".", name)
					}
				}
			}
		}
	}
	sort.Strings(s.Names)
	return s, nil
}

// embeddedName is the name an embedded field or interface goes by: T, *T, pkg.T, T[P].
func embeddedName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.StarExpr:
		return embeddedName(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.IndexExpr:
		return embeddedName(x.X)
	case *ast.IndexListExpr:
		return embeddedName(x.X)
	}
	return "" // a union or ~T constraint term: not a name
}
