// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
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
		{"block-major to layer-major: IOV messages, or rma read in place", layout.LayerMajor, func(j int) int32 { return int32(j) }, func(j int) int32 { return int32(j) }, PathDirect},
	}
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.Tuning.RMAWhereEmulated = true      // the RMA mode itself, over TCP too
			cfg.Tuning.RMAMinRegionBytes = 64 << 10 // one 128 KiB block is a range
			cfg.Tuning.DirectChunkBytes = 1 << 20
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
					hs, hr := startKV(t, src, dst, id, s, r)
					waitQuiesced(t, hr, 20*time.Second)
					waitQuiesced(t, hs, 20*time.Second)
					require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
					require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
					want := c.wantPath
					if c.dst == layout.LayerMajor && tr.name == "shm" {
						want = PathRMA // the small ranges read in place (InPlaceMinRegionBytes)
					}
					require.Equal(t, want, hr.Path())
					require.Equal(t, want, hs.Path())
					require.LessOrEqual(t, rmaKeys(dst.tr), i+2, "one unpacked key per peer pool (a pool per case so far) and one for its generation words, however many gets")
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
					for _, e := range []*Engine{src.e, dst.e} {
						require.Zero(t, e.pool.Stats().Leased)
					}
				})
			}
			t.Run("an offer of 2000 blocks goes in parts that fit UCX's control messages", func(t *testing.T) {
				small := layout.Dims{NumLayers: 1, KVFactor: 2, NumHeads: 1, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 2048}
				sb, rb := make([]int32, 2000), make([]int32, 2000)
				for j := range sb {
					sb[j], rb[j] = int32(j+40), int32(j+8)
				}
				s := mappedKV(t, src, small, layout.BlockMajor, sb, 31)
				r := mappedKV(t, dst, small, layout.BlockMajor, rb, 0)
				hs, hr := startKV(t, src, dst, 780, s, r)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, PathRMA, hr.Path())
				require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
			})
			t.Run("receiver cancels with gets in flight", func(t *testing.T) {
				big := layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 128}
				ids := make([]int32, 128)
				for j := range ids {
					ids[j] = int32(j)
				}
				s := mappedKV(t, src, big, layout.BlockMajor, ids, 77)
				r := mappedKV(t, dst, big, layout.BlockMajor, ids, 0)
				hs, hr := startKV(t, src, dst, 790, s, r)
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
				require.Equal(t, Cancelled, hs.Status().State, "%v", hs.Status().Err)
				require.ErrorIs(t, hs.Status().Err, ErrPeerAborted)
				require.False(t, hr.Status().BlocksPoisoned)
				require.False(t, hs.Status().BlocksPoisoned)
			})
		})
	}
}

// The RMA mode between two engines in two processes, each direction, over shared memory and
// TCP: every byte checked by the receiving side, and the local handle says it took gets.
func TestUCXRMA_TwoProcessesEveryByteChecked(t *testing.T) {
	const blocks = 16 // 32 MiB
	bin := peerproc.BuildEnginePeer(t)
	for _, tr := range ucxTransports {
		for _, mode := range []string{"engine-send", "engine-recv"} {
			t.Run(tr.name+"/"+mode, func(t *testing.T) {
				peer := peerproc.Start(t, bin, append(ucxPeerArgs(tr.tls, tr.dev, mode, blocks, 78, 30*time.Second), "-direct", "-rma-where-emulated")...)
				cfg := ucxPeerTestConfig()
				cfg.Tuning.RMAWhereEmulated = true // the RMA mode itself, over TCP too
				local := newUCXEngine(t, tr.tls, tr.dev, cfg)
				peer.Connect(t, string(local.tr.Self()))
				goPool, plan := ucxEnginePool(t, blocks, 5, mode == "engine-recv")
				pool, err := local.tr.AllocatePool(int64(len(goPool)))
				require.NoError(t, err)
				copy(pool, goPool)
				spec := Spec{ID: 78, Peer: Peer(peer.Addr), Plan: plan, Pool: pool, Timeout: 30 * time.Second}
				var h *Handle
				if mode == "engine-send" {
					h, err = local.e.Receive(bg, spec)
				} else {
					h, err = local.e.Send(bg, spec)
				}
				require.NoError(t, err)
				waitQuiesced(t, h, 30*time.Second)
				require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
				require.Equal(t, PathRMA, h.Path())
				require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", 30*time.Second))
				if mode == "engine-send" {
					want, _ := ucxEnginePool(t, blocks, 5, true)
					require.True(t, bytes.Equal(want, pool), "every byte")
				}
			})
		}
	}
}

// A sender frozen (SIGSTOP) while the receiver pulls: over shared memory the gets need
// nothing of the sender's process (cma reads a stopped process's memory; an attached segment
// is plain memory), so the transfer completes with every byte; over TCP, where UCX's emulated
// gets need the sender's worker to answer, the receiver ends within its deadline and then
// quiesces, or keeps its blocks poisoned for good: never a wedge, never a false quiescence.
func TestUCXRMA_SenderFrozenWhileReceiverPulls(t *testing.T) {
	const blocks = 128 // 256 MiB
	bin := peerproc.BuildEnginePeer(t)
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ucxPeerTestConfig()
			cfg.Tuning.DirectChunkBytes = 4 << 20
			cfg.Tuning.RMAWhereEmulated = true // the RMA mode itself, over TCP too
			local := newUCXEngine(t, tr.tls, tr.dev, cfg)
			peer := peerproc.Start(t, bin, append(ucxPeerArgs(tr.tls, tr.dev, "engine-send", blocks, 79, 120*time.Second), "-direct")...)
			peer.Connect(t, string(local.tr.Self()))
			goPool, plan := ucxEnginePool(t, blocks, 5, false)
			pool, err := local.tr.AllocatePool(int64(len(goPool)))
			require.NoError(t, err)
			// The deadline covers the peer's start (it fills and maps 256 MiB first).
			const deadline = 8 * time.Second
			h, err := local.e.Receive(bg, Spec{ID: 79, Peer: Peer(peer.Addr), Plan: plan, Pool: pool, Timeout: deadline})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return h.Status().Bytes > 0 || isClosed(h.Done()) }, 60*time.Second, 100*time.Microsecond)
			peer.Signal(t, syscall.SIGSTOP)
			defer func() { _ = peer.Cmd.Process.Signal(syscall.SIGCONT) }()
			select {
			case <-h.Done():
			case <-time.After(deadline + 5*time.Second):
				require.FailNow(t, "receiver not done within its deadline", "%+v", h.Status())
			}
			require.Equal(t, PathRMA, h.Path())
			st := h.Status()
			t.Logf("frozen sender: %v after %d bytes (%v)", st.State, st.Bytes, st.Err)
			if st.State == Completed {
				waitClosed(t, h.Quiesced(), "completed receiver quiesced")
				want, _ := ucxEnginePool(t, blocks, 5, true)
				require.True(t, bytes.Equal(want, pool), "every byte")
				return
			}
			require.NotEqual(t, "shm", tr.name, "over shared memory the gets need no answer from the frozen sender")
			require.Eventually(t, func() bool { return isClosed(h.Quiesced()) || h.Status().BlocksPoisoned },
				cfg.Tuning.QuarantineTimeout+5*time.Second, time.Millisecond, "neither quiesced nor poisoned: %+v", h.Status())
			require.False(t, isClosed(h.Quiesced()) && h.Status().BlocksPoisoned, "quiesced with its blocks poisoned")
			t.Logf("then: %v, blocks poisoned: %v", h.Status().State, h.Status().BlocksPoisoned)
		})
	}
}

// rmaKeys counts the peer pools whose keys are unpacked, on any lane.
func rmaKeys(tr *ucx.Transport) int { return ucxhooks.Hooks.RemotePools(tr) }
