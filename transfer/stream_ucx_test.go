// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
)

// Streamed and partial transfers between two engines over UCX shared memory: the receiver sees
// layers arrive in order as the sender marks them, only the blocks it lacks move, and a
// cancel mid-stream ends both sides by the lifecycle rules.
func TestUCXStreamedAndPartialTransfers(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cfg := ucxTestConfig()
	cfg.SlotBytes = 64 << 10 // 256 KiB a layer: four chunks each
	src := newUCXEngine(t, "posix,cma,self", "", cfg)
	dst := newUCXEngine(t, "posix,cma,self", "", cfg)
	cases := []struct {
		desc   string
		held   []int
		cancel bool
	}{
		{"streamed", nil, false},
		{"streamed and partial", []int{0, 1, 2, 3, 4, 5, 6, 7, 20}, false},
		{"cancelled mid-stream", nil, true},
	}
	for i, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			s := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 32), uint64(i+3))
			r := newUCXKV(t, dims, layout.LayerMajor, seqBlocks(32, 32), 0)
			id := RequestID(500 + i)
			hs, err := src.e.Send(bg, Spec{ID: id, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem, Stream: true})
			require.NoError(t, err)
			hr, err := dst.e.Receive(bg, Spec{ID: id, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem, Stream: true, Held: c.held})
			require.NoError(t, err)
			for l := 1; l <= int(dims.NumLayers); l++ {
				require.NoError(t, hs.MarkLayersReady(l))
				if c.cancel && l == 2 {
					eventually(t, func() bool { return hr.LayersReady() == 2 }, "two layers over")
					require.Equal(t, CancelRequestedInFlight, src.e.Cancel(id))
					break
				}
				eventually(t, func() bool { return hr.LayersReady() == l }, "layer over")
			}
			waitQuiesced(t, hs, 20*time.Second)
			waitQuiesced(t, hr, 20*time.Second)
			if c.cancel {
				requireState(t, hs, Cancelled, ErrCancelled)
				requireState(t, hr, Failed, ErrPeerAborted)
			} else {
				requireState(t, hs, Completed)
				requireState(t, hr, Completed)
				sp, err := kvplan.WithoutPositions(s.plan, c.held) // nil held: the whole plan
				require.NoError(t, err)
				rp, err := kvplan.WithoutPositions(r.plan, c.held)
				require.NoError(t, err)
				want := make([]byte, sp.Bytes())
				require.NoError(t, layouttest.ReferenceGather(sp, s.mem, want))
				got := make([]byte, rp.Bytes())
				require.NoError(t, layouttest.ReferenceGather(rp, r.mem, got))
				require.Equal(t, want, got)
			}
			require.NoError(t, hs.Release())
			require.NoError(t, hr.Release())
			require.True(t, src.e.Health().Healthy, src.e.Health().Reason)
		})
	}
}
