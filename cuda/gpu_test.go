// SPDX-License-Identifier: Apache-2.0

//go:build gpu

// Tests and benchmarks that need a CUDA device. `make gpu-test` runs them; `make test` only
// vets them (go vet -tags gpu), so they always compile.

package cuda

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

// gpuWait bounds every wait for device work in these tests.
const gpuWait = 30 * time.Second

// openGPU opens device 0. Under the gpu tag a device is required: `make gpu-test` has already
// refused to run on a host without one, so any error here is a failure, not a skip.
func openGPU(t testing.TB) *Runtime {
	t.Helper()
	rt, err := Open(Config{Logger: zaptest.NewLogger(t)})
	require.NoError(t, err, "the gpu build tag requires a CUDA device and the libraries")
	t.Cleanup(func() { _ = rt.Close() })
	return rt
}

func newStream(t testing.TB, rt *Runtime) *Stream {
	t.Helper()
	s, err := rt.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// alloc returns n bytes of device memory starting shift bytes past a 256-byte boundary.
func alloc(t testing.TB, rt *Runtime, n int64, shift int) Mem {
	t.Helper()
	b, err := rt.Alloc(n + 32)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Free()) })
	m, err := b.Mem().Slice(int64(shift), n)
	require.NoError(t, err)
	return m
}

func waitStream(t testing.TB, s *Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), gpuWait)
	defer cancel()
	require.NoError(t, s.Wait(ctx))
}

func TestGPU_DeviceInfo(t *testing.T) {
	rt := openGPU(t)
	info := rt.Info()
	require.NotEmpty(t, info.Name)
	require.Positive(t, info.SMs)
	require.Positive(t, info.TotalMemory)
	require.Positive(t, info.DriverVersion)
	t.Logf("%+v", info)
}

// Every kernel against the element-by-element reference on device memory: random layouts
// (packed orders, padded and randomly nested strides), TP head and PP layer selections, MLA,
// element sizes 1/2/4, chunk ranges, and misaligned pool and buffer addresses so every vector
// width runs. Bytes of the pool outside the plan's range must not change.
func TestGPU_KernelsMatchReference(t *testing.T) {
	rt := openGPU(t)
	s := newStream(t, rt)
	r := rand.New(rand.NewPCG(11, 11))
	for _, tc := range kernelCases(t, 2, 300) {
		t.Run(tc.desc, func(t *testing.T) {
			p := tc.plan
			span := p.Layout().SpanBytes()
			poolHost := make([]byte, span)
			randomBytes(r, poolHost)
			pool := alloc(t, rt, span, tc.poolShift)
			dp, err := rt.UploadPlan(p)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, dp.Free()) })
			for _, c := range tc.chunks {
				src := make([]byte, c.Length)
				randomBytes(r, src)
				wantGather, wantPool := expected(t, p, poolHost, c, src)
				buf := alloc(t, rt, c.Length, tc.bufShift)

				require.NoError(t, rt.CopyToDevice(pool, poolHost))
				require.NoError(t, rt.Gather(s, dp, pool, c.Offset, buf))
				waitStream(t, s)
				got := make([]byte, c.Length)
				require.NoError(t, rt.CopyFromDevice(got, buf))
				require.Equal(t, wantGather, got, "gather of %+v", c)

				require.NoError(t, rt.CopyToDevice(buf, src))
				require.NoError(t, rt.Scatter(s, dp, buf, c.Offset, pool))
				waitStream(t, s)
				gotPool := make([]byte, span)
				require.NoError(t, rt.CopyFromDevice(gotPool, pool))
				require.Equal(t, wantPool, gotPool, "scatter of %+v", c)
			}
		})
	}
}

func TestGPU_CopyArgumentsAreChecked(t *testing.T) {
	rt := openGPU(t)
	s := newStream(t, rt)
	l := layouttest.Llama3_8B(4)
	p, err := layout.NewPlan(l, l.All(), []int32{3, 1})
	require.NoError(t, err)
	dp, err := rt.UploadPlan(p)
	require.NoError(t, err)
	pool := alloc(t, rt, l.SpanBytes(), 0)
	buf := alloc(t, rt, p.Bytes(), 0)
	small, err := pool.Slice(0, l.SpanBytes()-1)
	require.NoError(t, err)

	require.NoError(t, rt.Gather(s, dp, pool, p.Bytes(), Mem{Addr: buf.Addr}), "an empty range succeeds at once")
	require.ErrorIs(t, rt.Gather(s, dp, small, 0, buf), ErrInvalidArgument, "pool smaller than the layout")
	require.ErrorIs(t, rt.Gather(s, dp, pool, 1, buf), layout.ErrOutOfRange, "range past the stream")
	require.ErrorIs(t, rt.Scatter(s, dp, buf, -1, pool), layout.ErrOutOfRange)
	require.ErrorIs(t, rt.Gather(nil, dp, pool, 0, buf), ErrClosed, "no stream")
	require.NoError(t, dp.Free())
	require.ErrorIs(t, rt.Gather(s, dp, pool, 0, buf), ErrClosed, "freed plan")
	require.ErrorIs(t, dp.Free(), ErrClosed)
	waitStream(t, s)
}

// L4: polling never blocks. An event behind a kernel that spins for a while is queried: the
// answer is "not ready", at once; only Wait, under its context, waits for it.
func TestL4_EventQueryOnUnfinishedWorkDoesNotBlock(t *testing.T) {
	rt := openGPU(t)
	s := newStream(t, rt)
	e, err := rt.NewEvent(false)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })

	const spinMs = 500
	require.NoError(t, rt.spin(s, spinMs))
	require.NoError(t, e.Record(s))
	start := time.Now()
	done, err := e.Query()
	took := time.Since(start)
	require.NoError(t, err)
	require.False(t, done, "the event sits behind a %d ms kernel", spinMs)
	require.Less(t, took, 50*time.Millisecond, "Query must not wait for the GPU")
	streamDone, err := s.Query()
	require.NoError(t, err)
	require.False(t, streamDone)

	short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, e.Wait(short), context.DeadlineExceeded, "a wait ends with its context")

	ctx, cancel2 := context.WithTimeout(context.Background(), gpuWait)
	defer cancel2()
	require.NoError(t, e.Wait(ctx))
	done, err = e.Query()
	require.NoError(t, err)
	require.True(t, done)
}

// BenchmarkGPU_Llama3_8B gathers and scatters one 4096-token request (128 blocks of 32
// tokens, 512 MiB) of a Llama-3-8B-shaped pool on device memory and compares the bandwidth
// with cudaMemcpy device-to-device of the same bytes, measured in the same iteration with
// CUDA events. The target is a ratio of 0.9 or more.
func BenchmarkGPU_Llama3_8B(b *testing.B) {
	dims := layouttest.Llama3_8B(1).Dims()
	dims.NumBlocks = 256
	for _, order := range []layout.Order{layout.BlockMajor, layout.LayerMajor, layout.LayerMajorNHD} {
		b.Run(order.String(), func(b *testing.B) {
			rt := openGPU(b)
			s := newStream(b, rt)
			l := layout.Packed(dims, order)
			r := rand.New(rand.NewPCG(3, 3))
			blocks := make([]int32, 128)
			for i, v := range r.Perm(int(l.NumBlocks))[:128] {
				blocks[i] = int32(v)
			}
			p, err := layout.NewPlan(l, l.All(), blocks)
			require.NoError(b, err)
			dp, err := rt.UploadPlan(p)
			require.NoError(b, err)
			b.Cleanup(func() { _ = dp.Free() })
			n := p.Bytes()
			pool := alloc(b, rt, l.SpanBytes(), 0)
			stage := alloc(b, rt, n, 0)
			other := alloc(b, rt, n, 0)
			require.NoError(b, rt.Memset(s, pool, 0x5a))

			events := make([]*Event, 4)
			for i := range events {
				events[i], err = rt.NewEvent(true)
				require.NoError(b, err)
				b.Cleanup(func() { _ = events[i].Close() })
			}
			ops := []struct {
				name string
				run  func() error
			}{
				{"d2d", func() error { return rt.Memcpy(s, other, stage) }},
				{"gather", func() error { return rt.Gather(s, dp, pool, 0, stage) }},
				{"scatter", func() error { return rt.Scatter(s, dp, stage, 0, pool) }},
			}
			for _, op := range ops { // warm-up: first launches pay for module loading
				require.NoError(b, op.run())
			}
			waitStream(b, s)

			total := make([]time.Duration, len(ops))
			b.SetBytes(n)
			b.ResetTimer()
			for range b.N {
				require.NoError(b, events[0].Record(s))
				for i, op := range ops {
					require.NoError(b, op.run())
					require.NoError(b, events[i+1].Record(s))
				}
				waitStream(b, s)
				for i := range ops {
					d, err := events[i+1].Elapsed(events[i])
					require.NoError(b, err)
					total[i] += d
				}
			}
			b.StopTimer()
			gbps := func(d time.Duration) float64 { return float64(n) * float64(b.N) / d.Seconds() / 1e9 }
			d2d, gather, scatter := gbps(total[0]), gbps(total[1]), gbps(total[2])
			b.ReportMetric(d2d, "d2d-GB/s")
			b.ReportMetric(gather, "gather-GB/s")
			b.ReportMetric(scatter, "scatter-GB/s")
			b.ReportMetric(gather/d2d, "gather/d2d")
			b.ReportMetric(scatter/d2d, "scatter/d2d")
			b.Logf("%s on %s: %d MiB, d2d %.0f GB/s, gather %.0f GB/s (%.2f), scatter %.0f GB/s (%.2f)",
				order, rt.Info().Name, n>>20, d2d, gather, gather/d2d, scatter, scatter/d2d)
		})
	}
}

// Close stops new work but never strands memory: what the Runtime handed out can still be
// freed afterwards.
func TestGPU_FreeAfterClose(t *testing.T) {
	rt, err := Open(Config{Logger: zaptest.NewLogger(t)})
	require.NoError(t, err)
	b, err := rt.Alloc(1 << 20)
	require.NoError(t, err)
	s, err := rt.NewStream()
	require.NoError(t, err)
	e, err := rt.NewEvent(false)
	require.NoError(t, err)
	require.NoError(t, rt.Close())

	_, err = rt.Alloc(16)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, rt.Memset(s, b.Mem(), 0), ErrClosed)
	require.NoError(t, e.Close())
	require.NoError(t, s.Close())
	require.NoError(t, b.Free())
	require.ErrorIs(t, b.Free(), ErrClosed)
}
