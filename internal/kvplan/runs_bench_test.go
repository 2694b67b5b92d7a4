// SPDX-License-Identifier: Apache-2.0

package kvplan_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

// BenchmarkRuns walks whole Llama-3-8B requests (blocks of 32 tokens, in a random order of a
// 160-block pool) as pool ranges: what a receiver does per request before it can post
// anything (the RMA offer's regions, the IOV lists, the overlap check). "4k" is 128 blocks,
// "32tok" one block (the 32-token request of issue 26: 64 layer/kv pieces); "tp2to1" is the
// decode side of a TP=2 -> TP=1 transfer, one TP rank's half of the heads of an NHD pool
// (one 256-byte row per piece: the stream holds a head's tokens together, the pool does not).
// "walk" is Runs, "division" the formula it replaced (RunsByDivision), side by side in one
// binary so that a drifting host compares them in pairs.
func BenchmarkRuns(b *testing.B) {
	d := layouttest.Llama3_8B(160).Dims()
	for _, c := range []struct {
		name   string
		order  layout.Order
		blocks int
		heads  int64 // 0: all
	}{
		{"block-major/4k", layout.BlockMajor, 128, 0},
		{"layer-major/4k", layout.LayerMajor, 128, 0},
		{"block-major/32tok", layout.BlockMajor, 1, 0},
		{"layer-major/32tok", layout.LayerMajor, 1, 0},
		{"layer-major-nhd/32tok/tp2to1", layout.LayerMajorNHD, 1, 4},
		{"layer-major-nhd/4k/tp2to1", layout.LayerMajorNHD, 128, 4},
	} {
		l := layout.Packed(d, c.order)
		ids := make([]int32, c.blocks)
		for i, v := range rand.New(rand.NewPCG(1, 2)).Perm(160)[:c.blocks] {
			ids[i] = int32(v)
		}
		s := l.All()
		if c.heads > 0 {
			s.HeadEnd = s.HeadBegin + c.heads
		}
		p, err := layout.NewPlan(l, s, ids)
		if err != nil {
			b.Fatal(err)
		}
		for _, w := range []struct {
			name string
			runs func(*layout.Plan, int64, int64, func(int64, int64, int64)) error
		}{{"walk", kvplan.Runs}, {"division", kvplan.RunsByDivision}} {
			b.Run(c.name+"/"+w.name, func(b *testing.B) {
				n := 0
				for b.Loop() {
					n = 0
					_ = w.runs(p, 0, p.Bytes(), func(_, _, _ int64) { n++ })
				}
				b.ReportMetric(float64(n), "runs")
			})
		}
	}
}
