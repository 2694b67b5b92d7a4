// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"cmp"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

// The regions an RMA receiver reads must move every byte of the stream from where the
// sender's plan holds it to where the receiver's plan wants it, as the reference gather and
// scatter would, in ranges sorted by the receiver's offset, disjoint and merged wherever both
// sides continue. Random layouts on both sides (every nesting order, padding, selections);
// the piece counts go past the point where the receiver sorts by radix instead of comparison.
func TestRMARegionsMoveWhatGatherAndScatterWould(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	for i := range 300 {
		d := layouttest.RandomLayout(r).Dims()
		d.NumBlocks = 1 + r.Int64N(40) // enough blocks for hundreds of pieces
		srcL, dstL := layouttest.RandomStrides(r, d), layouttest.RandomStrides(r, d)
		sel := layouttest.RandomSelection(r, srcL)
		n := 1 + r.IntN(int(d.NumBlocks))
		src, err := layout.NewPlan(srcL, sel, blockIDs(r.Perm(int(d.NumBlocks))[:n]))
		require.NoError(t, err)
		dst, err := layout.NewPlan(dstL, sel, blockIDs(r.Perm(int(d.NumBlocks))[:n]))
		require.NoError(t, err)

		regions, ok := rmaRegions(src, dst)
		require.True(t, ok)
		srcPool := make([]byte, kvplan.PoolSpan(src))
		layouttest.Fill(r, srcPool)
		stream := make([]byte, src.Bytes())
		require.NoError(t, layouttest.ReferenceGather(src, srcPool, stream))
		want := make([]byte, kvplan.PoolSpan(dst))
		require.NoError(t, layouttest.ReferenceScatter(dst, stream, want))
		got := make([]byte, kvplan.PoolSpan(dst))
		copy(got, want) // bytes outside the plan are not the regions' business
		var moved int64
		_ = kvplan.Runs(dst, 0, dst.Bytes(), func(at, _, k int64) { clear(got[at : at+k]) })
		for k, g := range regions {
			require.Positive(t, g.n, "case %d region %d", i, k)
			if k > 0 {
				p := regions[k-1]
				require.LessOrEqual(t, p.dst+p.n, g.dst, "case %d: regions sorted by the receiver's offset and disjoint", i)
				require.False(t, p.dst+p.n == g.dst && p.src+p.n == g.src, "case %d: regions %d and %d continue each other unmerged", i, k-1, k)
			}
			copy(got[g.dst:g.dst+g.n], srcPool[g.src:g.src+g.n])
			moved += g.n
		}
		require.Equal(t, src.Bytes(), moved, "case %d", i)
		require.Equal(t, want, got, "case %d", i)
	}
}

func TestSortByDstSortsAnyOffsets(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 3))
	for _, n := range []int{0, 1, 63, 64, 65, 1000, 20000} {
		for _, top := range []int64{1, 1 << 11, 1 << 22, 1 << 40, 1<<62 + 12345, -1} {
			p := make([]rmaRegion, n)
			for i := range p {
				p[i] = rmaRegion{src: int64(i), dst: r.Int64N(max(top, 1)), n: 1}
				if top < 0 { // above a large offset, 32 KiB apart, some equal: runs of a pool
					p[i].dst = 1<<40 + r.Int64N(max(int64(n)/2, 1))<<15
				}
			}
			want := slices.Clone(p)
			slices.SortStableFunc(want, func(a, b rmaRegion) int { return cmp.Compare(a.dst, b.dst) })
			got := sortByDst(slices.Clone(p))
			if n >= 64 {
				require.Equal(t, want, got, "n=%d top=%d: the radix sort is stable too", n, top)
			} else {
				require.True(t, slices.IsSortedFunc(got, func(a, b rmaRegion) int { return cmp.Compare(a.dst, b.dst) }))
			}
		}
	}
}

// A receiver pairs the ranges of every RMA offer (rmaRegions) on its transfer's goroutine, which
// starts with a small stack: a short request's few ranges must pair within a small stack, or
// every such transfer grows its goroutine's stack (copies it) to fit the radix sort's digit
// counts, which only a request of many pieces uses (perf: morestack/copystack about 2-4 % of
// both processes' samples in the 32-token c=16 row). A child test process pairs a one-hop
// request's ranges (same layout both sides: one range per run of blocks) on a fresh goroutine
// with the stack limit at 32 KiB, which a growth to fit the 16 KiB of counts passes: the
// runtime then ends the child with a stack overflow.
func TestShortOfferPairsWithinASmallStack(t *testing.T) {
	if os.Getenv("KVX_SMALL_STACK_CHILD") == "1" {
		for _, o := range []layout.Order{layout.BlockMajor, layout.LayerMajor} {
			src := newKVPool(t, testDims, o, nil, blocks(1, 2, 3, 9), 0)
			dst := newKVPool(t, testDims, o, nil, blocks(5, 6, 7, 20), 0)
			var regions []rmaRegion
			done := make(chan struct{})
			old := debug.SetMaxStack(32 << 10)
			go func() {
				defer close(done)
				regions, _ = rmaRegions(src.plan, dst.plan)
			}()
			<-done
			debug.SetMaxStack(old)
			require.NotEmpty(t, regions)
			require.Less(t, len(regions), 64, "%v: few enough pieces for the comparison sort", o)
		}
		// A 32-token Llama-3-8B request (1 block of 32 tokens) has 64 pieces (one per layer
		// and K/V) in either order, as many as the radix sort takes: it too must fit a small
		// stack, and so must a 64-token one (2 blocks, 128 pieces).
		l8 := layouttest.Llama3_8B(1024).Dims()
		for o, want := range map[layout.Order]int{layout.BlockMajor: 1, layout.LayerMajor: 64} {
			l := layout.Packed(l8, o)
			for _, ids := range [][2][]int32{{{3}, {700}}, {{3, 4}, {700, 9}}} {
				src, err := layout.NewPlan(l, l.All(), ids[0])
				require.NoError(t, err)
				dst, err := layout.NewPlan(l, l.All(), ids[1])
				require.NoError(t, err)
				var regions []rmaRegion
				done := make(chan struct{})
				old := debug.SetMaxStack(32 << 10)
				go func() {
					defer close(done)
					regions, _ = rmaRegions(src, dst)
				}()
				<-done
				debug.SetMaxStack(old)
				require.Len(t, regions, want*len(ids[0]), "%v: one range per block (block-major), or per layer, K/V and block", o)
			}
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestShortOfferPairsWithinASmallStack$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVX_SMALL_STACK_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child:\n%s", out)
}

func blockIDs(perm []int) []int32 {
	ids := make([]int32, len(perm))
	for i, v := range perm {
		ids[i] = int32(v)
	}
	return ids
}
