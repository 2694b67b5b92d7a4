// SPDX-License-Identifier: Apache-2.0

package layout_test

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

var small = layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 8, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 3}

func TestPackedOrdersValidateAndSpan(t *testing.T) {
	for _, o := range []layout.Order{layout.BlockMajor, layout.LayerMajor, layout.LayerMajorNHD} {
		t.Run(o.String(), func(t *testing.T) {
			l := layout.Packed(small, o)
			require.NoError(t, l.Validate())
			require.Equal(t, 3*l.BlockBytes(), l.SpanBytes(), "a packed pool spans exactly its payload")
		})
	}
}

func TestValidateNamesTheField(t *testing.T) {
	base := layout.Packed(small, layout.BlockMajor)
	cases := []struct {
		desc  string
		edit  func(*layout.Layout)
		field string
	}{
		{"zero layers", func(l *layout.Layout) { l.NumLayers = 0 }, "NumLayers"},
		{"negative heads", func(l *layout.Layout) { l.NumHeads = -1 }, "NumHeads"},
		{"zero blocks", func(l *layout.Layout) { l.NumBlocks = 0 }, "NumBlocks"},
		{"kv factor 3", func(l *layout.Layout) { l.KVFactor = 3 }, "KVFactor"},
		{"element size 3", func(l *layout.Layout) { l.ElemSize = 3 }, "ElemSize"},
		{"element size 8", func(l *layout.Layout) { l.ElemSize = 8 }, "ElemSize"},
		{"negative stride", func(l *layout.Layout) { l.StrideHead = -64 }, "StrideHead"},
		{"tokens overlap the row", func(l *layout.Layout) { l.StrideToken = 8 }, "StrideToken"},
		{"heads overlap tokens", func(l *layout.Layout) { l.StrideHead = 16 }, "StrideHead|StrideToken"},
		{"blocks overlap layers", func(l *layout.Layout) { l.StrideBlock = l.StrideLayer }, "StrideBlock|StrideLayer"},
		{"dimension too large", func(l *layout.Layout) { l.HeadDim = 1 << 40 }, "HeadDim"},
		{"span overflows", func(l *layout.Layout) {
			l.NumBlocks = 1 << 30
			l.StrideBlock = math.MaxInt64 / 4
		}, "StrideBlock"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			l := base
			c.edit(&l)
			err := l.Validate()
			require.ErrorIs(t, err, layout.ErrInvalidLayout)
			var fe *layout.FieldError
			require.ErrorAs(t, err, &fe)
			require.Contains(t, strings.Split(c.field, "|"), fe.Field, "error: %v", err)
		})
	}
}

func TestPaddedAndUnusedStridesAreValid(t *testing.T) {
	l := layout.Packed(small, layout.LayerMajor)
	l.StrideBlock += 64 // padding between blocks
	l.StrideKV = l.StrideBlock * l.NumBlocks
	l.StrideLayer = l.StrideKV * 2
	require.NoError(t, l.Validate())

	mla := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 1, NumHeads: 1, HeadDim: 576, ElemSize: 2, TokensPerBlock: 64, NumBlocks: 2}, layout.BlockMajor)
	mla.StrideKV, mla.StrideHead = 0, 0 // dimensions of extent 1 need no stride
	require.NoError(t, mla.Validate())
}

func TestNewPlanRefusesBadInput(t *testing.T) {
	l := layout.Packed(small, layout.BlockMajor)
	cases := []struct {
		desc   string
		sel    layout.Selection
		blocks []int32
		want   error
		field  string
	}{
		{"block id past the pool", l.All(), []int32{0, 3}, layout.ErrOutOfRange, "Blocks[1]"},
		{"negative block id", l.All(), []int32{-1}, layout.ErrOutOfRange, "Blocks[0]"},
		{"duplicate block", l.All(), []int32{2, 0, 2}, layout.ErrDuplicateBlock, "Blocks[2]"},
		{"no blocks", l.All(), nil, layout.ErrOutOfRange, "Blocks"},
		{"layer range past the pool", layout.Selection{LayerBegin: 0, LayerEnd: 3, HeadBegin: 0, HeadEnd: 4}, []int32{0}, layout.ErrOutOfRange, "LayerEnd"},
		{"empty head range", layout.Selection{LayerBegin: 0, LayerEnd: 2, HeadBegin: 2, HeadEnd: 2}, []int32{0}, layout.ErrOutOfRange, "HeadEnd"},
		{"negative head", layout.Selection{LayerBegin: 0, LayerEnd: 2, HeadBegin: -1, HeadEnd: 2}, []int32{0}, layout.ErrOutOfRange, "HeadBegin"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			_, err := layout.NewPlan(l, c.sel, c.blocks)
			require.ErrorIs(t, err, c.want)
			var fe *layout.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, c.field, fe.Field)
		})
	}
	bad := l
	bad.ElemSize = 0
	_, err := layout.NewPlan(bad, l.All(), []int32{0})
	require.ErrorIs(t, err, layout.ErrInvalidLayout)
}

func TestCompatibleNamesTheDifference(t *testing.T) {
	l := layout.Packed(small, layout.BlockMajor)
	src, err := layout.NewPlan(l, l.All(), []int32{0, 1})
	require.NoError(t, err)
	other := layout.Packed(small, layout.LayerMajorNHD)
	dst, err := layout.NewPlan(other, other.All(), []int32{2, 0})
	require.NoError(t, err)
	require.NoError(t, layout.Compatible(src, dst), "strides may differ")

	half, err := layout.NewPlan(l, layout.Selection{LayerBegin: 0, LayerEnd: 2, HeadBegin: 0, HeadEnd: 2}, []int32{0, 1})
	require.NoError(t, err)
	err = layout.Compatible(src, half)
	require.ErrorIs(t, err, layout.ErrIncompatible)
	var fe *layout.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "Heads", fe.Field)
}
