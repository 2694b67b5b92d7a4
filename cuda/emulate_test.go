// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

func uintptrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// emulate runs the kernel's own per-thread code on the CPU over host memory, with work items
// sized for a grid of ctas CTAs.
func emulate(t *testing.T, k *kvxAPI, gather bool, ctas int64, p *layout.Plan, pool guarded, off int64, buf guarded) {
	t.Helper()
	blocks := append([]int32(nil), p.Blocks()...)
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(unsafe.SliceData(blocks))
	pin.Pin(unsafe.SliceData(pool.raw))
	pin.Pin(unsafe.SliceData(buf.raw))
	g := int32(0)
	if gather {
		g = 1
	}
	c := &copyArgs{
		Layout: p.Layout(), Sel: p.Selection(),
		Blocks: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(blocks)))), NBlocks: int64(len(blocks)),
		Pool: pool.addr(), Buf: buf.addr(), Offset: off, Length: int64(buf.n),
	}
	require.Zero(t, k.emulate(c, g, ctas), "emulated launch failed (700: access outside the pool or buffer, 716: misaligned vector)")
}

// The kernels' index math, vector-width choice and tail handling, run on the CPU through the
// same __host__ __device__ code the GPU runs, against the element-by-element reference: random
// layouts (packed orders and padded strides), all selection kinds (TP heads, PP layers, both),
// MLA, element sizes 1/2/4, chunk ranges and misaligned buffers.
func TestKernelEmulation_MatchesReference(t *testing.T) {
	_, k := requireLibs(t)
	r := rand.New(rand.NewPCG(7, 7))
	for _, tc := range kernelCases(t, 1, 240) {
		t.Run(tc.desc, func(t *testing.T) {
			p := tc.plan
			pool := shifted(p.Layout().SpanBytes(), tc.poolShift)
			randomBytes(r, pool.b())
			for _, c := range tc.chunks {
				src := make([]byte, c.Length)
				randomBytes(r, src)
				wantGather, wantPool := expected(t, p, pool.b(), c, src)

				got := shifted(c.Length, tc.bufShift)
				emulate(t, k, true, tc.ctas, p, pool, c.Offset, got)
				require.Equal(t, wantGather, got.b(), "gather of %+v", c)
				got.intact(t, "gather buffer")

				gotPool := shifted(int64(pool.n), tc.poolShift)
				copy(gotPool.b(), pool.b())
				buf := shifted(c.Length, tc.bufShift)
				copy(buf.b(), src)
				emulate(t, k, false, tc.ctas, p, gotPool, c.Offset, buf)
				require.Equal(t, wantPool, gotPool.b(), "scatter of %+v (bytes outside the range must not change)", c)
				gotPool.intact(t, "scattered pool")
			}
		})
	}
}

// The vector width follows every address term: 16 bytes for an aligned BF16 pool, narrower as
// soon as the buffer, the offset or a stride that is actually used breaks 16-byte alignment.
func TestKernelVectorWidth(t *testing.T) {
	_, k := requireLibs(t)
	bf16 := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 128, ElemSize: 2,
		TokensPerBlock: 16, NumBlocks: 4}, layout.LayerMajor)
	padded := bf16
	padded.StrideToken += 4
	padded.StrideHead = padded.StrideToken * 16
	padded.StrideBlock = padded.StrideHead * 4
	padded.StrideKV = padded.StrideBlock * 4
	padded.StrideLayer = padded.StrideKV * 2
	fp8Odd := layout.Packed(layout.Dims{NumLayers: 1, KVFactor: 1, NumHeads: 1, HeadDim: 3, ElemSize: 1,
		TokensPerBlock: 4, NumBlocks: 4}, layout.BlockMajor)
	tests := []struct {
		desc   string
		l      layout.Layout
		pool   uint64
		buf    uint64
		off    int64
		length int64
		want   int32
	}{
		{"aligned bf16", bf16, 0x10000, 0x20000, 0, 4096, 16},
		{"offset of 8 bytes", bf16, 0x10000, 0x20000, 8, 4096, 8},
		{"buffer 4 past alignment", bf16, 0x10000, 0x20004, 0, 4096, 4},
		{"pool 2 past alignment", bf16, 0x10002, 0x20000, 0, 4096, 2},
		{"odd length still 16 (tail is bytewise)", bf16, 0x10000, 0x20000, 0, 4097, 16},
		{"padded token stride of 260", padded, 0x10000, 0x20000, 0, 4096, 4},
		{"fp8 rows of 3 bytes", fp8Odd, 0x10000, 0x20000, 0, 12, 1},
		{"empty range", bf16, 0x10000, 0x20000, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			p, err := layout.NewPlan(tc.l, tc.l.All(), []int32{1, 0})
			require.NoError(t, err)
			c := &copyArgs{Layout: tc.l, Sel: tc.l.All(), Blocks: 0x30000, NBlocks: 2, Pool: tc.pool, Buf: tc.buf,
				Offset: tc.off, Length: min(tc.length, p.Bytes()-tc.off)}
			require.Equal(t, tc.want, k.vectorBytes(c))
		})
	}
}

// Launchers check what they can see and refuse the rest without touching memory.
func TestKernelLauncherRejectsBadRanges(t *testing.T) {
	_, k := requireLibs(t)
	l := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 8, ElemSize: 2,
		TokensPerBlock: 4, NumBlocks: 4}, layout.BlockMajor)
	p, err := layout.NewPlan(l, l.All(), []int32{2, 1})
	require.NoError(t, err)
	good := copyArgs{Layout: l, Sel: l.All(), Blocks: 0x30000, NBlocks: 2, Pool: 0x10000, Buf: 0x20000, Length: p.Bytes()}
	tests := []struct {
		desc   string
		mutate func(c *copyArgs)
	}{
		{"range past the stream", func(c *copyArgs) { c.Offset = 1 }},
		{"negative offset", func(c *copyArgs) { c.Offset = -2; c.Length = 2 }},
		{"selection past the layers", func(c *copyArgs) { c.Sel.LayerEnd = 3 }},
		{"empty head selection", func(c *copyArgs) { c.Sel.HeadEnd = c.Sel.HeadBegin }},
		{"more blocks than the pool", func(c *copyArgs) { c.NBlocks = 5 }},
		{"no block list", func(c *copyArgs) { c.Blocks = 0 }},
		{"null pool", func(c *copyArgs) { c.Pool = 0 }},
	}
	require.EqualValues(t, 16, k.vectorBytes(&good), "the unmodified arguments are valid")
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			require.EqualValues(t, -codeInvalidValue, k.vectorBytes(&c))
			require.EqualValues(t, codeInvalidValue, k.emulate(&c, 1, 1))
		})
	}
}

// The kernels divide by launch-wide constants with a multiply and a shift; it must equal true
// division for every divisor and dividend below 2^31 (prepare() keeps them there). Checked at
// the edges where such schemes break: around multiples of d, at 2^31-1, and for divisors that
// are powers of two, one off them, and large.
func TestKernelFastDivisionIsExact(t *testing.T) {
	_, k := requireLibs(t)
	r := rand.New(rand.NewPCG(5, 5))
	const limit = 1<<31 - 1
	divisors := []uint32{1, 2, 3, 5, 7, 32, 33, 127, 128, 129, 255, 256, 576, 1152, 4096, 65535, 65536,
		1<<30 - 1, 1 << 30, 1<<30 + 1, limit - 1, limit}
	for range 200 {
		divisors = append(divisors, 1+uint32(r.Int64N(limit)), 1+uint32(r.Int64N(1<<16)))
	}
	for _, d := range divisors {
		xs := []uint32{0, 1, d - 1, d, d + 1, limit, limit - 1, limit - d + 1}
		for range 200 {
			m := uint32(r.Int64N(int64(limit/d) + 1))
			xs = append(xs, uint32(r.Int64N(limit+1)), m*d, m*d+d-1)
		}
		for _, x := range xs {
			if x > limit {
				continue
			}
			require.Equal(t, x/d, k.fastdiv(d, x), "%d / %d", x, d)
		}
	}
}
