// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// vectorCase is one TP split over UCX shared memory: senders' pools (each its own engine) feed
// receivers' pools (each its own engine), sub i of receiver j reading from sender subs[j][i].
type vectorTP struct {
	senders, receivers []*ucxEngine
	sendKV             []*ucxKV         // per sender
	recvKV             []*ucxKV         // per receiver
	sendPlans          [][]*layout.Plan // [sender][receiver]: what sender s sends receiver r (nil: none)
	recvPlans          [][]*layout.Plan // [receiver][sender]
}

// vectorKV makes a pool of order o with heads heads, in memory the transport allocated or the
// test mapped and registered (caller).
func vectorKV(t *testing.T, u *ucxEngine, d layout.Dims, o layout.Order, heads int64, blocks []int32, seed uint64, caller bool) *ucxKV {
	t.Helper()
	d.NumHeads = heads
	if caller {
		k, _ := callerKV(t, u, d, o, blocks, seed, "anon")
		return k
	}
	return mappedKV(t, u, d, o, blocks, seed)
}

// A TP split into or out of a layer-major-nhd pool over shared memory, whose pieces (one
// token's half of the heads) are far under DirectMinRunBytes: the receivers take the RMA mode
// and read it piece by piece, every byte of every piece checked. Senders' pools UCX allocated
// (mapped here over posix shared memory) are copied out of the mapping, nothing read by
// process_vm_readv; caller pools (not mapped) are read with vector gets by process_vm_readv,
// every byte. No staging slot is used and nothing is left in the transports.
func TestUCXCMA_TPSplitNHDReadByVectorGets(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cfg := ucxTestConfig()
	cfg.Tuning.DirectMinRunBytes = 0 // the engine's default: 2 KiB; these pieces are 512 bytes
	cfg.Tuning.DirectChunkBytes = 256 << 10
	cfg.TransferTimeout, cfg.QueueTimeout = time.Minute, time.Minute // a loaded box: no deadline is what these are about
	cfg.ProgressDeadline, cfg.Tuning.QuarantineTimeout = 30*time.Second, 30*time.Second
	for _, c := range []struct {
		desc   string
		up     bool // TP=2->1 (two senders, one receiver); else TP=1->2
		caller bool
	}{
		{"TP=2->1 into nhd, caller pools", true, true},
		{"TP=2->1 into nhd, allocated pools", true, false},
		{"TP=1->2 out of nhd, caller pools", false, true},
		{"TP=1->2 out of nhd, allocated pools", false, false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			nS, nR := 2, 1
			if !c.up {
				nS, nR = 1, 2
			}
			var senders, receivers []*ucxEngine
			for range nS {
				senders = append(senders, newUCXEngine(t, "posix,cma,self", "", cfg))
			}
			for range nR {
				r := newUCXEngine(t, "posix,cma,self", "", cfg)
				ucxhooks.Hooks.AllowSameProcessCMA(r.tr) // every engine in this process
				receivers = append(receivers, r)
			}
			sb, rb := seqBlocks(3, 24), make([]int32, 24)
			for j := range rb {
				rb[j] = int32(60 - 2*j)
			}
			// The TP=1 side holds every head in nhd; the TP=2 side half of them each.
			var sendKV, recvKV []*ucxKV
			for i, s := range senders {
				heads := dims.NumHeads / int64(nS)
				sendKV = append(sendKV, vectorKV(t, s, dims, layout.LayerMajorNHD, heads, sb, uint64(10+i), c.caller))
			}
			for _, r := range receivers {
				recvKV = append(recvKV, vectorKV(t, r, dims, layout.LayerMajorNHD, dims.NumHeads/int64(nR), rb, 0, c.caller))
			}
			half := dims.NumHeads / 2
			id := RequestID(2600)
			var hs, hr []*Handle
			for i := range 2 { // the two halves of the heads
				si, ri := i, 0
				if !c.up {
					si, ri = 0, i
				}
				sPool, rPool := sendKV[si], recvKV[ri]
				sSel, rSel := sPool.plan.Selection(), rPool.plan.Selection()
				if c.up {
					rSel.HeadBegin, rSel.HeadEnd = int64(i)*half, int64(i+1)*half
				} else {
					sSel.HeadBegin, sSel.HeadEnd = int64(i)*half, int64(i+1)*half
				}
				sp, err := layout.NewPlan(sPool.plan.Layout(), sSel, sb)
				require.NoError(t, err)
				rp, err := layout.NewPlan(rPool.plan.Layout(), rSel, rb)
				require.NoError(t, err)
				rid := id
				if !c.up {
					rid += RequestID(i) // one sender, two requests
				}
				h, err := senders[si].e.Send(bg, Spec{ID: rid, Peer: receivers[ri].tr.Self(), Plan: sp, Pool: sPool.mem})
				require.NoError(t, err)
				hs = append(hs, h)
				if c.up {
					continue // one Receive with two subs below
				}
				h, err = receivers[ri].e.Receive(bg, Spec{ID: rid, Peer: senders[si].tr.Self(), Plan: rp, Pool: rPool.mem})
				require.NoError(t, err)
				hr = append(hr, h)
			}
			var subs []SubSpec
			if c.up {
				for i := range 2 {
					sel := recvKV[0].plan.Selection()
					sel.HeadBegin, sel.HeadEnd = int64(i)*half, int64(i+1)*half
					rp, err := layout.NewPlan(recvKV[0].plan.Layout(), sel, rb)
					require.NoError(t, err)
					subs = append(subs, SubSpec{Peer: senders[i].tr.Self(), Plan: rp})
				}
				h, err := receivers[0].e.Receive(bg, Spec{ID: id, Subs: subs, Pool: recvKV[0].mem})
				require.NoError(t, err)
				hr = append(hr, h)
			}
			for _, h := range append(hr, hs...) {
				waitQuiesced(t, h, 60*time.Second)
				require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
			}
			var total uint64
			for i, h := range hr {
				require.Equal(t, PathRMA, h.Path(), "receiver %d", i)
				total += uint64(h.Status().Bytes)
			}
			var read uint64
			for _, r := range receivers {
				st := ucxOf(r.tr).CMAStats()
				if c.caller {
					require.NotZero(t, st.Gets, "vector gets by process_vm_readv")
				}
				read += st.Bytes
			}
			if c.caller {
				require.Equal(t, total, read, "every byte read by process_vm_readv, once")
			} else {
				require.Zero(t, read, "pools mapped here: every piece copied out of the mapping, none read by process_vm_readv")
			}
			for i := range 2 { // every piece of each half where it belongs
				si, ri := i, 0
				if !c.up {
					si, ri = 0, i
				}
				sSel, rSel := sendKV[si].plan.Selection(), recvKV[ri].plan.Selection()
				if c.up {
					rSel.HeadBegin, rSel.HeadEnd = int64(i)*half, int64(i+1)*half
				} else {
					sSel.HeadBegin, sSel.HeadEnd = int64(i)*half, int64(i+1)*half
				}
				sp, err := layout.NewPlan(sendKV[si].plan.Layout(), sSel, sb)
				require.NoError(t, err)
				rp, err := layout.NewPlan(recvKV[ri].plan.Layout(), rSel, rb)
				require.NoError(t, err)
				want, got := make([]byte, sp.Bytes()), make([]byte, rp.Bytes())
				require.NoError(t, layouttest.ReferenceGather(sp, sendKV[si].mem, want))
				require.NoError(t, layouttest.ReferenceGather(rp, recvKV[ri].mem, got))
				require.True(t, bytes.Equal(want, got), "half %d: every byte", i)
			}
			for _, u := range append(senders, receivers...) {
				require.Zero(t, u.e.pool.Stats().Leased)
				require.Eventually(t, func() bool { return ucxhooks.Hooks.Ops(u.tr) == 0 }, 20*time.Second, time.Millisecond, "ops left")
			}
		})
	}
}

// A TP=2->1 receive into nhd cancelled while its vector gets run ends truthfully: cancelled
// (or completed, every byte right, where the reads won), then quiescent, its blocks not
// poisoned (every read returned); the senders end, no op or key is left, and each region
// unregisters.
func TestUCXCMA_VectorGetsCancelMidTransfer(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 256}
	cfg := ucxTestConfig()
	cfg.Tuning.DirectMinRunBytes = 0
	cfg.Tuning.DirectChunkBytes = 256 << 10
	cfg.TransferTimeout, cfg.QueueTimeout = time.Minute, time.Minute // a loaded box: no deadline is what these are about
	cfg.ProgressDeadline, cfg.Tuning.QuarantineTimeout = 30*time.Second, 30*time.Second
	half := dims
	half.NumHeads = 4
	var senders [2]*ucxEngine
	var srcs [2]*ucxKV
	blocks := seqBlocks(0, 240)
	for i := range 2 {
		senders[i] = newUCXEngine(t, "posix,cma,self", "", cfg)
		srcs[i], _ = callerKV(t, senders[i], half, layout.LayerMajorNHD, blocks, uint64(40+i), "anon")
	}
	recv := newUCXEngine(t, "posix,cma,self", "", cfg)
	ucxhooks.Hooks.AllowSameProcessCMA(recv.tr)
	dst, _ := callerKV(t, recv, dims, layout.LayerMajorNHD, blocks, 0, "anon")
	var subs []SubSpec
	var hs []*Handle
	for i := range 2 {
		sel := dst.plan.Selection()
		sel.HeadBegin, sel.HeadEnd = int64(4*i), int64(4*i+4)
		rp, err := layout.NewPlan(dst.plan.Layout(), sel, blocks)
		require.NoError(t, err)
		subs = append(subs, SubSpec{Peer: senders[i].tr.Self(), Plan: rp})
		h, err := senders[i].e.Send(bg, Spec{ID: 2700, Peer: recv.tr.Self(), Plan: srcs[i].plan, Pool: srcs[i].mem})
		require.NoError(t, err)
		hs = append(hs, h)
	}
	hr, err := recv.e.Receive(bg, Spec{ID: 2700, Subs: subs, Pool: dst.mem})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return hr.Status().Bytes > 0 || isClosed(hr.Done()) }, 60*time.Second, 100*time.Microsecond)
	recv.e.Cancel(2700)
	waitQuiesced(t, hr, 60*time.Second)
	st := hr.Status()
	t.Logf("after the cancel: %v (%v), %d bytes", st.State, st.Err, st.Bytes)
	require.False(t, st.BlocksPoisoned, "every read returned: nothing to poison")
	if st.State == Completed {
		for i, s := range subs {
			got := make([]byte, s.Plan.Bytes())
			require.NoError(t, layouttest.ReferenceGather(s.Plan, dst.mem, got))
			require.Equal(t, srcs[i].stream(t), got, fmt.Sprintf("half %d", i))
		}
	} else {
		require.Equal(t, Cancelled, st.State, "%v", st.Err)
	}
	for _, h := range hs {
		waitQuiesced(t, h, 60*time.Second)
	}
	for _, u := range append(senders[:], recv) {
		require.Eventually(t, func() bool { return ucxhooks.Hooks.Ops(u.tr) == 0 }, 20*time.Second, time.Millisecond, "ops left")
	}
}

// A sender over UCX shared memory whose offer of a layer-major-nhd TP=2 rank's pool names more
// memory than its key's segment has (a 1 MiB pool offered as 2 MiB, every layer past the
// first K half outside it) fails the receiver of that half with ErrProtocol: the mapping of the
// offered pool is refused (native.ErrOutOfBounds), and so is the vector get that would read
// it instead (the ranges the peer proved); nothing is read past the segment and nothing is
// written into the receiver's blocks. With reads in place and without.
func TestUCXCMA_TPSplitNHDOfferPastTheSegmentIsRefused(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		inPlace bool
	}{
		{"the mapping first", true},
		{"vector gets only (DisableInPlaceReads)", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			half := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 32}
			full := half
			full.NumHeads = 8
			cfg := ucxTestConfig()
			cfg.Tuning.DirectMinRunBytes = 0 // the engine's default: 2 KiB; these pieces are 1 KiB
			cfg.Tuning.DisableInPlaceReads = !tc.inPlace
			cfg.TransferTimeout, cfg.QueueTimeout = time.Minute, time.Minute // a loaded box: no deadline is what these are about
			dst := newUCXEngine(t, "posix,cma,self", "", cfg)
			ucxhooks.Hooks.AllowSameProcessCMA(dst.tr)
			evil, err := ucx.New(ucx.Config{TLS: "posix,cma,self", KeepaliveInterval: 200 * time.Millisecond, StagingBytes: 1 << 20, CloseTimeout: 2 * time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, evil.Close(true)) })
			pool, err := evil.AllocatePool(1 << 20)
			require.NoError(t, err)
			addr, key, err := ucxOf(evil).RMAKey(pool)
			require.NoError(t, err)
			claimed := newUCXKV(t, half, layout.LayerMajorNHD, seqBlocks(0, 8), 0) // 2 MiB: a pool twice the segment
			require.Greater(t, len(claimed.mem), len(pool))
			require.NoError(t, ucxContract(evil).Bind(fakeRMASender{tr: ucxContract(evil), offer: func(ri *wire.RequestInfo) []*wire.RMAOffer {
				return []*wire.RMAOffer{{Header: wire.Header{Sub: ri.Sub, Request: ri.Request, Nonce: ri.Nonce},
					Addr: addr, PoolBytes: int64(len(claimed.mem)), Layout: claimed.plan.Layout(), Selection: claimed.plan.Selection(),
					Blocks: append([]int32(nil), claimed.plan.Blocks()...), Key: key}}
			}}))
			r := mappedKV(t, dst, full, layout.LayerMajorNHD, seqBlocks(0, 8), 0)
			sel := r.plan.Selection()
			sel.HeadBegin, sel.HeadEnd = 4, 8
			rp, err := layout.NewPlan(r.plan.Layout(), sel, seqBlocks(0, 8))
			require.NoError(t, err)
			hr, err := dst.e.Receive(bg, Spec{ID: 1, Peer: evil.Self(), Plan: rp, Pool: r.mem})
			require.NoError(t, err)
			waitQuiesced(t, hr, 30*time.Second)
			st := hr.Status()
			require.Equal(t, Failed, st.State, "%v", st.Err)
			t.Logf("refused: %v", st.Err)
			require.ErrorIs(t, st.Err, ErrProtocol)
			require.Equal(t, PathRMA, hr.Path())
			require.Zero(t, ucxOf(dst.tr).CMAStats().Bytes, "nothing read by process_vm_readv")
			require.True(t, bytes.Equal(make([]byte, len(r.mem)), r.mem), "nothing written")
		})
	}
}
