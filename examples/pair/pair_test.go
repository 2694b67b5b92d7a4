// SPDX-License-Identifier: Apache-2.0

//go:build cgo && linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/format"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The example's promises about itself: at most maxLines lines of Go (every line of its
// gofmt'd non-test files, comments and blank lines included), naming at most maxIdentifiers of
// kvxfer's exported identifiers.
const maxLines, maxIdentifiers = 150, 40

// TestPair_PrefillAndDecodeOverUCX builds the example (with -race) and runs it as a user would
// (go run ./examples/pair): two processes over UCX shared memory. Every outcome it prints must be
// there: req-1 completed with the bytes prefill wrote, req-2 cancelled by decode once prefill had
// it (both sides' blocks back), req-3 failed with a *PeerLostError naming the prefill that died,
// within a second of its Receive (the program measures from the Receive, made once the prefill
// process was reaped, to Done), the probes and /metrics, and every block back in both pools.
func TestPair_PrefillAndDecodeOverUCX(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "pair")
	out, err := exec.Command("go", "build", "-race", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // generous: a loaded 2-core box
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin)
	cmd.Stdout, cmd.Stderr, cmd.WaitDelay = &stdout, &stderr, 10*time.Second
	require.NoError(t, cmd.Run(), "stdout:\n%s\nstderr:\n%s", &stdout, &stderr)
	got := stdout.String()
	t.Logf("stdout:\n%s", got)
	for _, want := range []string{
		`prefill: req-1: completed, blocks free: 64`,
		`decode: req-1 in \d+ ms \(KV as prefill wrote it: true, prefill lost: false, <nil>\): completed, blocks free: 64`,
		`decode: req-2 cancel: cancel-requested-in-flight`,
		`prefill: req-2: cancelled, blocks free: 64`,
		`decode: req-2 in \d+ ms \(KV as prefill wrote it: false, prefill lost: false, request \d+: kvxfer: transfer cancelled\): cancelled, blocks free: 64`,
		`decode: prefill exited: signal: killed`,
		`decode: /livez 200 ok`,
		`decode: /readyz 200 ok`,
		`decode: /metrics 200 kvxfer_transferred_bytes_total\{direction="receive"\} 1\.048576e\+06`, // req-1's 4 blocks of 256 KiB
	} {
		require.Regexp(t, regexp.MustCompile(`(?m)^`+want+`$`), got)
	}
	lost := regexp.MustCompile(`(?m)^decode: req-3 in (\d+) ms \(KV as prefill wrote it: false, prefill lost: true, ` +
		`request \d+: kvxfer: peer peer-[0-9a-f]{12} was lost \d+m?s ago: .*\): failed, blocks free: 64$`).FindStringSubmatch(got)
	require.NotNil(t, lost, "req-3's line")
	ms, err := strconv.Atoi(lost[1])
	require.NoError(t, err)
	require.Less(t, ms, 1000, "req-3's Receive failed %d ms after it was made, its prefill dead", ms)
}

// TestPair_IsSmall holds the example to maxLines lines of gofmt'd Go and maxIdentifiers of
// kvxfer's exported identifiers: package-level names (functions, types, constants, variables)
// and methods, each counted once however often it is used, as go/types resolves them. Struct
// fields (Spec.Plan, Config.TLS) are counted and logged beside, not held to the bound.
func TestPair_IsSmall(t *testing.T) {
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var files []*ast.File
	lines := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		formatted, err := format.Source(src)
		require.NoError(t, err)
		require.Equal(t, string(formatted), string(src), "%s is not gofmt'd", name)
		lines += bytes.Count(src, []byte("\n"))
		f, err := parser.ParseFile(fset, name, src, 0)
		require.NoError(t, err)
		files = append(files, f)
	}
	t.Logf("%d lines of Go in %d files", lines, len(files))
	require.LessOrEqual(t, lines, maxLines)

	calls, fields := kvxferIdentifiers(t, fset, files)
	t.Logf("%d of kvxfer's exported identifiers (names and methods): %s", len(calls), strings.Join(calls, " "))
	t.Logf("and %d struct fields: %s", len(fields), strings.Join(fields, " "))
	require.LessOrEqual(t, len(calls), maxIdentifiers)
}

// kvxferIdentifiers type-checks files against the export data `go list -export` builds and
// returns the exported identifiers of kvxfer's packages they use: package-level names and
// methods ("transfer.New", "transfer.Engine.Receive"), and struct fields ("transfer.Spec.Plan").
func kvxferIdentifiers(t *testing.T, fset *token.FileSet, files []*ast.File) (names, fields []string) {
	out, err := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Export", ".").Output()
	require.NoError(t, err)
	exports := map[string]string{}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p struct{ ImportPath, Export string }
		require.NoError(t, dec.Decode(&p))
		exports[p.ImportPath] = p.Export
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	_, err = (&types.Config{Importer: imp}).Check("main", fset, files, info)
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, obj := range info.Uses {
		if obj.Pkg() == nil || !strings.HasPrefix(obj.Pkg().Path(), "github.com/kvxfer/kvxfer/") || !obj.Exported() {
			continue
		}
		name, field := obj.Pkg().Name()+"."+obj.Name(), false
		switch o := obj.(type) {
		case *types.Var:
			if o.IsField() {
				name, field = obj.Pkg().Name()+"."+fieldOwner(o)+"."+obj.Name(), true
			}
		case *types.Func:
			if recv := o.Signature().Recv(); recv != nil {
				name = obj.Pkg().Name() + "." + typeName(recv.Type()) + "." + obj.Name()
			}
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		if field {
			fields = append(fields, name)
		} else {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	slices.Sort(fields)
	return names, fields
}

// typeName is the name of a method's receiver type, pointer or not.
func typeName(t types.Type) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if n, ok := t.(*types.Named); ok {
		return n.Obj().Name()
	}
	return t.String()
}

// fieldOwner is the name of the struct type of its package that declares field f.
func fieldOwner(f *types.Var) string {
	scope := f.Pkg().Scope()
	for _, name := range scope.Names() {
		if s, ok := scope.Lookup(name).Type().Underlying().(*types.Struct); ok {
			for i := range s.NumFields() {
				if s.Field(i) == f.Origin() {
					return name
				}
			}
		}
	}
	return "?"
}

// TestPair_LinksNoEtcd: a program that uses only the HTTP registry links no etcd package (the
// etcd backend is transfer/discovery/etcd, linked only by importing it).
func TestPair_LinksNoEtcd(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	require.NoError(t, err)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/kvxfer/kvxfer/transfer/discovery", "the example uses the registry")
	for _, dep := range deps {
		require.False(t, strings.HasPrefix(dep, "go.etcd.io/") || strings.HasSuffix(dep, "/transfer/discovery/etcd"),
			"examples/pair links %s", dep)
	}
}
