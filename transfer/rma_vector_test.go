// SPDX-License-Identifier: Apache-2.0

package transfer

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
	"github.com/kvxfer/kvxfer/transfer/internal/vectorget"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// vectorCase is a sender's and a receiver's plan of the same stream: the TP splits into and
// out of layer-major-nhd that vector gets exist for, and orders where the pieces are long.
type vectorCase struct {
	desc     string
	src, dst *layout.Plan
}

func vectorCases(t testing.TB) []vectorCase {
	d := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 32, NumBlocks: 40}
	half := d
	half.NumHeads = 4
	plan := func(dims layout.Dims, o layout.Order, heads [2]int64, seed uint64) *layout.Plan {
		l := layout.Packed(dims, o)
		sel := l.All()
		sel.HeadBegin, sel.HeadEnd = heads[0], heads[1]
		ids := make([]int32, 32)
		for i, v := range rand.New(rand.NewPCG(seed, 7)).Perm(int(dims.NumBlocks))[:32] {
			ids[i] = int32(v)
		}
		p, err := layout.NewPlan(l, sel, ids)
		require.NoError(t, err)
		return p
	}
	nhd, bm := layout.LayerMajorNHD, layout.BlockMajor
	return []vectorCase{
		{"TP=2->1 into nhd: a rank's heads into half of each token's", plan(half, nhd, [2]int64{0, 4}, 1), plan(d, nhd, [2]int64{4, 8}, 2)},
		{"TP=1->2 out of nhd: half of each token's heads into a rank's", plan(d, nhd, [2]int64{0, 4}, 3), plan(half, nhd, [2]int64{0, 4}, 4)},
		{"nhd to nhd, every head", plan(d, nhd, [2]int64{0, 8}, 5), plan(d, nhd, [2]int64{0, 8}, 6)},
		{"block-major to nhd", plan(d, bm, [2]int64{0, 8}, 7), plan(d, nhd, [2]int64{0, 8}, 8)},
		{"nhd to block-major, half the heads", plan(d, nhd, [2]int64{2, 6}, 9), plan(d, bm, [2]int64{4, 8}, 10)},
	}
}

// A vector get's two lists, read as the kernel reads them (the remote ranges as one stream
// into the local pieces in order), land every byte of the chunk where the reference copy puts
// it, and touch nothing else; no two neighbours of a list continue each other (merged).
func TestVectorLists_WalkIsTheReferenceCopy(t *testing.T) {
	for _, c := range vectorCases(t) {
		t.Run(c.desc, func(t *testing.T) {
			srcPool := make([]byte, c.src.Layout().SpanBytes())
			layouttest.Fill(rand.New(rand.NewPCG(1, 1)), srcPool)
			stream := make([]byte, c.src.Bytes())
			require.NoError(t, layouttest.ReferenceGather(c.src, srcPool, stream))
			want := make([]byte, c.dst.Layout().SpanBytes())
			require.NoError(t, layouttest.ReferenceScatter(c.dst, stream, want))

			got := make([]byte, len(want))
			group := c.src.Layout().RowBytes() * c.src.Layout().TokensPerBlock * c.src.Selection().Heads()
			step := 3 * group // chunks of whole groups, as vectorOffer cuts them
			const base = 1 << 40
			for off := int64(0); off < c.src.Bytes(); off += step {
				n := min(step, c.src.Bytes()-off)
				l := vectorLists{base: base, pool: got}
				require.NoError(t, l.walk(c.src, c.dst, off, n))
				var read []byte
				for i, r := range l.src {
					require.GreaterOrEqual(t, r.Addr, uint64(base))
					read = append(read, srcPool[r.Addr-base:r.Addr-base+uint64(r.Len)]...)
					if i > 0 {
						require.NotEqual(t, l.src[i-1].Addr+uint64(l.src[i-1].Len), r.Addr, "remote ranges %d and %d not merged", i-1, i)
					}
				}
				require.Equal(t, int(n), len(read), "the remote ranges hold the chunk")
				at := func(p []byte) uintptr { return uintptr(unsafe.Pointer(&p[0])) - uintptr(unsafe.Pointer(&got[0])) }
				for i, p := range l.dst {
					copy(p, read[:len(p)])
					read = read[len(p):]
					if i > 0 {
						prev := l.dst[i-1]
						require.NotEqual(t, at(prev)+uintptr(len(prev)), at(p), "local pieces %d and %d not merged", i-1, i)
					}
				}
				require.Empty(t, read, "local pieces hold every byte read")
			}
			require.True(t, bytes.Equal(want, got), "the lists land the bytes where the reference copy does")
		})
	}
}

// Copying a chunk's pieces out of the offered pool mapped here (copyPieces, the route for a
// mapped pool) lands every byte where the reference copy puts it and touches nothing else,
// whatever the chunks; a view shorter than the offered plan (a forged pool size the mapping
// did not catch) is refused with ErrProtocol before any piece past it is read.
func TestVectorLists_CopyPiecesIsTheReferenceCopy(t *testing.T) {
	for _, c := range vectorCases(t) {
		t.Run(c.desc, func(t *testing.T) {
			srcPool := make([]byte, c.src.Layout().SpanBytes())
			layouttest.Fill(rand.New(rand.NewPCG(2, 2)), srcPool)
			stream := make([]byte, c.src.Bytes())
			require.NoError(t, layouttest.ReferenceGather(c.src, srcPool, stream))
			want := make([]byte, c.dst.Layout().SpanBytes())
			require.NoError(t, layouttest.ReferenceScatter(c.dst, stream, want))
			group := c.src.Layout().RowBytes() * c.src.Layout().TokensPerBlock * c.src.Selection().Heads()
			for _, step := range []int64{group, 3 * group, c.src.Bytes()} { // whole groups, as vectorOffer cuts them
				got := make([]byte, len(want))
				var chunks []rmaRegion
				for off := int64(0); off < c.src.Bytes(); off += step {
					chunks = append(chunks, rmaRegion{src: off, dst: off, n: min(step, c.src.Bytes()-off)})
				}
				require.NoError(t, copyPieces(c.src, c.dst, srcPool, got, chunks[:1]))
				require.NoError(t, copyPieces(c.src, c.dst, srcPool, got, chunks[1:]))
				require.True(t, bytes.Equal(want, got), "chunks of %d bytes land where the reference copy puts them", step)
			}
			var end int64 // the end of the plan's last piece in its pool
			require.NoError(t, kvplan.Runs(c.src, 0, c.src.Bytes(), func(pool, _, n int64) { end = max(end, pool+n) }))
			short := srcPool[:end-1]
			got := make([]byte, len(want))
			err := copyPieces(c.src, c.dst, short, got, []rmaRegion{{src: 0, dst: 0, n: c.src.Bytes()}})
			require.ErrorIs(t, err, ErrProtocol, "a piece past the view")
		})
	}
}

// fakeVectorGets stands in, until the test ends, for a transport whose vector gets might reach
// a mem peer (the receiver's path choice, a nil key) but read no offered key: a receiver of
// small pieces then takes the RMA mode, and at the offer reads the pieces through the mapping
// (mem.Transport.MapPeers) or, not mapped, falls back to IOV messages.
func fakeVectorGets(t *testing.T) {
	saved := vectorget.Hooks
	vectorget.Hooks.VectorGets = func(tr any, _ transport.Peer, key []byte) bool {
		_, ok := tr.(*mem.Transport)
		return ok && key == nil
	}
	vectorget.Hooks.PostGetVector = func(any, transport.Peer, transport.Tag, []byte, []vectorget.Range, [][]byte, func(transport.Completion)) (transport.OpID, error) {
		return 0, fmt.Errorf("%w: no vector gets here", transport.ErrBadRegion)
	}
	t.Cleanup(func() { vectorget.Hooks = saved })
}

// A receiver of a TP split into or out of layer-major-nhd (1 KiB pieces, far under
// DirectMinRunBytes) whose sender's pool the transport maps here copies each piece out of
// the mapping: the path is RMA, no get carries a byte (only the generation word's read after
// the copies), every byte lands. Not mapped (and no vector gets), or DisableInPlaceReads, it
// falls back to IOV messages, every byte still right. Over the mem transport; the UCX
// transport's test is TestUCXCMA_TPSplitNHDReadByVectorGets.
func TestRMASmallPiecesReadThroughTheMapping(t *testing.T) {
	d := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 24}
	half := d
	half.NumHeads = 4
	heads := func(b, e int64) *layout.Selection {
		sel := layout.Packed(d, layout.LayerMajorNHD).All()
		sel.HeadBegin, sel.HeadEnd = b, e
		return &sel
	}
	nhd, bm := layout.LayerMajorNHD, layout.BlockMajor
	type pools func(t *testing.T) (src, dst *kvPool)
	tp21 := func(t *testing.T) (*kvPool, *kvPool) { // a TP=2 rank's pool into half of each token's heads
		return newKVPool(t, half, nhd, nil, blocks(3, 1, 7, 5), 91), newKVPool(t, d, nhd, heads(4, 8), blocks(10, 2, 14, 6), 0)
	}
	tp12 := func(t *testing.T) (*kvPool, *kvPool) { // half of each token's heads into a TP=2 rank's pool
		return newKVPool(t, d, nhd, heads(0, 4), blocks(3, 1, 7, 5), 92), newKVPool(t, half, nhd, nil, blocks(10, 2, 14, 6), 0)
	}
	toBM := func(t *testing.T) (*kvPool, *kvPool) { // half the heads of nhd into a block-major TP=2 rank
		return newKVPool(t, d, nhd, heads(4, 8), blocks(3, 1, 7, 5), 93), newKVPool(t, half, bm, nil, blocks(10, 2, 14, 6), 0)
	}
	for _, tc := range []struct {
		desc    string
		pools   pools
		mapping bool
		off     bool // DisableInPlaceReads
		want    Path
	}{
		{"TP=2->1 into nhd, mapped", tp21, true, false, PathRMA},
		{"TP=2->1 into nhd, not mapped: IOV messages", tp21, false, false, PathDirect},
		{"TP=1->2 out of nhd, mapped", tp12, true, false, PathRMA},
		{"TP=1->2 out of nhd, not mapped: IOV messages", tp12, false, false, PathDirect},
		{"TP=1->2 out of nhd into block-major, mapped", toBM, true, false, PathRMA},
		{"TP=2->1 into nhd, mapped, DisableInPlaceReads: IOV messages", tp21, true, true, PathDirect},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			fakeVectorGets(t)
			cfg := rmaConfig()
			cfg.Tuning.DisableInPlaceReads = tc.off
			cfg.Tuning.DirectChunkBytes = 64 << 10  // a few chunks of whole groups
			cfg.Tuning.RMAMinRegionBytes = 64 << 10 // the pieces too small for a get each
			cfg.Tuning.DirectMinRunBytes = 0        // the engine's default: 2 KiB
			src, dst := tc.pools(t)
			p, k := runMappedPair(t, cfg, tc.mapping, src, dst, tc.want)
			if tc.want == PathRMA {
				require.Zero(t, k.count(wire.KindData), "a piece read with a get")
				require.Equal(t, 1, k.count(genRead), "the generation word read after the copies")
			}
			require.Zero(t, p.net.Pending())
		})
	}
}

// Walking a chunk sizes each list once: a 64 MiB chunk of a TP=2->1 request into
// layer-major-nhd is 65,536 local pieces, which append's doubling copied about 17 times over,
// each copy garbage for the collector inside the timed transfer.
func TestVectorLists_WalkAllocatesEachListOnce(t *testing.T) {
	for _, c := range vectorCases(t) {
		t.Run(c.desc, func(t *testing.T) {
			pool := make([]byte, c.dst.Layout().SpanBytes())
			allocs := testing.AllocsPerRun(3, func() {
				l := vectorLists{base: 1 << 40, pool: pool}
				if err := l.walk(c.src, c.dst, 0, c.src.Bytes()); err != nil {
					t.Fatal(err)
				}
			})
			require.LessOrEqual(t, allocs, 2.0+raceAllocs, "the remote list and the local one, each once")
		})
	}
}

// BenchmarkVectorListsWalk walks a 64 MiB chunk of a 4096-token Llama-3-8B request's TP
// splits in layer-major-nhd: what the receiver does before each vector get.
func BenchmarkVectorListsWalk(b *testing.B) {
	d := layouttest.Llama3_8B(160).Dims()
	half := d
	half.NumHeads /= 2
	plan := func(dims layout.Dims, heads [2]int64, seed uint64) *layout.Plan {
		l := layout.Packed(dims, layout.LayerMajorNHD)
		sel := l.All()
		sel.HeadBegin, sel.HeadEnd = heads[0], heads[1]
		ids := make([]int32, 128)
		for i, v := range rand.New(rand.NewPCG(seed, 2)).Perm(160)[:128] {
			ids[i] = int32(v)
		}
		p, err := layout.NewPlan(l, sel, ids)
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name     string
		src, dst *layout.Plan
	}{
		{"tp2to1", plan(half, [2]int64{0, 4}, 1), plan(d, [2]int64{4, 8}, 3)},
		{"tp1to2", plan(d, [2]int64{0, 4}, 1), plan(half, [2]int64{0, 4}, 3)},
	} {
		pool := make([]byte, c.dst.Layout().SpanBytes())
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(64 << 20)
			for b.Loop() {
				l := vectorLists{base: 1 << 40, pool: pool}
				if err := l.walk(c.src, c.dst, 0, 64<<20); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
