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

// Copying the pool ranges Runs names, in order, must give exactly the reference gather of the
// same stream range: that is what a one-copy path relies on when it hands them to the network.
func TestRunsReproduceTheReferenceGather(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 200 {
		p := layouttest.RandomPlan(r)
		pool := make([]byte, kvplan.PoolSpan(p))
		layouttest.Fill(r, pool)
		total := p.Bytes()
		off := r.Int64N(total)
		n := r.Int64N(total-off) + 1
		full := make([]byte, total)
		require.NoError(t, layouttest.ReferenceGather(p, pool, full), "case %d", i)
		want := full[off : off+n]
		var got []byte
		next := off
		prevEnd := int64(-1)
		require.NoError(t, kvplan.Runs(p, off, n, func(poolOff, streamOff, length int64) {
			require.Equal(t, next, streamOff, "case %d: ranges come in stream order, without gaps", i)
			require.Positive(t, length)
			require.NotEqual(t, prevEnd, poolOff, "case %d: back-to-back ranges are merged", i)
			got = append(got, pool[poolOff:poolOff+length]...)
			next += length
			prevEnd = poolOff + length
		}))
		require.Equal(t, want, got, "case %d", i)
	}
}

func TestRunsMergeWholeBlocks(t *testing.T) {
	l := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 8, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 6}, layout.BlockMajor)
	sel := layout.Selection{LayerBegin: 0, LayerEnd: 2, HeadBegin: 0, HeadEnd: 4}
	cases := []struct {
		desc   string
		layers [2]int64
		blocks []int32
		want   int
	}{
		{"one block, all layers: one range", [2]int64{0, 2}, []int32{3}, 1},
		{"two blocks: one range per block, layer and kv (block-major keeps a block's layers together, the stream does not)", [2]int64{0, 2}, []int32{1, 2}, 8},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			s := sel
			s.LayerBegin, s.LayerEnd = c.layers[0], c.layers[1]
			p, err := layout.NewPlan(l, s, c.blocks)
			require.NoError(t, err)
			got := 0
			require.NoError(t, kvplan.Runs(p, 0, p.Bytes(), func(_, _, _ int64) { got++ }))
			require.Equal(t, c.want, got)
		})
	}
}

func TestRunsRefusesARangeOutsideTheStream(t *testing.T) {
	p := layouttest.RandomPlan(rand.New(rand.NewPCG(1, 2)))
	called := false
	err := kvplan.Runs(p, p.Bytes()-1, 2, func(_, _, _ int64) { called = true })
	require.ErrorIs(t, err, layout.ErrOutOfRange)
	require.False(t, called)
}
