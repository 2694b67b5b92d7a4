// SPDX-License-Identifier: Apache-2.0

package kvplan

import (
	"fmt"

	"github.com/kvxfer/kvxfer/layout"
)

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

// ShapeOf returns what p's stream is made of.
func ShapeOf(p *layout.Plan) Shape {
	l, s := p.Layout(), p.Selection()
	return Shape{
		Layers: s.Layers(), KVFactor: l.KVFactor, Blocks: int64(len(p.Blocks())),
		Heads: s.Heads(), TokensPerBlock: l.TokensPerBlock,
		HeadDim: l.HeadDim, ElemSize: l.ElemSize,
	}
}

// Bytes is the stream size of the shape.
func (s Shape) Bytes() int64 {
	return s.Layers * s.KVFactor * s.Blocks * s.Heads * s.TokensPerBlock * s.HeadDim * s.ElemSize
}

// Chunk is a byte range [Offset, Offset+Length) of a plan's stream.
type Chunk struct {
	Offset int64
	Length int64
}

// PoolSpan is the number of bytes p's pool must hold (Layout.SpanBytes).
func PoolSpan(p *layout.Plan) int64 { return p.Layout().SpanBytes() }

// Units is the number of token rows in p's stream.
func Units(p *layout.Plan) int64 { return p.Bytes() / p.Layout().RowBytes() }

// RunUnits is how many consecutive stream units lie back to back in the pool (see
// kvx_run_units): the length, in rows, of the contiguous copies a gather or scatter makes.
func RunUnits(p *layout.Plan) int64 { return runUnits(p.Layout(), p.Selection()) }

func runUnits(l layout.Layout, s layout.Selection) int64 {
	switch runLevel(l, s) {
	case 0:
		return 1
	case 1:
		return l.TokensPerBlock
	}
	return s.Heads() * l.TokensPerBlock
}

// runLevel is which stream digit a run spans: 0, one row; 1, a head's tokens; 2, a block's
// heads and tokens.
func runLevel(l layout.Layout, s layout.Selection) int {
	row := l.RowBytes()
	if l.TokensPerBlock > 1 && l.StrideToken != row {
		return 0
	}
	if s.Heads() > 1 && l.StrideHead != row*l.TokensPerBlock {
		return 1
	}
	return 2
}

// UnitOffset is the byte offset in the pool of stream unit u (see kvx_unit_offset).
func UnitOffset(p *layout.Plan, u int64) int64 {
	return unitOffset(p.Layout(), p.Selection(), p.Blocks(), u)
}

func unitOffset(l layout.Layout, s layout.Selection, blocks []int32, u int64) int64 {
	w := newUnitWalk(l, s, blocks, u)
	return w.offset()
}

// Chunks splits p's stream into consecutive ranges of at most maxBytes, cut on element
// boundaries. maxBytes is rounded down to a whole number of elements and must hold at least
// one element.
func Chunks(p *layout.Plan, maxBytes int64) ([]Chunk, error) {
	elem := p.Layout().ElemSize
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

// CheckRange verifies that [off, off+n) lies within p's stream; the error matches
// layout.ErrOutOfRange.
func CheckRange(p *layout.Plan, off, n int64) error {
	if total := p.Bytes(); off < 0 || n < 0 || off > total || n > total-off {
		return rangeErr("range", off, fmt.Sprintf("[%d, +%d) is outside the %d-byte stream", off, n, total))
	}
	return nil
}

// Runs walks stream bytes [off, off+n) of p as pool ranges, in stream order: fn gets each
// range's pool offset, its stream offset and its length. Ranges that lie back to back in the
// pool are merged, so a plan whose blocks are contiguous (a block-major pool moving whole
// blocks) yields few, long ranges. It is what a one-copy path hands the network as an IOV
// list instead of gathering into a staging buffer. It returns an error matching
// layout.ErrOutOfRange (from CheckRange) for a range outside the stream and calls fn for
// nothing then.
func Runs(p *layout.Plan, off, n int64, fn func(poolOff, streamOff, length int64)) error {
	if err := CheckRange(p, off, n); err != nil {
		return err
	}
	l, s, blocks := p.Layout(), p.Selection(), p.Blocks()
	row := l.RowBytes()
	level := runLevel(l, s)
	// Divide once, at the start; from there the walk carries the unit's digits forward (the
	// pieces after the first start at run boundaries, in = 0).
	w := newUnitWalk(l, s, blocks, off/row)
	in := off % row
	var curPool, curStream, curLen int64 // the range being merged; curLen 0: none yet
	for pos := int64(0); pos < n; {
		st := off + pos
		k := min(w.unitsLeft(level)*row-in, n-pos)
		at := w.offset() + in
		if curLen > 0 && curPool+curLen == at {
			curLen += k
		} else {
			if curLen > 0 {
				fn(curPool, curStream, curLen)
			}
			curPool, curStream, curLen = at, st, k
		}
		pos += k
		in = 0
		w.next(level)
	}
	if curLen > 0 {
		fn(curPool, curStream, curLen)
	}
	return nil
}

// unitWalk is a stream unit as its digits (token, head, block, kv, layer: the stream's order,
// kvx_unit_offset), stepped run by run without dividing.
type unitWalk struct {
	blocks                        []int32
	tokens, heads, nblocks, kvf   int64
	sBlock, sLayer, sKV, sH, sTok int64
	layerBegin, headBegin         int64
	t, h, b, kv, layer            int64
}

func newUnitWalk(l layout.Layout, s layout.Selection, blocks []int32, u int64) unitWalk {
	w := unitWalk{blocks: blocks, tokens: l.TokensPerBlock, heads: s.Heads(),
		nblocks: int64(len(blocks)), kvf: l.KVFactor,
		sBlock: l.StrideBlock, sLayer: l.StrideLayer, sKV: l.StrideKV, sH: l.StrideHead, sTok: l.StrideToken,
		layerBegin: s.LayerBegin, headBegin: s.HeadBegin}
	w.t = u % l.TokensPerBlock
	u /= l.TokensPerBlock
	w.h = u % w.heads
	u /= w.heads
	w.b = u % w.nblocks
	u /= w.nblocks
	w.kv = u % l.KVFactor
	w.layer = u / l.KVFactor
	return w
}

// unitsLeft is how many units remain from w to the end of its run (runs start at multiples of
// the run length in the stream: see kvx_run_units).
func (w *unitWalk) unitsLeft(level int) int64 {
	switch level {
	case 0:
		return 1
	case 1:
		return w.tokens - w.t
	}
	return (w.heads-w.h)*w.tokens - w.t
}

// next moves w to the start of the next run.
func (w *unitWalk) next(level int) {
	switch level {
	case 0:
		w.t++
	case 1:
		w.t = 0
		w.h++
	default:
		w.t, w.h = 0, 0
		w.b++
	}
	if w.t == w.tokens {
		w.t = 0
		w.h++
	}
	if w.h == w.heads {
		w.h = 0
		w.b++
	}
	if w.b == w.nblocks {
		w.b = 0
		w.kv++
	}
	if w.kv == w.kvf {
		w.kv = 0
		w.layer++
	}
}

// offset is unitOffset of w's unit.
func (w *unitWalk) offset() int64 {
	return int64(w.blocks[w.b])*w.sBlock + (w.layerBegin+w.layer)*w.sLayer +
		w.kv*w.sKV + (w.headBegin+w.h)*w.sH + w.t*w.sTok
}

// CompatibleShapes is layout.Compatible for two shapes, as a peer reports its own: the same
// verdict and the same error (a test holds the two equal).
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
			return &layout.FieldError{Field: d.name, Value: d.y,
				Reason: fmt.Sprintf("receiver has %d, sender has %d", d.y, d.x), Err: layout.ErrIncompatible}
		}
	}
	return nil
}

// WithoutPositions returns p without the blocks at the given positions of its block list:
// for a partial transfer, where the receiver already holds some of the request's blocks (a
// prefix-cache hit) and only the others move. Sender and receiver drop the same positions of
// their own block lists, so their streams still agree. Positions must be distinct, in range,
// and leave at least one block.
func WithoutPositions(p *layout.Plan, positions []int) (*layout.Plan, error) {
	blocks := p.Blocks()
	drop := make(map[int]bool, len(positions))
	for i, pos := range positions {
		if pos < 0 || pos >= len(blocks) {
			return nil, rangeErr(fmt.Sprintf("positions[%d]", i), int64(pos), fmt.Sprintf("must be in [0, %d)", len(blocks)))
		}
		if drop[pos] {
			return nil, &layout.FieldError{Field: fmt.Sprintf("positions[%d]", i), Value: int64(pos),
				Reason: "listed twice", Err: layout.ErrDuplicateBlock}
		}
		drop[pos] = true
	}
	keep := make([]int32, 0, len(blocks)-len(drop))
	for i, b := range blocks {
		if !drop[i] {
			keep = append(keep, b)
		}
	}
	if len(keep) == 0 {
		return nil, rangeErr("positions", int64(len(positions)), "a partial transfer must leave at least one block to move")
	}
	return layout.NewPlan(p.Layout(), p.Selection(), keep)
}

func rangeErr(field string, v int64, reason string) error {
	return &layout.FieldError{Field: field, Value: v, Reason: reason, Err: layout.ErrOutOfRange}
}
