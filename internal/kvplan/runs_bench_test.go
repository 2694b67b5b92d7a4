// SPDX-License-Identifier: Apache-2.0

package kvplan_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

// BenchmarkRuns walks a whole 4096-token Llama-3-8B request (128 blocks of 32 tokens, in a
// random order of a 160-block pool) as pool ranges: what a receiver does per request before
// it can post anything (the RMA offer's regions, the IOV lists, the overlap check).
func BenchmarkRuns(b *testing.B) {
	d := layouttest.Llama3_8B(160).Dims()
	for _, o := range []layout.Order{layout.BlockMajor, layout.LayerMajor} {
		l := layout.Packed(d, o)
		ids := make([]int32, 128)
		for i, v := range rand.New(rand.NewPCG(1, 2)).Perm(160)[:128] {
			ids[i] = int32(v)
		}
		p, err := layout.NewPlan(l, l.All(), ids)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(o.String(), func(b *testing.B) {
			n := 0
			for b.Loop() {
				n = 0
				_ = kvplan.Runs(p, 0, p.Bytes(), func(_, _, _ int64) { n++ })
			}
			b.ReportMetric(float64(n), "runs")
		})
	}
}
