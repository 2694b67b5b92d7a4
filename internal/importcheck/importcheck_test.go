// SPDX-License-Identifier: Apache-2.0

package importcheck

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The repository itself: every import of every package (and its tests, gpu-tagged ones
// included) follows Floors, only native/ uses cgo, only cuda/ imports purego.
func TestRepository_ImportsPointDown(t *testing.T) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	pkgs, err := Load("go", root, "gpu")
	require.NoError(t, err)
	require.NotEmpty(t, pkgs)

	var lines []string
	for _, v := range Check(Floors, pkgs) {
		lines = append(lines, "  "+v.String())
	}
	if len(lines) > 0 {
		require.FailNow(t, "imports against the rules of internal/importcheck (Floors)", "\n%s",
			strings.Join(lines, "\n"))
	}
}

func TestCheck(t *testing.T) {
	const m = Module + "/"
	cases := []struct {
		desc string
		pkg  Package
		want []string // Violation.String() of each, in order
	}{
		{
			desc: "native may not import transfer (an arrow up a floor)",
			pkg:  Package{ImportPath: m + "native/internal/ucxpeer", Imports: []string{m + "native", m + "transfer", "fmt"}},
			want: []string{"native/internal/ucxpeer imports transfer: native/ may import only layout/, internal/kvplan/, cuda/, internal/peerproc/, internal/hopstamp/ (imports point down)"},
		},
		{
			desc: "layout imports no other package of ours, its own subpackages aside",
			pkg:  Package{ImportPath: m + "layout/layouttest", Imports: []string{m + "layout", m + "cuda"}},
			want: []string{"layout/layouttest imports cuda: layout/ imports no other package of kvxfer"},
		},
		{
			desc: "buffer may not import transfer, in an external test either",
			pkg:  Package{ImportPath: m + "buffer", Imports: []string{m + "native"}, XTestImports: []string{m + "buffer", m + "transfer"}},
			want: []string{"buffer imports transfer: buffer/ may import only layout/, native/ (imports point down)"},
		},
		{
			desc: "transfer may not import cmd or examples, in its tests either",
			pkg: Package{ImportPath: m + "transfer", Imports: []string{m + "buffer", m + "cmd/kvxbench"},
				TestImports: []string{m + "examples/disagg", m + "internal/peerproc"}},
			want: []string{
				"transfer imports cmd/kvxbench: transfer/ may import only layout/, internal/kvplan/, cuda/, native/, buffer/, internal/peerproc/, internal/transferdefaults/, internal/cmastats/, internal/transportimpl/, internal/hopstamp/ (imports point down)",
				"transfer imports examples/disagg: transfer/ may import only layout/, internal/kvplan/, cuda/, native/, buffer/, internal/peerproc/, internal/transferdefaults/, internal/cmastats/, internal/transportimpl/, internal/hopstamp/ (imports point down)",
			},
		},
		{
			desc: "transfer may not import internal/ beyond the test harness and its defaults",
			pkg:  Package{ImportPath: m + "transfer/observe", Imports: []string{m + "transfer", m + "internal/stress"}},
			want: []string{"transfer/observe imports internal/stress: transfer/ may import only layout/, internal/kvplan/, cuda/, native/, buffer/, internal/peerproc/, internal/transferdefaults/, internal/cmastats/, internal/transportimpl/, internal/hopstamp/ (imports point down)"},
		},
		{
			desc: "a peer binary under transfer imports transfer: one floor",
			pkg:  Package{ImportPath: m + "transfer/internal/enginepeer", Imports: []string{m + "transfer", m + "transfer/transport/ucx", m + "layout"}},
		},
		{
			desc: "examples use the library, not internal/ nor cmd/",
			pkg:  Package{ImportPath: m + "examples/disagg", Imports: []string{m + "transfer", m + "internal/stress", m + "cmd/kvxbench"}},
			want: []string{
				"examples/disagg imports cmd/kvxbench: examples/ may import only layout/, cuda/, native/, buffer/, transfer/ (imports point down)",
				"examples/disagg imports internal/stress: examples/ may import only layout/, cuda/, native/, buffer/, transfer/ (imports point down)",
			},
		},
		{
			desc: "nothing imports cmd",
			pkg:  Package{ImportPath: m + "internal/bench", Imports: []string{m + "transfer", m + "cmd/kvxbench"}},
			want: []string{"internal/bench imports cmd/kvxbench: internal/ may import only layout/, cuda/, native/, buffer/, transfer/ (imports point down)"},
		},
		{
			desc: "cmd may import the library and internal/",
			pkg:  Package{ImportPath: m + "cmd/kvxbench", Imports: []string{m + "transfer", m + "internal/stress", m + "cuda/gpuinfo", "github.com/stretchr/testify/require"}},
		},
		{
			desc: `only native/ imports "C"`,
			pkg:  Package{ImportPath: m + "transfer", Imports: []string{"C", m + "native"}, CgoFiles: []string{"x.go", "x.go"}},
			want: []string{`transfer imports "C": only packages under native/ use cgo (cgo files: x.go)`},
		},
		{
			desc: "native and the packages below it use cgo",
			pkg:  Package{ImportPath: m + "native/internal/ucxpeer", Imports: []string{"C", m + "native"}, CgoFiles: []string{"main.go"}},
		},
		{
			desc: "only cuda/ imports purego, its subpackages included",
			pkg:  Package{ImportPath: m + "native", Imports: []string{Purego + "/internal/strings", m + "layout"}},
			want: []string{"native imports " + Purego + "/internal/strings: only packages under cuda/ load libraries with purego"},
		},
		{
			desc: "cuda imports purego",
			pkg:  Package{ImportPath: m + "cuda", Imports: []string{Purego, m + "layout"}},
		},
		{
			desc: "a new top-level folder has no floor until it is given one",
			pkg:  Package{ImportPath: m + "tools/gen", Imports: []string{"fmt"}},
			want: []string{"tools/gen: in no floor of internal/importcheck.Floors: add its folder there, with what it may import"},
		},
		{
			desc: "packages of other modules are not checked",
			pkg:  Package{ImportPath: "github.com/other/mod", Imports: []string{"C", Purego, m + "cmd/kvxbench"}},
		},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			var got []string
			for _, v := range Check(Floors, []Package{c.pkg}) {
				got = append(got, v.String())
			}
			require.Equal(t, c.want, got)
		})
	}
}
