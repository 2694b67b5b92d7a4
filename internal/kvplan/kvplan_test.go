// SPDX-License-Identifier: Apache-2.0

package kvplan_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

var small = layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 8, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 3}

func TestChunksCoverTheStreamOnElementBoundaries(t *testing.T) {
	l := layout.Packed(small, layout.BlockMajor)
	p, err := layout.NewPlan(l, l.All(), []int32{1, 2})
	require.NoError(t, err)
	for _, max := range []int64{2, 3, 100, 1000, p.Bytes(), p.Bytes() + 5} {
		chunks, err := kvplan.Chunks(p, max)
		require.NoError(t, err)
		next := int64(0)
		for _, c := range chunks {
			require.Equal(t, next, c.Offset)
			require.LessOrEqual(t, c.Length, max)
			require.Zero(t, c.Offset%l.ElemSize)
			next += c.Length
		}
		require.Equal(t, p.Bytes(), next)
	}
	_, err = kvplan.Chunks(p, 1)
	require.ErrorIs(t, err, layout.ErrOutOfRange)
}

// Every unit offset of a random plan stays inside the pool, and the plan's units map to
// distinct rows (no two stream units share pool memory).
func TestUnitOffsetsAreInsideAndDistinct(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for range 300 {
		p := layouttest.RandomPlan(r)
		span, row := p.Layout().SpanBytes(), p.Layout().RowBytes()
		seen := map[int64]bool{}
		for u := range kvplan.Units(p) {
			off := kvplan.UnitOffset(p, u)
			require.GreaterOrEqual(t, off, int64(0))
			require.LessOrEqual(t, off+row, span)
			require.False(t, seen[off], "two units at offset %d", off)
			seen[off] = true
		}
		// RunUnits really are contiguous.
		run := kvplan.RunUnits(p)
		for u := int64(0); u+1 < kvplan.Units(p); u++ {
			if (u+1)%run != 0 {
				require.Equal(t, kvplan.UnitOffset(p, u)+row, kvplan.UnitOffset(p, u+1), "run of %d units broken at %d", run, u)
			}
		}
	}
}

func TestWithoutPositionsKeepsSenderAndReceiverInStep(t *testing.T) {
	src := layout.Packed(small, layout.BlockMajor)
	dst := layout.Packed(small, layout.LayerMajor)
	sp, err := layout.NewPlan(src, src.All(), []int32{2, 0, 1})
	require.NoError(t, err)
	dp, err := layout.NewPlan(dst, dst.All(), []int32{1, 2, 0})
	require.NoError(t, err)
	// The receiver holds the first block already (a prefix-cache hit).
	sp2, err := kvplan.WithoutPositions(sp, []int{0})
	require.NoError(t, err)
	dp2, err := kvplan.WithoutPositions(dp, []int{0})
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1}, sp2.Blocks())
	require.Equal(t, []int32{2, 0}, dp2.Blocks())
	require.NoError(t, layout.Compatible(sp2, dp2))
	require.Equal(t, sp.Bytes()*2/3, sp2.Bytes())

	for _, bad := range [][]int{{3}, {-1}, {1, 1}, {0, 1, 2}} {
		_, err := kvplan.WithoutPositions(sp, bad)
		require.Error(t, err, "positions %v", bad)
	}
}

// CompatibleShapes, which the engine applies to the shape a peer reports, gives the verdict and
// the error layout.Compatible gives for the two plans: they are written twice (layout cannot
// import this package), so they are held equal here, plans that differ in each dimension and
// plans that agree.
func TestCompatibleShapesAgreesWithLayoutCompatible(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	agreeing, differing := 0, 0
	for i := range 2000 {
		a, b := layouttest.RandomPlan(r), layouttest.RandomPlan(r)
		if i%4 == 0 { // the same stream through other strides and blocks
			l := layout.Packed(a.Layout().Dims(), layout.Order(r.IntN(3)))
			var err error
			b, err = layout.NewPlan(l, a.Selection(), a.Blocks())
			require.NoError(t, err)
		}
		want := layout.Compatible(a, b)
		got := kvplan.CompatibleShapes(kvplan.ShapeOf(a), kvplan.ShapeOf(b))
		if want == nil {
			agreeing++
			require.NoError(t, got, "case %d", i)
			continue
		}
		differing++
		require.Error(t, got, "case %d", i)
		require.Equal(t, want.Error(), got.Error(), "case %d", i)
		require.True(t, errors.Is(got, layout.ErrIncompatible), "case %d", i)
	}
	require.Positive(t, agreeing)
	require.Positive(t, differing)
}
