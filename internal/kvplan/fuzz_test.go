// SPDX-License-Identifier: Apache-2.0

package kvplan_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
)

// FuzzPlan: no layout, selection or block list makes validation or planning panic, any
// plan that validates only ever points inside its pool, and Runs names the same ranges as the
// division formula (RunsByDivision) over the whole stream and its second half.
func FuzzPlan(f *testing.F) {
	f.Add(int64(2), int64(2), int64(4), int64(8), int64(2), int64(4), int64(3), int64(1024), int64(512), int64(256), int64(64), int64(16), int64(0), int64(2), int64(0), int64(4), int32(1), int32(2))
	f.Fuzz(func(t *testing.T, layers, kv, heads, dim, elem, tokens, blocks, sb, sl, skv, sh, st, lb, le, hb, he int64, b0, b1 int32) {
		l := layout.Layout{NumLayers: layers, KVFactor: kv, NumHeads: heads, HeadDim: dim, ElemSize: elem,
			TokensPerBlock: tokens, NumBlocks: blocks, StrideBlock: sb, StrideLayer: sl, StrideKV: skv,
			StrideHead: sh, StrideToken: st}
		p, err := layout.NewPlan(l, layout.Selection{LayerBegin: lb, LayerEnd: le, HeadBegin: hb, HeadEnd: he}, []int32{b0, b1})
		if err != nil {
			return
		}
		span := l.SpanBytes()
		require.Positive(t, span)
		for _, u := range []int64{0, kvplan.Units(p) / 2, kvplan.Units(p) - 1} {
			off := kvplan.UnitOffset(p, u)
			require.True(t, off >= 0 && off+l.RowBytes() <= span, "unit %d at %d outside span %d", u, off, span)
		}
		if total := p.Bytes(); total <= 1<<20 {
			for _, rg := range [][2]int64{{0, total}, {total / 2, total - total/2}} {
				require.Equal(t, collect(t, kvplan.RunsByDivision, p, rg[0], rg[1]), collect(t, kvplan.Runs, p, rg[0], rg[1]), "range %v", rg)
			}
		}
	})
}
