// SPDX-License-Identifier: Apache-2.0

// Package layouttest makes random layouts, selections and plans for property tests of every
// gather and scatter implementation (host, CUDA, transports), and ReferenceGather and
// ReferenceScatter, the element-by-element ground truth they are checked against.
package layouttest

import (
	"math/rand/v2"

	"github.com/kvxfer/kvxfer/layout"
)

// RandomLayout returns a small valid layout whose five strided dimensions are nested in a
// random order, each with or without padding, so tests cover block-major, layer-major, NHD and
// every other arrangement.
func RandomLayout(r *rand.Rand) layout.Layout {
	d := layout.Dims{
		NumLayers:      1 + r.Int64N(4),
		KVFactor:       1 + r.Int64N(2),
		NumHeads:       1 + r.Int64N(4),
		HeadDim:        1 + r.Int64N(8),
		ElemSize:       []int64{1, 2, 4}[r.IntN(3)],
		TokensPerBlock: 1 + r.Int64N(5),
		NumBlocks:      1 + r.Int64N(6),
	}
	return RandomStrides(r, d)
}

// RandomStrides lays dims out in a random nesting order with random padding.
func RandomStrides(r *rand.Rand, d layout.Dims) layout.Layout {
	l := layout.Packed(d, layout.BlockMajor)
	strides := []*int64{&l.StrideBlock, &l.StrideLayer, &l.StrideKV, &l.StrideHead, &l.StrideToken}
	counts := []int64{d.NumBlocks, d.NumLayers, d.KVFactor, d.NumHeads, d.TokensPerBlock}
	extent := d.HeadDim * d.ElemSize
	for _, i := range r.Perm(len(strides)) {
		pad := int64(0)
		if r.IntN(3) == 0 {
			pad = d.ElemSize * (1 + r.Int64N(3))
		}
		*strides[i] = extent + pad
		extent = *strides[i] * counts[i]
	}
	return l
}

// RandomSelection picks a non-empty layer range and head range of l.
func RandomSelection(r *rand.Rand, l layout.Layout) layout.Selection {
	lb := r.Int64N(l.NumLayers)
	hb := r.Int64N(l.NumHeads)
	return layout.Selection{
		LayerBegin: lb, LayerEnd: lb + 1 + r.Int64N(l.NumLayers-lb),
		HeadBegin: hb, HeadEnd: hb + 1 + r.Int64N(l.NumHeads-hb),
	}
}

// RandomBlocks picks between 1 and NumBlocks distinct block ids in random order.
func RandomBlocks(r *rand.Rand, l layout.Layout) []int32 {
	n := 1 + r.IntN(int(l.NumBlocks))
	ids := make([]int32, 0, n)
	for _, b := range r.Perm(int(l.NumBlocks))[:n] {
		ids = append(ids, int32(b))
	}
	return ids
}

// RandomPlan combines the three. It panics if the result does not validate: that would be a
// bug in this package or in layout.
func RandomPlan(r *rand.Rand) *layout.Plan {
	l := RandomLayout(r)
	p, err := layout.NewPlan(l, RandomSelection(r, l), RandomBlocks(r, l))
	if err != nil {
		panic(err)
	}
	return p
}

// Fill writes a pseudo-random pattern into b.
func Fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// Llama3_8B is a Llama-3-8B-shaped pool (32 layers, 8 KV heads, head dim 128, BF16, 32 tokens
// per block) with numBlocks blocks, block-major.
func Llama3_8B(numBlocks int64) layout.Layout {
	return layout.Packed(layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128,
		ElemSize: 2, TokensPerBlock: 32, NumBlocks: numBlocks}, layout.BlockMajor)
}
