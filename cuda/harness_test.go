// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

// kernelCase is one plan and the stream ranges to move with it, shared by the CPU emulation
// tests (every host) and the device tests (gpu tag), so both check the same ground.
type kernelCase struct {
	desc      string
	plan      *layout.Plan
	chunks    []kvplan.Chunk
	poolShift int   // bytes past 16-byte alignment of the pool's base
	bufShift  int   // bytes past 16-byte alignment of the stream buffer
	ctas      int64 // grid size the emulation sizes work items for
}

// gridSizes span one CTA (whole groups per item, several rounds each) to many (one round per
// item, several items per group).
var gridSizes = []int64{1, 2, 7, 1000}

// Shifts exercise every vector width: 0 keeps 16-byte copies possible, the others force 8, 4,
// 2 and 1.
var shifts = []int{0, 0, 0, 8, 4, 2, 1}

// randomLayout draws a pool: one of the packed orders or a padded layout whose strides are not
// the packed ones, so every run mode of the kernels (whole group, per head, per row) appears.
func randomLayout(r *rand.Rand) (layout.Layout, string) {
	d := layout.Dims{
		NumLayers:      1 + r.Int64N(4),
		KVFactor:       []int64{1, 2}[r.IntN(2)], // 1 is MLA
		NumHeads:       1 + r.Int64N(4),
		HeadDim:        []int64{1, 3, 8, 16, 64, 72}[r.IntN(6)],
		ElemSize:       []int64{1, 2, 4}[r.IntN(3)],
		TokensPerBlock: []int64{1, 2, 5, 16}[r.IntN(4)],
		NumBlocks:      3 + r.Int64N(7),
	}
	switch k := r.IntN(4); k {
	case 0, 1, 2:
		o := []layout.Order{layout.BlockMajor, layout.LayerMajor, layout.LayerMajorNHD}[k]
		return layout.Packed(d, o), o.String()
	default:
		l := layout.Packed(d, layout.LayerMajor)
		row := l.RowBytes()
		l.StrideToken = row + d.ElemSize*(1+r.Int64N(3))
		l.StrideHead = l.StrideToken*d.TokensPerBlock + r.Int64N(3)*d.ElemSize
		l.StrideBlock = l.StrideHead*d.NumHeads + 16
		l.StrideKV = l.StrideBlock * d.NumBlocks
		l.StrideLayer = l.StrideKV * d.KVFactor
		return l, "padded"
	}
}

// randomSelection picks all of the pool, a PP-style layer range, a TP-style head range, or both.
func randomSelection(r *rand.Rand, l layout.Layout, kind int) (layout.Selection, string) {
	s := l.All()
	name := "all"
	if (kind&1) != 0 && l.NumLayers > 1 {
		s.LayerBegin = r.Int64N(l.NumLayers - 1)
		s.LayerEnd = s.LayerBegin + 1 + r.Int64N(l.NumLayers-s.LayerBegin)
		name = "layers"
	}
	if (kind&2) != 0 && l.NumHeads > 1 {
		s.HeadBegin = r.Int64N(l.NumHeads - 1)
		s.HeadEnd = s.HeadBegin + 1 + r.Int64N(l.NumHeads-s.HeadBegin)
		name += "+heads"
	}
	return s, name
}

// randomChunks is the whole stream, the plan's own element-aligned chunking, and a few ranges
// with arbitrary byte bounds (the kernels take any byte range, as the host path does).
func randomChunks(r *rand.Rand, p *layout.Plan) []kvplan.Chunk {
	total := p.Bytes()
	chunks := []kvplan.Chunk{{Offset: 0, Length: total}}
	if cs, err := kvplan.Chunks(p, 1+r.Int64N(total)); err == nil && len(cs) > 1 {
		chunks = append(chunks, cs[r.IntN(len(cs))], cs[len(cs)-1])
	}
	for range 3 {
		off := r.Int64N(total)
		chunks = append(chunks, kvplan.Chunk{Offset: off, Length: 1 + r.Int64N(total-off)})
	}
	return append(chunks, kvplan.Chunk{Offset: total / 2, Length: 0})
}

// kernelCases draws n cases from seed: half from this file's generator, cycling through the
// four selection kinds so each gets its share and with head dims up to 72 so 16-byte vectors
// and multi-tile groups occur; half from layouttest, whose strides nest in any order.
func kernelCases(t *testing.T, seed uint64, n int) []kernelCase {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0x6b7678))
	cases := make([]kernelCase, 0, n)
	for i := range n {
		if i%2 == 1 {
			p := layouttest.RandomPlan(r)
			l := p.Layout()
			cases = append(cases, kernelCase{
				desc: fmt.Sprintf("%d/layouttest/kv%d/h%d/d%d/e%d/t%d/b%d", i, l.KVFactor, p.Selection().Heads(),
					l.HeadDim, l.ElemSize, l.TokensPerBlock, len(p.Blocks())),
				plan:      p,
				chunks:    randomChunks(r, p),
				poolShift: shifts[r.IntN(len(shifts))],
				bufShift:  shifts[r.IntN(len(shifts))],
				ctas:      gridSizes[r.IntN(len(gridSizes))],
			})
			continue
		}
		l, order := randomLayout(r)
		require.NoError(t, l.Validate(), "case %d: generator made an invalid layout", i)
		sel, selName := randomSelection(r, l, (i/2)%4)
		nb := 1 + r.IntN(int(l.NumBlocks))
		blocks := make([]int32, 0, nb)
		for _, b := range r.Perm(int(l.NumBlocks))[:nb] {
			blocks = append(blocks, int32(b))
		}
		p, err := layout.NewPlan(l, sel, blocks)
		require.NoError(t, err, "case %d", i)
		cases = append(cases, kernelCase{
			desc: fmt.Sprintf("%d/%s/%s/kv%d/h%d/d%d/e%d/t%d/b%d", i, order, selName, l.KVFactor, l.NumHeads,
				l.HeadDim, l.ElemSize, l.TokensPerBlock, nb),
			plan:      p,
			chunks:    randomChunks(r, p),
			poolShift: shifts[r.IntN(len(shifts))],
			bufShift:  shifts[r.IntN(len(shifts))],
			ctas:      gridSizes[r.IntN(len(gridSizes))],
		})
	}
	return cases
}

// guardByte fills the slack around a shifted buffer, so a write outside the buffer shows.
const guardByte = 0xa5

// guarded is n bytes starting shift bytes past a 16-byte boundary, inside a larger
// allocation whose 16 bytes either side hold guardByte, so a stray write shows.
type guarded struct {
	raw []byte
	off int
	n   int
}

func shifted(n int64, shift int) guarded {
	raw := make([]byte, n+64)
	for i := range raw {
		raw[i] = guardByte
	}
	skip := 16 + (16-int(uintptrOf(raw)%16))%16
	return guarded{raw: raw, off: skip + shift, n: int(n)}
}

// b is the buffer itself.
func (g guarded) b() []byte { return g.raw[g.off : g.off+g.n] }

// addr is the buffer's address, valid also when it is empty.
func (g guarded) addr() uint64 { return uintptrOf(g.raw) + uint64(g.off) }

// intact checks the 16 bytes on either side of the buffer.
func (g guarded) intact(t *testing.T, what string) {
	t.Helper()
	for i := range 16 {
		require.EqualValues(t, guardByte, g.raw[g.off-16+i], "%s: byte %d before the buffer was written", what, 16-i)
		require.EqualValues(t, guardByte, g.raw[g.off+g.n+i], "%s: byte %d after the buffer was written", what, i)
	}
}

// expected computes what a gather of chunk returns and what a scatter of src over chunk leaves
// in a copy of pool, with the slow reference.
func expected(t *testing.T, p *layout.Plan, pool []byte, c kvplan.Chunk, src []byte) (gathered, scattered []byte) {
	t.Helper()
	full := make([]byte, p.Bytes())
	require.NoError(t, layouttest.ReferenceGather(p, pool, full))
	gathered = make([]byte, c.Length)
	copy(gathered, full[c.Offset:])
	// Scatter only the chunk: rewrite the rest of the stream with the values already there.
	copy(full[c.Offset:], src[:c.Length])
	scattered = append([]byte(nil), pool...)
	require.NoError(t, layouttest.ReferenceScatter(p, full, scattered))
	return gathered, scattered
}

func randomBytes(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}
