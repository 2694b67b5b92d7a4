// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"math/rand/v2"
	"testing"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

// BenchmarkRMARegions pairs the sender's and the receiver's plans of a 4096-token Llama-3-8B
// request (128 blocks in a random order of each 160-block pool) into the offer's regions:
// what a receiver works out between an offer's arrival and its first read.
func BenchmarkRMARegions(b *testing.B) {
	d := layouttest.Llama3_8B(160).Dims()
	plan := func(o layout.Order, seed uint64) *layout.Plan {
		l := layout.Packed(d, o)
		ids := make([]int32, 128)
		for i, v := range rand.New(rand.NewPCG(seed, 2)).Perm(160)[:128] {
			ids[i] = int32(v)
		}
		p, err := layout.NewPlan(l, l.All(), ids)
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name     string
		src, dst layout.Order
	}{
		{"block-major", layout.BlockMajor, layout.BlockMajor},
		{"layer-major", layout.LayerMajor, layout.LayerMajor},
		{"block-to-layer", layout.BlockMajor, layout.LayerMajor},
	} {
		src, dst := plan(c.src, 1), plan(c.dst, 3)
		b.Run(c.name, func(b *testing.B) {
			n := 0
			for b.Loop() {
				r, ok := rmaRegions(src, dst)
				if !ok {
					b.Fatal("too many pieces")
				}
				n = len(r)
			}
			b.ReportMetric(float64(n), "regions")
		})
	}
}
