// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda/layout"
)

// The receiver chooses its path by what UCX says about the endpoint's lanes: gets over shared
// memory (native), tagged IOV messages over TCP (where UCX 1.13 emulates gets), RMA over TCP
// too when told to. Every byte checked.
func TestUCXPathChoiceFollowsTheEndpointsLanes(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, tr := range ucxTransports {
		for _, keep := range []bool{false, true} {
			want := PathRMA
			if tr.name == "tcp" && !keep {
				want = PathDirect
			}
			t.Run(tr.name+"/"+map[bool]string{false: "default", true: "RMAWhereEmulated"}[keep], func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.RMAMinRegionBytes = 64 << 10
				cfg.DirectChunkBytes = 1 << 20
				cfg.RMAWhereEmulated = keep
				src := newUCXEngine(t, tr.tls, tr.dev, cfg)
				dst := newUCXEngine(t, tr.tls, tr.dev, cfg)
				require.Equal(t, tr.name == "tcp", dst.tr.GetsEmulated(src.tr.Self()))
				sb, rb := make([]int32, 21), make([]int32, 21)
				for j := range sb {
					sb[j], rb[j] = int32(j*3)%64, int32(63-j)
				}
				s := mappedKV(t, src, dims, layout.BlockMajor, sb, 5)
				r := mappedKV(t, dst, dims, layout.BlockMajor, rb, 0)
				hs, hr := startKV(t, src, dst, 900, s, r)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
				require.Equal(t, want, hr.Path())
				require.Equal(t, want, hs.Path())
				require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
			})
		}
	}
}
