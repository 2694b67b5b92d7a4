// SPDX-License-Identifier: Apache-2.0

package kvplan_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

type run struct{ pool, stream, length int64 }

func collect(t testing.TB, walk func(*layout.Plan, int64, int64, func(int64, int64, int64)) error, p *layout.Plan, off, n int64) []run {
	var rs []run
	require.NoError(t, walk(p, off, n, func(a, b, c int64) { rs = append(rs, run{a, b, c}) }))
	return rs
}

// Runs carries each piece's digits forward instead of dividing per piece: it must name the
// same ranges as the division formula (RunsByDivision) for every packed order and random
// strides, partial layer and head selections (a TP share), held blocks dropped
// (WithoutPositions), and ranges that start and end anywhere, mid-row included.
func TestRunsWalkMatchesTheDivisionFormula(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	plans := func() []*layout.Plan {
		var ps []*layout.Plan
		d := layout.Dims{NumLayers: 1 + r.Int64N(4), KVFactor: 1 + r.Int64N(2), NumHeads: 1 + r.Int64N(6),
			HeadDim: 1 + r.Int64N(8), ElemSize: 1 << r.IntN(3), TokensPerBlock: 1 + r.Int64N(5), NumBlocks: 1 + r.Int64N(6)}
		for _, o := range []layout.Order{layout.BlockMajor, layout.LayerMajor, layout.LayerMajorNHD} {
			l := layout.Packed(d, o)
			for _, s := range []layout.Selection{l.All(), layouttest.RandomSelection(r, l)} {
				p, err := layout.NewPlan(l, s, layouttest.RandomBlocks(r, l))
				require.NoError(t, err)
				ps = append(ps, p)
			}
		}
		ps = append(ps, layouttest.RandomPlan(r))
		if p := ps[len(ps)-1]; len(p.Blocks()) > 1 {
			held, err := kvplan.WithoutPositions(p, []int{r.IntN(len(p.Blocks()))})
			require.NoError(t, err)
			ps = append(ps, held)
		}
		return ps
	}
	for i := range 300 {
		for j, p := range plans() {
			total := p.Bytes()
			ranges := [][2]int64{{0, total}}
			for range 4 {
				off := r.Int64N(total)
				ranges = append(ranges, [2]int64{off, r.Int64N(total-off) + 1})
			}
			for _, rg := range ranges {
				want := collect(t, kvplan.RunsByDivision, p, rg[0], rg[1])
				got := collect(t, kvplan.Runs, p, rg[0], rg[1])
				require.Equal(t, want, got, "case %d plan %d (%+v %+v %v) range %v", i, j, p.Layout(), p.Selection(), p.Blocks(), rg)
			}
		}
	}
}
