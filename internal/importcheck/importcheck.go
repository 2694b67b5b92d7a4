// SPDX-License-Identifier: Apache-2.0

package importcheck

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
)

// Module is kvxfer's module path. Packages outside it are not checked, and importing them is
// not restricted here, except purego.
const Module = "github.com/kvxfer/kvxfer"

// Purego is the import path of purego, which only packages under cuda/ may import. It is read
// from loader.txt, so that no Go file outside cuda/ spells the import the rule is about.
var Purego = strings.TrimSpace(loaderFile)

//go:embed loader.txt
var loaderFile string

// Floor is one folder of the repository (a path relative to the module root, "" never) and the
// folders its packages may import. A package belongs to the floor with the longest matching
// folder; any package may import packages of its own floor.
type Floor struct {
	Folder    string
	MayImport []string
}

// Floors are kvxfer's import rules, bottom-up. Arrows only point down: nothing imports cmd/ or
// examples/, and the library (layout, cuda, native, buffer, transfer) imports nothing above it.
// cuda and native are one floor apart only in this direction: native's device-memory tests
// (gpu tag) allocate with package cuda, and cuda imports no native. internal/peerproc, the
// two-process test harness, starts peer binaries by path and imports nothing of ours, so every
// floor's tests may use it. internal/transferdefaults, the defaults of transfer.Config that the
// benchmarks and the stress harness size against too, is constants that import nothing of
// ours, so package transfer may take its values from there. Three more internal packages sit
// low because a user never imports them (issue 27 moved them out of the public surface):
// internal/kvplan, the plan arithmetic the movers and transports use, just above layout (it
// imports only layout); internal/cmastats and internal/transportimpl (the route from a
// ucx.Transport to its implementation), which import nothing of ours, below transfer; and
// internal/hopstamp, kvxbench --hops's stamps, which imports nothing of ours, below native,
// whose workers and transfer's steps it stamps.
var Floors = []Floor{
	{Folder: "layout"},
	{Folder: "internal/peerproc"},
	{Folder: "internal/transferdefaults"},
	{Folder: "internal/cmastats"},
	{Folder: "internal/transportimpl"},
	{Folder: "internal/hopstamp"},
	{Folder: "internal/kvplan", MayImport: []string{"layout"}},
	{Folder: "cuda", MayImport: []string{"layout", "internal/kvplan"}},
	{Folder: "native", MayImport: []string{"layout", "internal/kvplan", "cuda", "internal/peerproc", "internal/hopstamp"}},
	{Folder: "buffer", MayImport: []string{"layout", "native"}},
	{Folder: "transfer", MayImport: []string{"layout", "internal/kvplan", "cuda", "native", "buffer", "internal/peerproc",
		"internal/transferdefaults", "internal/cmastats", "internal/transportimpl", "internal/hopstamp"}},
	{Folder: "internal", MayImport: []string{"layout", "cuda", "native", "buffer", "transfer"}},
	{Folder: "cmd", MayImport: []string{"layout", "cuda", "native", "buffer", "transfer", "internal"}},
	// An example imports only what a user's program can: the library, not internal/.
	{Folder: "examples", MayImport: []string{"layout", "cuda", "native", "buffer", "transfer"}},
}

// Package is what the check needs of one package: `go list -json` fills it. The import lists
// of its tests count as its own.
type Package struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	CgoFiles     []string
}

// Violation is one import against the rules.
type Violation struct {
	Package string // relative to the module root, e.g. native/internal/ucxpeer
	Import  string // the offending import, relative to the module root for kvxfer's own; "" when the package itself has no floor
	Reason  string
}

func (v Violation) String() string {
	if v.Import == "" {
		return fmt.Sprintf("%s: %s", v.Package, v.Reason)
	}
	return fmt.Sprintf("%s imports %s: %s", v.Package, v.Import, v.Reason)
}

// Check returns every violation in pkgs under floors, sorted by package and import.
func Check(floors []Floor, pkgs []Package) []Violation {
	var out []Violation
	for _, p := range pkgs {
		rel, ok := relative(p.ImportPath)
		if !ok {
			continue
		}
		floor, found := floorOf(floors, rel)
		if !found {
			out = append(out, Violation{Package: rel,
				Reason: "in no floor of internal/importcheck.Floors: add its folder there, with what it may import"})
		}
		imports := slices.Concat(p.Imports, p.TestImports, p.XTestImports)
		slices.Sort(imports)
		imports = slices.Compact(imports)
		for _, imp := range imports {
			switch {
			case imp == "C":
				if !under(rel, "native") {
					files := slices.Compact(slices.Sorted(slices.Values(p.CgoFiles)))
					out = append(out, Violation{rel, `"C"`,
						fmt.Sprintf("only packages under native/ use cgo (cgo files: %s)", strings.Join(files, ", "))})
				}
				continue
			case imp == Purego || strings.HasPrefix(imp, Purego+"/"):
				if !under(rel, "cuda") {
					out = append(out, Violation{rel, imp, "only packages under cuda/ load libraries with purego"})
				}
				continue
			}
			dep, own := relative(imp)
			if !own || !found {
				continue
			}
			if under(dep, floor.Folder) || slices.ContainsFunc(floor.MayImport, func(f string) bool { return under(dep, f) }) {
				continue
			}
			out = append(out, Violation{rel, dep, mayImport(floor)})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Package != out[j].Package {
			return out[i].Package < out[j].Package
		}
		return out[i].Import < out[j].Import
	})
	return out
}

func mayImport(f Floor) string {
	if len(f.MayImport) == 0 {
		return fmt.Sprintf("%s/ imports no other package of kvxfer", f.Folder)
	}
	return fmt.Sprintf("%s/ may import only %s/ (imports point down)", f.Folder, strings.Join(f.MayImport, "/, "))
}

// relative returns path relative to Module, and whether it is in the module. The module's root
// package, if it ever has one, is ".".
func relative(path string) (string, bool) {
	if path == Module {
		return ".", true
	}
	rel, ok := strings.CutPrefix(path, Module+"/")
	return rel, ok
}

// under reports whether the package at rel lies in folder or below it.
func under(rel, folder string) bool {
	return rel == folder || strings.HasPrefix(rel, folder+"/")
}

func floorOf(floors []Floor, rel string) (Floor, bool) {
	var best Floor
	found := false
	for _, f := range floors {
		if under(rel, f.Folder) && (!found || len(f.Folder) > len(best.Folder)) {
			best, found = f, true
		}
	}
	return best, found
}

// Load lists the packages of the module rooted at dir with `go list -json`, with cgo on and,
// for each of tags (one build's tags, comma-separated; "" for none), once more: a test file
// behind a build tag (gpu) must not hide an import. Packages listed more than once merge their
// imports.
func Load(goBin, dir string, tags ...string) ([]Package, error) {
	byPath := map[string]*Package{}
	var order []string
	for _, t := range append([]string{""}, tags...) {
		args := []string{"list", "-e", "-json=ImportPath,Imports,TestImports,XTestImports,CgoFiles,Error"}
		if t != "" {
			args = append(args, "-tags", t)
		}
		cmd := exec.Command(goBin, append(args, "./...")...)
		cmd.Dir = dir
		cmd.Env = append(cmd.Environ(), "CGO_ENABLED=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("go list (tags %q): %w\n%s", t, err, stderr.String())
		}
		dec := json.NewDecoder(bytes.NewReader(out))
		for {
			var p struct {
				Package
				Error *struct{ Err string }
			}
			if err := dec.Decode(&p); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("go list (tags %q): %w", t, err)
			}
			if p.Error != nil {
				return nil, fmt.Errorf("go list (tags %q): %s: %s", t, p.ImportPath, p.Error.Err)
			}
			q, seen := byPath[p.ImportPath]
			if !seen {
				q = &Package{ImportPath: p.ImportPath}
				byPath[p.ImportPath] = q
				order = append(order, p.ImportPath)
			}
			q.Imports = append(q.Imports, p.Imports...)
			q.TestImports = append(q.TestImports, p.TestImports...)
			q.XTestImports = append(q.XTestImports, p.XTestImports...)
			q.CgoFiles = append(q.CgoFiles, p.CgoFiles...)
		}
	}
	pkgs := make([]Package, 0, len(order))
	for _, path := range order {
		pkgs = append(pkgs, *byPath[path])
	}
	return pkgs, nil
}
