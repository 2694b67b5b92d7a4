// SPDX-License-Identifier: Apache-2.0

package layout

import (
	"fmt"
	"math/bits"
)

// Layout describes a paged KV pool. It mirrors kvx_layout_t in include/kvx/kvx_layout.h field
// for field; every field is an int64 so the two agree on every ABI. A token's row of HeadDim
// elements is contiguous; every other dimension has its own stride in bytes.
type Layout struct {
	NumLayers      int64 // layers held by this pool (this PP rank's share)
	KVFactor       int64 // 2 for separate K and V, 1 for MLA's joint latent
	NumHeads       int64 // KV heads held by this pool (this TP rank's share)
	HeadDim        int64 // elements per head per token
	ElemSize       int64 // bytes per element: 1 (FP8), 2 (BF16/FP16) or 4 (FP32)
	TokensPerBlock int64 // tokens per paged block; must match between peers
	NumBlocks      int64 // blocks in the pool; ids are 0..NumBlocks-1
	StrideBlock    int64 // bytes between block b and b+1
	StrideLayer    int64 // bytes between layer l and l+1
	StrideKV       int64 // bytes between K and V (ignored when KVFactor is 1)
	StrideHead     int64 // bytes between head h and h+1
	StrideToken    int64 // bytes between token t and t+1 within a block
}

// Dims are a pool's dimensions without strides; Order turns them into a packed Layout.
type Dims struct {
	NumLayers      int64
	KVFactor       int64
	NumHeads       int64
	HeadDim        int64
	ElemSize       int64
	TokensPerBlock int64
	NumBlocks      int64
}

// Order names a packed arrangement of a pool's dimensions, outermost first.
type Order int

// The packed orders kvxfer knows by name. Any other arrangement can be written as a Layout
// with explicit strides.
const (
	// BlockMajor is [block][layer][kv][head][token][dim]: each block holds all its layers
	// (TensorRT-LLM's paged pool).
	BlockMajor Order = iota
	// LayerMajor is [layer][kv][block][head][token][dim]: one tensor per layer, heads
	// before tokens (HND).
	LayerMajor
	// LayerMajorNHD is [layer][kv][block][token][head][dim]: one tensor per layer, tokens
	// before heads (vLLM's NHD).
	LayerMajorNHD
)

// String returns the order's name as used in flags and messages.
func (o Order) String() string {
	switch o {
	case BlockMajor:
		return "block-major"
	case LayerMajor:
		return "layer-major"
	case LayerMajorNHD:
		return "layer-major-nhd"
	}
	return fmt.Sprintf("order(%d)", int(o))
}

// Packed returns the layout of dims packed in the given order, with no padding. The result is
// not validated: call Validate.
func Packed(d Dims, o Order) Layout {
	l := Layout{
		NumLayers: d.NumLayers, KVFactor: d.KVFactor, NumHeads: d.NumHeads, HeadDim: d.HeadDim,
		ElemSize: d.ElemSize, TokensPerBlock: d.TokensPerBlock, NumBlocks: d.NumBlocks,
	}
	row := d.HeadDim * d.ElemSize
	switch o {
	case BlockMajor:
		l.StrideToken = row
		l.StrideHead = l.StrideToken * d.TokensPerBlock
		l.StrideKV = l.StrideHead * d.NumHeads
		l.StrideLayer = l.StrideKV * d.KVFactor
		l.StrideBlock = l.StrideLayer * d.NumLayers
	case LayerMajor:
		l.StrideToken = row
		l.StrideHead = l.StrideToken * d.TokensPerBlock
		l.StrideBlock = l.StrideHead * d.NumHeads
		l.StrideKV = l.StrideBlock * d.NumBlocks
		l.StrideLayer = l.StrideKV * d.KVFactor
	case LayerMajorNHD:
		l.StrideHead = row
		l.StrideToken = l.StrideHead * d.NumHeads
		l.StrideBlock = l.StrideToken * d.TokensPerBlock
		l.StrideKV = l.StrideBlock * d.NumBlocks
		l.StrideLayer = l.StrideKV * d.KVFactor
	}
	return l
}

// Dims returns the layout's dimensions without its strides.
func (l Layout) Dims() Dims {
	return Dims{
		NumLayers: l.NumLayers, KVFactor: l.KVFactor, NumHeads: l.NumHeads, HeadDim: l.HeadDim,
		ElemSize: l.ElemSize, TokensPerBlock: l.TokensPerBlock, NumBlocks: l.NumBlocks,
	}
}

// RowBytes is the size of one token's row for one head: HeadDim elements.
func (l Layout) RowBytes() int64 { return l.HeadDim * l.ElemSize }

// BlockBytes is the payload one block holds over all layers, kv and heads.
func (l Layout) BlockBytes() int64 {
	return l.NumLayers * l.KVFactor * l.NumHeads * l.TokensPerBlock * l.RowBytes()
}

// All selects every layer and head of the layout.
func (l Layout) All() Selection {
	return Selection{LayerBegin: 0, LayerEnd: l.NumLayers, HeadBegin: 0, HeadEnd: l.NumHeads}
}

// maxDim bounds every dimension so that products of a few of them cannot overflow before the
// overflow checks run; no real pool comes near it.
const maxDim = 1 << 31

// Validate checks that the layout describes real memory: positive dimensions, a supported
// element size, non-negative strides, no two elements at the same address, and a span that
// fits in 64 bits. The error is a *FieldError naming the offending field; it matches
// ErrInvalidLayout with errors.Is.
func (l Layout) Validate() error {
	dims := []struct {
		name string
		v    int64
	}{
		{"NumLayers", l.NumLayers}, {"KVFactor", l.KVFactor}, {"NumHeads", l.NumHeads},
		{"HeadDim", l.HeadDim}, {"ElemSize", l.ElemSize}, {"TokensPerBlock", l.TokensPerBlock},
		{"NumBlocks", l.NumBlocks},
	}
	for _, d := range dims {
		if d.v <= 0 {
			return invalid(d.name, d.v, "must be positive")
		}
		if d.v > maxDim {
			return invalid(d.name, d.v, fmt.Sprintf("must be at most %d", int64(maxDim)))
		}
	}
	if l.KVFactor != 1 && l.KVFactor != 2 {
		return invalid("KVFactor", l.KVFactor, "must be 1 (MLA) or 2 (K and V)")
	}
	if l.ElemSize != 1 && l.ElemSize != 2 && l.ElemSize != 4 {
		return invalid("ElemSize", l.ElemSize, "must be 1, 2 or 4 bytes")
	}
	row, ok := mul(l.HeadDim, l.ElemSize)
	if !ok {
		return invalid("HeadDim", l.HeadDim, "row size overflows 64 bits")
	}
	strided := l.stridedDims()
	for _, d := range strided {
		if d.stride < 0 {
			return invalid(d.name, d.stride, "must not be negative")
		}
	}
	if _, err := nonOverlappingSpan(row, strided); err != nil {
		return err
	}
	return nil
}

// SpanBytes is how many bytes the pool's memory must hold: one past the highest byte any
// element occupies. It is only meaningful for a valid layout (-1 otherwise).
func (l Layout) SpanBytes() int64 {
	span, err := nonOverlappingSpan(l.RowBytes(), l.stridedDims())
	if err != nil {
		return -1
	}
	return span
}

func (l Layout) stridedDims() [5]stridedDim {
	return [5]stridedDim{
		{"StrideBlock", l.StrideBlock, l.NumBlocks},
		{"StrideLayer", l.StrideLayer, l.NumLayers},
		{"StrideKV", l.StrideKV, l.KVFactor},
		{"StrideHead", l.StrideHead, l.NumHeads},
		{"StrideToken", l.StrideToken, l.TokensPerBlock},
	}
}

type stridedDim struct {
	name   string
	stride int64
	count  int64
}

// nonOverlappingSpan sorts the strided dimensions by stride and requires each stride to step
// past everything the smaller ones reach: that is exactly when no two elements share an
// address. It returns the resulting span. It works on a copy and does not allocate.
func nonOverlappingSpan(row int64, ds [5]stridedDim) (int64, error) {
	for i := 1; i < len(ds); i++ { // insertion sort: stable, five elements
		for j := i; j > 0 && ds[j].stride < ds[j-1].stride; j-- {
			ds[j], ds[j-1] = ds[j-1], ds[j]
		}
	}
	extent := row
	for _, d := range ds {
		if d.count == 1 {
			continue
		}
		if d.stride < extent {
			return 0, invalid(d.name, d.stride, fmt.Sprintf(
				"overlaps: must be at least %d bytes, the extent of the dimensions inside it", extent))
		}
		reach, ok := mul(d.stride, d.count-1)
		if !ok {
			return 0, invalid(d.name, d.stride, "pool span overflows 64 bits")
		}
		if extent, ok = add(reach, extent); !ok {
			return 0, invalid(d.name, d.stride, "pool span overflows 64 bits")
		}
	}
	return extent, nil
}

func mul(a, b int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > 1<<63-1 {
		return 0, false
	}
	return int64(lo), true
}

func add(a, b int64) (int64, bool) {
	s := a + b
	if s < a {
		return 0, false
	}
	return s, true
}

// Selection is a half-open range of layers and heads in a pool's own indices. A TP=2 context
// rank sends all of its heads, and the TP=1 generation rank receives them into its heads
// [0, H/2) from rank 0 and [H/2, H) from rank 1; PP splits the same way by layers.
type Selection struct {
	LayerBegin int64
	LayerEnd   int64
	HeadBegin  int64
	HeadEnd    int64
}

// Layers is the number of selected layers.
func (s Selection) Layers() int64 { return s.LayerEnd - s.LayerBegin }

// Heads is the number of selected heads.
func (s Selection) Heads() int64 { return s.HeadEnd - s.HeadBegin }

// validate checks the selection against a valid layout.
func (s Selection) validate(l Layout) error {
	switch {
	case s.LayerBegin < 0 || s.LayerBegin >= l.NumLayers:
		return rangeErr("LayerBegin", s.LayerBegin, fmt.Sprintf("must be in [0, %d)", l.NumLayers))
	case s.LayerEnd <= s.LayerBegin || s.LayerEnd > l.NumLayers:
		return rangeErr("LayerEnd", s.LayerEnd, fmt.Sprintf("must be in (%d, %d]", s.LayerBegin, l.NumLayers))
	case s.HeadBegin < 0 || s.HeadBegin >= l.NumHeads:
		return rangeErr("HeadBegin", s.HeadBegin, fmt.Sprintf("must be in [0, %d)", l.NumHeads))
	case s.HeadEnd <= s.HeadBegin || s.HeadEnd > l.NumHeads:
		return rangeErr("HeadEnd", s.HeadEnd, fmt.Sprintf("must be in (%d, %d]", s.HeadBegin, l.NumHeads))
	}
	return nil
}
