// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/native"
)

func TestLayoutABIMatchesC(t *testing.T) {
	var l layout.Layout
	size, offs := native.LayoutABI()
	require.Equal(t, int64(unsafe.Sizeof(l)), size, "sizeof(kvx_layout_t)")
	want := []uintptr{
		unsafe.Offsetof(l.NumLayers), unsafe.Offsetof(l.KVFactor), unsafe.Offsetof(l.NumHeads),
		unsafe.Offsetof(l.HeadDim), unsafe.Offsetof(l.ElemSize), unsafe.Offsetof(l.TokensPerBlock),
		unsafe.Offsetof(l.NumBlocks), unsafe.Offsetof(l.StrideBlock), unsafe.Offsetof(l.StrideLayer),
		unsafe.Offsetof(l.StrideKV), unsafe.Offsetof(l.StrideHead), unsafe.Offsetof(l.StrideToken),
	}
	require.Len(t, offs, len(want), "field count of kvx_layout_t")
	for i := range want {
		require.Equal(t, int64(want[i]), offs[i], "offset of field %d", i)
	}

	var s layout.Selection
	size, offs = native.SelectionABI()
	require.Equal(t, int64(unsafe.Sizeof(s)), size, "sizeof(kvx_selection_t)")
	wantSel := []uintptr{unsafe.Offsetof(s.LayerBegin), unsafe.Offsetof(s.LayerEnd),
		unsafe.Offsetof(s.HeadBegin), unsafe.Offsetof(s.HeadEnd)}
	require.Len(t, offs, len(wantSel))
	for i := range wantSel {
		require.Equal(t, int64(wantSel[i]), offs[i], "offset of selection field %d", i)
	}
}

// Gather matches the element-by-element reference, and scatter(gather(pool)) restores the
// selected elements while leaving every other byte of the destination untouched.
func TestGatherScatterProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		p := layouttest.RandomPlan(r)
		pool := make([]byte, p.Layout().SpanBytes())
		layouttest.Fill(r, pool)

		want := make([]byte, p.Bytes())
		require.NoError(t, layouttest.ReferenceGather(p, pool, want))
		got := make([]byte, p.Bytes())
		require.NoError(t, native.HostGather(p, pool, 0, got))
		require.Equal(t, want, got, "case %d: gather differs from reference (layout %+v sel %+v blocks %v)",
			i, p.Layout(), p.Selection(), p.Blocks())

		// Scatter into a canary-filled pool: exactly the reference's bytes change.
		dst := bytes.Repeat([]byte{0xA5}, len(pool))
		ref := bytes.Repeat([]byte{0xA5}, len(pool))
		require.NoError(t, native.HostScatter(p, got, 0, dst))
		require.NoError(t, layouttest.ReferenceScatter(p, got, ref))
		require.Equal(t, ref, dst, "case %d: scatter differs from reference", i)

		back := make([]byte, p.Bytes())
		require.NoError(t, native.HostGather(p, dst, 0, back))
		require.Equal(t, got, back, "case %d: gather(scatter(x)) != x", i)
	}
}

// Gathering a plan chunk by chunk gives the same bytes as one unchunked gather, and
// scattering chunk by chunk the same pool, whatever the chunk size.
func TestChunkedPlansMatchUnchunked(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		p := layouttest.RandomPlan(r)
		pool := make([]byte, p.Layout().SpanBytes())
		layouttest.Fill(r, pool)
		whole := make([]byte, p.Bytes())
		require.NoError(t, native.HostGather(p, pool, 0, whole))

		chunks, err := kvplan.Chunks(p, p.Layout().ElemSize+r.Int64N(p.Bytes()+8))
		require.NoError(t, err)
		pieced := make([]byte, 0, p.Bytes())
		out := make([]byte, len(pool))
		for _, c := range chunks {
			require.Zero(t, c.Offset%p.Layout().ElemSize, "chunk not on an element boundary")
			buf := make([]byte, c.Length)
			require.NoError(t, native.HostGather(p, pool, c.Offset, buf))
			pieced = append(pieced, buf...)
			require.NoError(t, native.HostScatter(p, buf, c.Offset, out))
		}
		require.Equal(t, whole, pieced, "case %d", i)
		ref := make([]byte, len(pool))
		require.NoError(t, layouttest.ReferenceScatter(p, whole, ref))
		require.Equal(t, ref, out, "case %d: chunked scatter", i)
	}
}

// Large ranges are split across cores; the split must not change a byte.
func TestGatherLargeSplitAcrossCores(t *testing.T) {
	l := layouttest.Llama3_8B(12)
	blocks := []int32{7, 3, 11, 0, 5, 9, 1, 10}
	p, err := layout.NewPlan(l, l.All(), blocks)
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(5, 6))
	pool := make([]byte, l.SpanBytes())
	layouttest.Fill(r, pool)
	want := make([]byte, p.Bytes())
	require.NoError(t, layouttest.ReferenceGather(p, pool, want))
	got := make([]byte, p.Bytes())
	require.NoError(t, native.HostGather(p, pool, 0, got))
	require.True(t, bytes.Equal(want, got), "large gather differs from reference")
	// An odd offset and length, to cross the per-core split off any run boundary.
	off, n := int64(12345), p.Bytes()/3+7
	part := make([]byte, n)
	require.NoError(t, native.HostGather(p, pool, off, part))
	require.True(t, bytes.Equal(want[off:off+n], part))
}

// logical is the value of one byte of the whole model's KV cache, independent of any rank's
// layout: the ground truth for heterogeneous TP and PP.
func logical(layer, kv, head, token, d, byteIdx int64) byte {
	return byte(layer*131 + kv*71 + head*37 + token*17 + d*7 + byteIdx*3 + 1)
}

type rank struct {
	l          layout.Layout
	layerBase  int64 // first model layer this rank holds
	headBase   int64 // first model head this rank holds
	blocks     []int32
	pool       []byte
	tokensBase []int64 // model token of the first token of each listed block
}

// fillLogical writes the logical model values for rank r's blocks into its pool.
func (r *rank) fillLogical() {
	l := r.l
	for bi, b := range r.blocks {
		for layer := int64(0); layer < l.NumLayers; layer++ {
			for kv := int64(0); kv < l.KVFactor; kv++ {
				for h := int64(0); h < l.NumHeads; h++ {
					for t := int64(0); t < l.TokensPerBlock; t++ {
						for d := int64(0); d < l.HeadDim; d++ {
							for e := int64(0); e < l.ElemSize; e++ {
								at := int64(b)*l.StrideBlock + layer*l.StrideLayer + kv*l.StrideKV +
									h*l.StrideHead + t*l.StrideToken + d*l.ElemSize + e
								r.pool[at] = logical(r.layerBase+layer, kv, r.headBase+h,
									r.tokensBase[bi]+t, d, e)
							}
						}
					}
				}
			}
		}
	}
}

// checkLogical verifies that every element of rank r's listed blocks holds its logical value.
func (r *rank) checkLogical(t *testing.T, what string) {
	t.Helper()
	l := r.l
	for bi, b := range r.blocks {
		for layer := int64(0); layer < l.NumLayers; layer++ {
			for kv := int64(0); kv < l.KVFactor; kv++ {
				for h := int64(0); h < l.NumHeads; h++ {
					for tk := int64(0); tk < l.TokensPerBlock; tk++ {
						for d := int64(0); d < l.HeadDim; d++ {
							for e := int64(0); e < l.ElemSize; e++ {
								at := int64(b)*l.StrideBlock + layer*l.StrideLayer + kv*l.StrideKV +
									h*l.StrideHead + tk*l.StrideToken + d*l.ElemSize + e
								want := logical(r.layerBase+layer, kv, r.headBase+h, r.tokensBase[bi]+tk, d, e)
								if r.pool[at] != want {
									t.Fatalf("%s: block %d layer %d kv %d head %d token %d dim %d byte %d: got %d want %d",
										what, b, layer, kv, h, tk, d, e, r.pool[at], want)
								}
							}
						}
					}
				}
			}
		}
	}
}

func newRank(t *testing.T, d layout.Dims, o layout.Order, layerBase, headBase int64, blocks []int32) *rank {
	l := layout.Packed(d, o)
	require.NoError(t, l.Validate())
	r := &rank{l: l, layerBase: layerBase, headBase: headBase, blocks: blocks, pool: make([]byte, l.SpanBytes())}
	for i := range blocks {
		r.tokensBase = append(r.tokensBase, int64(i)*d.TokensPerBlock)
	}
	return r
}

// move gathers src's selection and scatters it into dst's selection, chunk by chunk.
func move(t *testing.T, src *rank, srcSel layout.Selection, dst *rank, dstSel layout.Selection, chunk int64) {
	t.Helper()
	sp, err := layout.NewPlan(src.l, srcSel, src.blocks)
	require.NoError(t, err)
	dp, err := layout.NewPlan(dst.l, dstSel, dst.blocks)
	require.NoError(t, err)
	require.NoError(t, layout.Compatible(sp, dp))
	chunks, err := kvplan.Chunks(sp, chunk)
	require.NoError(t, err)
	for _, c := range chunks {
		buf := make([]byte, c.Length)
		require.NoError(t, native.HostGather(sp, src.pool, c.Offset, buf))
		require.NoError(t, native.HostScatter(dp, buf, c.Offset, dst.pool))
	}
}

// Heterogeneous parallelism and layouts against the logical model: every case moves a
// request's KV from its context ranks to its generation ranks and checks every element.
func TestHeterogeneousAgainstLogicalReference(t *testing.T) {
	model := func(elem, kv int64) layout.Dims {
		return layout.Dims{NumLayers: 4, KVFactor: kv, NumHeads: 4, HeadDim: 8, ElemSize: elem, TokensPerBlock: 4, NumBlocks: 6}
	}
	half := func(d layout.Dims) layout.Dims { d.NumHeads /= 2; return d }
	halfLayers := func(d layout.Dims) layout.Dims { d.NumLayers /= 2; return d }
	ctxBlocks, genBlocks := []int32{4, 1, 3}, []int32{0, 5, 2}

	for _, elem := range []int64{1, 2, 4} {
		for _, kv := range []int64{1, 2} {
			d := model(elem, kv)
			name := fmt.Sprintf("elem%d_kv%d", elem, kv)

			t.Run(name+"/TP2_to_TP1", func(t *testing.T) {
				gen := newRank(t, d, layout.LayerMajor, 0, 0, genBlocks)
				for r := int64(0); r < 2; r++ {
					ctx := newRank(t, half(d), layout.BlockMajor, 0, r*2, ctxBlocks)
					ctx.fillLogical()
					move(t, ctx, ctx.l.All(), gen, layout.Selection{LayerBegin: 0, LayerEnd: 4, HeadBegin: r * 2, HeadEnd: r*2 + 2}, 100)
				}
				gen.checkLogical(t, "TP2->TP1")
			})
			t.Run(name+"/TP1_to_TP2", func(t *testing.T) {
				ctx := newRank(t, d, layout.BlockMajor, 0, 0, ctxBlocks)
				ctx.fillLogical()
				for r := int64(0); r < 2; r++ {
					gen := newRank(t, half(d), layout.LayerMajorNHD, 0, r*2, genBlocks)
					move(t, ctx, layout.Selection{LayerBegin: 0, LayerEnd: 4, HeadBegin: r * 2, HeadEnd: r*2 + 2}, gen, gen.l.All(), 64)
					gen.checkLogical(t, "TP1->TP2")
				}
			})
			t.Run(name+"/PP1_to_PP2", func(t *testing.T) {
				ctx := newRank(t, d, layout.BlockMajor, 0, 0, ctxBlocks)
				ctx.fillLogical()
				for r := int64(0); r < 2; r++ {
					gen := newRank(t, halfLayers(d), layout.BlockMajor, r*2, 0, genBlocks)
					move(t, ctx, layout.Selection{LayerBegin: r * 2, LayerEnd: r*2 + 2, HeadBegin: 0, HeadEnd: 4}, gen, gen.l.All(), 1<<20)
					gen.checkLogical(t, "PP1->PP2")
				}
			})
			t.Run(name+"/block_major_to_layer_major", func(t *testing.T) {
				ctx := newRank(t, d, layout.BlockMajor, 0, 0, ctxBlocks)
				ctx.fillLogical()
				gen := newRank(t, d, layout.LayerMajor, 0, 0, genBlocks)
				move(t, ctx, ctx.l.All(), gen, gen.l.All(), 7*elem)
				gen.checkLogical(t, "block-major->layer-major")
			})
		}
	}
}

// Bad input gets a typed error and touches no memory.
func TestHostBadInputTouchesNothing(t *testing.T) {
	l := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 4, ElemSize: 2, TokensPerBlock: 2, NumBlocks: 3}, layout.BlockMajor)
	p, err := layout.NewPlan(l, l.All(), []int32{2, 0})
	require.NoError(t, err)
	pool := bytes.Repeat([]byte{7}, int(l.SpanBytes()))
	cases := []struct {
		desc string
		pool []byte
		off  int64
		n    int64
		want error
	}{
		{"pool smaller than the span", pool[:len(pool)-1], 0, 16, layout.ErrBufferTooSmall},
		{"negative offset", pool, -2, 16, layout.ErrOutOfRange},
		{"range past the stream", pool, p.Bytes() - 8, 16, layout.ErrOutOfRange},
		{"offset past the stream", pool, p.Bytes() + 2, 2, layout.ErrOutOfRange},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			buf := bytes.Repeat([]byte{9}, int(c.n))
			require.ErrorIs(t, native.HostGather(p, c.pool, c.off, buf), c.want)
			require.Equal(t, bytes.Repeat([]byte{9}, int(c.n)), buf, "gather wrote into dst")
			require.ErrorIs(t, native.HostScatter(p, buf, c.off, c.pool), c.want)
			require.Equal(t, bytes.Repeat([]byte{7}, len(c.pool)), c.pool, "scatter wrote into the pool")
		})
	}
	require.ErrorIs(t, native.HostGather(nil, pool, 0, nil), layout.ErrInvalidLayout)
}

// A staging-sized chunk gathers and scatters without allocating: the engine calls these once
// per chunk, and every allocation there is garbage-collector work on the transfer path.
func TestHostChunkCopyDoesNotAllocate(t *testing.T) {
	l := layouttest.Llama3_8B(4)
	p, err := layout.NewPlan(l, l.All(), []int32{3, 1})
	require.NoError(t, err)
	pool := make([]byte, kvplan.PoolSpan(p))
	buf := make([]byte, 1<<20)
	allocs := testing.AllocsPerRun(20, func() {
		if err := native.HostGather(p, pool, 4096, buf); err != nil {
			t.Fatal(err)
		}
		if err := native.HostScatter(p, buf, 4096, pool); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}
