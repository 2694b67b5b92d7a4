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
	span   int64 // layout.SpanBytes(), computed once
}

// Shape is what a plan's stream is made of, independent of the pool's strides. Two plans move
// the same bytes exactly when their shapes are equal.
type Shape struct {
	Layers         int64
	KVFactor       int64
	Blocks         int64
	Heads          int64
	TokensPerBlock int64
	HeadDim        int64
	ElemSize       int64
}

// bytes is the stream size of the shape.
func (s Shape) bytes() int64 {
	return s.Layers * s.KVFactor * s.Blocks * s.Heads * s.TokensPerBlock * s.HeadDim * s.ElemSize
}

// Chunk is a byte range [Offset, Offset+Length) of a plan's stream.
type Chunk struct {
	Offset int64
	Length int64
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
	return &Plan{layout: l, sel: sel, blocks: append([]int32(nil), blocks...), span: l.SpanBytes()}, nil
}

// PoolSpan is the number of bytes the plan's pool must hold (Layout.SpanBytes, kept).
func (p *Plan) PoolSpan() int64 { return p.span }

// Layout returns the pool layout the plan reads or writes.
func (p *Plan) Layout() Layout { return p.layout }

// Selection returns the plan's layer and head ranges.
func (p *Plan) Selection() Selection { return p.sel }

// Blocks returns the plan's block ids in stream order. The slice is shared: do not modify it.
func (p *Plan) Blocks() []int32 { return p.blocks }

// Shape returns what the plan's stream is made of.
func (p *Plan) Shape() Shape {
	return Shape{
		Layers: p.sel.Layers(), KVFactor: p.layout.KVFactor, Blocks: int64(len(p.blocks)),
		Heads: p.sel.Heads(), TokensPerBlock: p.layout.TokensPerBlock,
		HeadDim: p.layout.HeadDim, ElemSize: p.layout.ElemSize,
	}
}

// Bytes is the size of the plan's stream.
func (p *Plan) Bytes() int64 { return p.Shape().bytes() }

// Units is the number of token rows in the stream.
func (p *Plan) Units() int64 { return p.Bytes() / p.layout.RowBytes() }

// RunUnits is how many consecutive stream units lie back to back in the pool (see
// kvx_run_units): the length, in rows, of the contiguous copies a gather or scatter makes.
func (p *Plan) RunUnits() int64 {
	l, s := p.layout, p.sel
	row := l.RowBytes()
	if l.TokensPerBlock > 1 && l.StrideToken != row {
		return 1
	}
	if s.Heads() > 1 && l.StrideHead != row*l.TokensPerBlock {
		return l.TokensPerBlock
	}
	return s.Heads() * l.TokensPerBlock
}

// UnitOffset is the byte offset in the pool of stream unit u (see kvx_unit_offset).
func (p *Plan) UnitOffset(u int64) int64 {
	l, s := p.layout, p.sel
	t := u % l.TokensPerBlock
	u /= l.TokensPerBlock
	h := u % s.Heads()
	u /= s.Heads()
	b := u % int64(len(p.blocks))
	u /= int64(len(p.blocks))
	k := u % l.KVFactor
	layer := u / l.KVFactor
	return int64(p.blocks[b])*l.StrideBlock + (s.LayerBegin+layer)*l.StrideLayer +
		k*l.StrideKV + (s.HeadBegin+h)*l.StrideHead + t*l.StrideToken
}

// Chunks splits the stream into consecutive ranges of at most maxBytes, cut on element
// boundaries. maxBytes is rounded down to a whole number of elements and must hold at least
// one element.
func (p *Plan) Chunks(maxBytes int64) ([]Chunk, error) {
	elem := p.layout.ElemSize
	size := maxBytes - maxBytes%elem
	if size <= 0 {
		return nil, rangeErr("maxBytes", maxBytes, fmt.Sprintf("must hold at least one %d-byte element", elem))
	}
	total := p.Bytes()
	chunks := make([]Chunk, 0, (total+size-1)/size)
	for off := int64(0); off < total; off += size {
		chunks = append(chunks, Chunk{Offset: off, Length: min(size, total-off)})
	}
	return chunks, nil
}

// CheckRange verifies that [off, off+n) lies within the stream.
func (p *Plan) CheckRange(off, n int64) error {
	if off < 0 || n < 0 || off > p.Bytes() || n > p.Bytes()-off {
		return rangeErr("range", off, fmt.Sprintf("[%d, +%d) is outside the %d-byte stream", off, n, p.Bytes()))
	}
	return nil
}

// Compatible reports whether a sender's plan and a receiver's plan describe the same byte
// stream, so that scattering what one gathered puts every element where it belongs. The error
// names the first dimension that differs and matches ErrIncompatible.
func Compatible(src, dst *Plan) error { return CompatibleShapes(src.Shape(), dst.Shape()) }

// CompatibleShapes is Compatible for two shapes, as a peer reports its own.
func CompatibleShapes(a, b Shape) error {
	diffs := []struct {
		name string
		x, y int64
	}{
		{"Layers", a.Layers, b.Layers}, {"KVFactor", a.KVFactor, b.KVFactor},
		{"Blocks", a.Blocks, b.Blocks}, {"Heads", a.Heads, b.Heads},
		{"TokensPerBlock", a.TokensPerBlock, b.TokensPerBlock},
		{"HeadDim", a.HeadDim, b.HeadDim}, {"ElemSize", a.ElemSize, b.ElemSize},
	}
	for _, d := range diffs {
		if d.x != d.y {
			return &FieldError{Field: d.name, Value: d.y,
				Reason: fmt.Sprintf("receiver has %d, sender has %d", d.y, d.x), Err: ErrIncompatible}
		}
	}
	return nil
}

// WithoutPositions returns the plan without the blocks at the given positions of its block
// list: for a partial transfer, where the receiver already holds some of the request's blocks
// (a prefix-cache hit) and only the others move. Sender and receiver drop the same positions
// of their own block lists, so their streams still agree. Positions must be distinct, in
// range, and leave at least one block.
func (p *Plan) WithoutPositions(positions []int) (*Plan, error) {
	drop := make(map[int]bool, len(positions))
	for i, pos := range positions {
		if pos < 0 || pos >= len(p.blocks) {
			return nil, rangeErr(fmt.Sprintf("positions[%d]", i), int64(pos), fmt.Sprintf("must be in [0, %d)", len(p.blocks)))
		}
		if drop[pos] {
			return nil, &FieldError{Field: fmt.Sprintf("positions[%d]", i), Value: int64(pos),
				Reason: "listed twice", Err: ErrDuplicateBlock}
		}
		drop[pos] = true
	}
	keep := make([]int32, 0, len(p.blocks)-len(drop))
	for i, b := range p.blocks {
		if !drop[i] {
			keep = append(keep, b)
		}
	}
	if len(keep) == 0 {
		return nil, rangeErr("positions", int64(len(positions)), "a partial transfer must leave at least one block to move")
	}
	return &Plan{layout: p.layout, sel: p.sel, blocks: keep, span: p.span}, nil
}
