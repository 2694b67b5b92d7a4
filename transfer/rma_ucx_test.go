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

// The RMA mode between two engines over UCX, shared memory and TCP (where UCX emulates RMA
// over active messages): every byte checked, the path taken named, no slot used; a layout
// conversion falls back to IOV messages; and a receiver that cancels with gets in flight
// quiesces only after they end, and lets the sender quiesce too.
func TestUCXRMA_EveryByteAndCancel(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cases := []struct {
		desc     string
		dst      layout.Order
		srcIDs   func(j int) int32
		dstIDs   func(j int) int32
		wantPath Path
	}{
		{"block-major both sides, scattered blocks", layout.BlockMajor, func(j int) int32 { return int32(j*3) % 64 }, func(j int) int32 { return int32(63 - j) }, PathRMA},
		{"block-major both sides, consecutive blocks", layout.BlockMajor, func(j int) int32 { return int32(j + 4) }, func(j int) int32 { return int32(j + 20) }, PathRMA},
		{"block-major to layer-major: IOV messages", layout.LayerMajor, func(j int) int32 { return int32(j) }, func(j int) int32 { return int32(j) }, PathDirect},
	}
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.RMAMinRegionBytes = 64 << 10 // one 128 KiB block is a range
			cfg.DirectChunkBytes = 1 << 20
			src := newUCXEngine(t, tr.tls, tr.dev, cfg)
			dst := newUCXEngine(t, tr.tls, tr.dev, cfg)
			for i, c := range cases {
				t.Run(c.desc, func(t *testing.T) {
					sb, rb := make([]int32, 21), make([]int32, 21)
					for j := range sb {
						sb[j], rb[j] = c.srcIDs(j), c.dstIDs(j)
					}
					s := mappedKV(t, src, dims, layout.BlockMajor, sb, uint64(i+1))
					r := mappedKV(t, dst, dims, c.dst, rb, 0)
					id := RequestID(700 + i)
					hs, err := src.e.Send(bg, Spec{ID: id, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem})
					require.NoError(t, err)
					hr, err := dst.e.Receive(bg, Spec{ID: id, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem})
					require.NoError(t, err)
					waitQuiesced(t, hr, 20*time.Second)
					waitQuiesced(t, hs, 20*time.Second)
					require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
					require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
					require.Equal(t, c.wantPath, hr.Path())
					require.Equal(t, c.wantPath, hs.Path())
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
					for _, e := range []*Engine{src.e, dst.e} {
						require.Zero(t, e.pool.Stats().Leased)
					}
				})
			}
			t.Run("receiver cancels with gets in flight", func(t *testing.T) {
				big := layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 128}
				ids := make([]int32, 128)
				for j := range ids {
					ids[j] = int32(j)
				}
				s := mappedKV(t, src, big, layout.BlockMajor, ids, 77)
				r := mappedKV(t, dst, big, layout.BlockMajor, ids, 0)
				hs, err := src.e.Send(bg, Spec{ID: 790, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem})
				require.NoError(t, err)
				hr, err := dst.e.Receive(bg, Spec{ID: 790, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem})
				require.NoError(t, err)
				require.Eventually(t, func() bool { return hr.Status().Bytes > 0 || isClosed(hr.Done()) }, 20*time.Second, 50*time.Microsecond)
				out := dst.e.Cancel(790)
				t.Logf("cancel after %d bytes: %v", hr.Status().Bytes, out)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				require.Equal(t, PathRMA, hr.Path())
				if out == AlreadyComplete { // 256 MiB at memory speed can beat the cancel
					require.Equal(t, Completed, hr.Status().State)
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
					return
				}
				require.Contains(t, []CancelOutcome{CancelRequestedInFlight, BackendUnhealthy}, out)
				require.Equal(t, Cancelled, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, Failed, hs.Status().State, "%v", hs.Status().Err)
				require.ErrorIs(t, hs.Status().Err, ErrPeerAborted)
				require.False(t, hr.Status().BlocksPoisoned)
				require.False(t, hs.Status().BlocksPoisoned)
			})
		})
	}
}
