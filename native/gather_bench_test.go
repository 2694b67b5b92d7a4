// SPDX-License-Identifier: Apache-2.0

package native_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/native"
)

// llamaRequest is a 4096-token request on a Llama-3-8B-shaped pool (512 MiB of KV) whose
// 128 blocks are scattered over a larger pool in random order, as a serving pool's are.
func llamaRequest(b *testing.B) (*layout.Plan, []byte) {
	const tokens, poolBlocks = 4096, 160
	l := layouttest.Llama3_8B(poolBlocks)
	r := rand.New(rand.NewPCG(7, 8))
	var blocks []int32
	for _, id := range r.Perm(poolBlocks)[:tokens/l.TokensPerBlock] {
		blocks = append(blocks, int32(id))
	}
	p, err := layout.NewPlan(l, l.All(), blocks)
	require.NoError(b, err)
	pool := make([]byte, l.SpanBytes())
	for i := range pool {
		pool[i] = byte(i * 31)
	}
	return p, pool
}

// benchAgainstMemcpy runs op, a memcpy of the same byte count and a non-temporal copy of it in
// turn, b.N times each, and reports the bandwidths and ratios. Taking turns in one run keeps
// all three under the same machine conditions. ratio_to_memcpy is the target metric;
// ratio_to_stream_copy compares against a copy with the same store kind as large gathers.
func benchAgainstMemcpy(b *testing.B, bytes int64, op func() error) {
	src := make([]byte, bytes)
	dst := make([]byte, bytes)
	native.HostCopy(dst, src) // fault the pages in before timing
	require.NoError(b, op())
	b.SetBytes(bytes)
	b.ResetTimer()
	var opTime, copyTime, streamTime time.Duration
	for range b.N {
		t0 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		native.HostCopy(dst, src)
		t2 := time.Now()
		native.HostCopyStreaming(dst, src)
		streamTime += time.Since(t2)
		copyTime += t2.Sub(t1)
		opTime += t1.Sub(t0)
	}
	gbps := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(opTime), "GB/s")
	b.ReportMetric(gbps(copyTime), "memcpy_GB/s")
	b.ReportMetric(copyTime.Seconds()/opTime.Seconds(), "ratio_to_memcpy")
	b.ReportMetric(streamTime.Seconds()/opTime.Seconds(), "ratio_to_stream_copy")
}

// BenchmarkGather: the Llama-3-8B 4096-token request gathered from its pool into one
// contiguous buffer, against memcpy of the same bytes.
func BenchmarkGather(b *testing.B) {
	p, pool := llamaRequest(b)
	out := make([]byte, p.Bytes())
	benchAgainstMemcpy(b, p.Bytes(), func() error { return native.HostGather(p, pool, 0, out) })
}

// BenchmarkScatter: the same request scattered back into its pool.
func BenchmarkScatter(b *testing.B) {
	p, pool := llamaRequest(b)
	in := make([]byte, p.Bytes())
	benchAgainstMemcpy(b, p.Bytes(), func() error { return native.HostScatter(p, in, 0, pool) })
}

// BenchmarkGatherChunked: the same request gathered in 4 MiB chunks, as the staging path does.
func BenchmarkGatherChunked(b *testing.B) {
	p, pool := llamaRequest(b)
	chunks, err := kvplan.Chunks(p, 4<<20)
	require.NoError(b, err)
	slot := make([]byte, 4<<20)
	benchAgainstMemcpy(b, p.Bytes(), func() error {
		for _, c := range chunks {
			if err := native.HostGather(p, pool, c.Offset, slot[:c.Length]); err != nil {
				return err
			}
		}
		return nil
	})
}

// BenchmarkGatherScatterLayouts: the Llama-3-8B 4096-token request in 4 MiB staging chunks
// over every pool order and TP split, gathered on a prefill rank and scattered on the decode
// rank, against memcpy. In layer-major-nhd (vLLM's paged layout: token, then head, then dim)
// every contiguous piece of the stream is one row of one head (256 bytes); a TP=2 rank's half
// of a token's heads is 1 KiB of its pool, a TP=1 decode rank's half of a token 1 KiB of its.
func BenchmarkGatherScatterLayouts(b *testing.B) {
	const tokens, poolBlocks = 4096, 160
	full := layouttest.Llama3_8B(poolBlocks).Dims()
	half := full
	half.NumHeads /= 2
	for _, c := range []struct {
		name  string
		dims  layout.Dims
		order layout.Order
		heads [2]int64 // the plan's selection of heads
	}{
		{"block-major", full, layout.BlockMajor, [2]int64{0, 8}},
		{"layer-major", full, layout.LayerMajor, [2]int64{0, 8}},
		{"nhd", full, layout.LayerMajorNHD, [2]int64{0, 8}},
		{"nhd-tp2-rank", half, layout.LayerMajorNHD, [2]int64{0, 4}},
		{"nhd-tp2-into-tp1", full, layout.LayerMajorNHD, [2]int64{4, 8}},
	} {
		l := layout.Packed(c.dims, c.order)
		sel := l.All()
		sel.HeadBegin, sel.HeadEnd = c.heads[0], c.heads[1]
		r := rand.New(rand.NewPCG(7, 8))
		var blocks []int32
		for _, id := range r.Perm(poolBlocks)[:tokens/l.TokensPerBlock] {
			blocks = append(blocks, int32(id))
		}
		p, err := layout.NewPlan(l, sel, blocks)
		require.NoError(b, err)
		pool := make([]byte, l.SpanBytes())
		native.HostCopy(pool, pool) // fault the pages in
		chunks, err := kvplan.Chunks(p, 4<<20)
		require.NoError(b, err)
		slot := make([]byte, 4<<20)
		b.Run(c.name+"/gather", func(b *testing.B) {
			benchAgainstMemcpy(b, p.Bytes(), func() error {
				for _, ch := range chunks {
					if err := native.HostGather(p, pool, ch.Offset, slot[:ch.Length]); err != nil {
						return err
					}
				}
				return nil
			})
		})
		b.Run(c.name+"/scatter", func(b *testing.B) {
			benchAgainstMemcpy(b, p.Bytes(), func() error {
				for _, ch := range chunks {
					if err := native.HostScatter(p, slot[:ch.Length], ch.Offset, pool); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}
