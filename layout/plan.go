// SPDX-License-Identifier: Apache-2.0

package layout

import (
	"fmt"
	"math"
)

// Plan maps one request's blocks, through a Selection of a pool's layers and heads, to a
// contiguous byte stream. It is immutable once built.
type Plan struct {
	layout Layout
	sel    Selection
	blocks []int32
}

// NewPlan validates the layout, the selection and the block ids, and builds a plan. Block ids
// must be in [0, NumBlocks) and distinct. The block list is copied.
func NewPlan(l Layout, sel Selection, blocks []int32) (*Plan, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if l.NumBlocks > math.MaxInt32 {
		return nil, invalid("NumBlocks", l.NumBlocks, "block ids are int32: at most 2^31-1 blocks")
	}
	if err := sel.validate(l); err != nil {
		return nil, err
	}
	if len(blocks) == 0 {
		return nil, rangeErr("Blocks", 0, "a plan needs at least one block")
	}
	if int64(len(blocks)) > l.NumBlocks {
		return nil, rangeErr("Blocks", int64(len(blocks)), fmt.Sprintf("more blocks than the pool's %d", l.NumBlocks))
	}
	seen := make(map[int32]int, len(blocks))
	for i, b := range blocks {
		if b < 0 || int64(b) >= l.NumBlocks {
			return nil, rangeErr(fmt.Sprintf("Blocks[%d]", i), int64(b), fmt.Sprintf("must be in [0, %d)", l.NumBlocks))
		}
		if j, dup := seen[b]; dup {
			return nil, &FieldError{Field: fmt.Sprintf("Blocks[%d]", i), Value: int64(b),
				Reason: fmt.Sprintf("already listed at Blocks[%d]", j), Err: ErrDuplicateBlock}
		}
		seen[b] = i
	}
	return &Plan{layout: l, sel: sel, blocks: append([]int32(nil), blocks...)}, nil
}

// Layout returns the pool layout the plan reads or writes.
func (p *Plan) Layout() Layout { return p.layout }

// Selection returns the plan's layer and head ranges.
func (p *Plan) Selection() Selection { return p.sel }

// Blocks returns the plan's block ids in stream order. The slice is shared: do not modify it.
func (p *Plan) Blocks() []int32 { return p.blocks }

// Bytes is the size of the plan's stream.
func (p *Plan) Bytes() int64 {
	n := int64(1)
	for _, d := range p.dims() {
		n *= d
	}
	return n
}

// Compatible reports whether a sender's plan and a receiver's plan describe the same byte
// stream, so that scattering what one gathered puts every element where it belongs: the same
// number of layers, K/V planes, blocks, heads, tokens a block, head dimension and element
// size, whatever the pools' strides. The error names the first dimension that differs and
// matches ErrIncompatible.
func Compatible(src, dst *Plan) error {
	a, b := src.dims(), dst.dims()
	for i, name := range dimNames {
		if a[i] != b[i] {
			return &FieldError{Field: name, Value: b[i],
				Reason: fmt.Sprintf("receiver has %d, sender has %d", b[i], a[i]), Err: ErrIncompatible}
		}
	}
	return nil
}

// dimNames names what dims lists, in the order Compatible compares them.
var dimNames = [7]string{"Layers", "KVFactor", "Blocks", "Heads", "TokensPerBlock", "HeadDim", "ElemSize"}

// dims is what the plan's stream is made of, in dimNames' order.
func (p *Plan) dims() [7]int64 {
	l := p.layout
	return [7]int64{p.sel.Layers(), l.KVFactor, int64(len(p.blocks)), p.sel.Heads(), l.TokensPerBlock, l.HeadDim, l.ElemSize}
}
