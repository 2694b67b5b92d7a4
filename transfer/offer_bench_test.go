// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

// BenchmarkOfferCheck32 times checkOffer's steps for a 32-token Llama-3-8B request (one
// 32-token block), in each pool order: the plan, its checks, and the pairing into regions.
func BenchmarkOfferCheck32(b *testing.B) {
	d := layouttest.Llama3_8B(1024).Dims()
	for _, o := range []layout.Order{layout.BlockMajor, layout.LayerMajor} {
		l := layout.Packed(d, o)
		dst, _ := layout.NewPlan(l, l.All(), []int32{7})
		b.Run(o.String()+"/NewPlan", func(b *testing.B) {
			for b.Loop() {
				_, _ = layout.NewPlan(l, l.All(), []int32{3})
			}
		})
		src, _ := layout.NewPlan(l, l.All(), []int32{3})
		b.Run(o.String()+"/span+shapes", func(b *testing.B) {
			for b.Loop() {
				_ = kvplan.PoolSpan(src)
				_ = kvplan.CompatibleShapes(kvplan.ShapeOf(src), kvplan.ShapeOf(dst))
			}
		})
		b.Run(o.String()+"/rmaRegions", func(b *testing.B) {
			for b.Loop() {
				_, _ = rmaRegions(src, dst)
			}
		})
	}
}

// BenchmarkSortByDst compares sortByDst's radix sort with the comparison sort on n pieces
// 32 KiB apart in a random order above a 1 GiB offset: the sizes a request's pieces come in.
func BenchmarkSortByDst(b *testing.B) {
	for _, n := range []int{64, 128, 256, 512, 1024, 2048, 8192} {
		r := rand.New(rand.NewPCG(1, 2))
		p := make([]rmaRegion, n)
		for i, v := range r.Perm(n) {
			p[i] = rmaRegion{dst: int64(v)*32768 + 1<<30}
		}
		q := make([]rmaRegion, n)
		b.Run(fmt.Sprintf("radix/%d", n), func(b *testing.B) {
			for b.Loop() {
				copy(q, p)
				radixSortByDst(q)
			}
		})
		b.Run(fmt.Sprintf("cmp/%d", n), func(b *testing.B) {
			for b.Loop() {
				copy(q, p)
				slices.SortFunc(q, func(a, b rmaRegion) int { return cmp.Compare(a.dst, b.dst) })
			}
		})
	}
}
