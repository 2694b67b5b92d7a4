// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// mappedKV is newUCXKV with the pool moved into memory the transport mapped, so the one-copy
// path may hand it to UCX.
// startKV starts request id from src's pool s to dst's pool r: the Send, then the Receive.
func startKV(t testing.TB, src, dst *ucxEngine, id RequestID, s, r *ucxKV) (hs, hr *Handle) {
	t.Helper()
	hs, err := src.e.Send(bg, Spec{ID: id, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem})
	require.NoError(t, err)
	hr, err = dst.e.Receive(bg, Spec{ID: id, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem})
	require.NoError(t, err)
	return hs, hr
}

func mappedKV(t testing.TB, u *ucxEngine, d layout.Dims, o layout.Order, blockIDs []int32, seed uint64) *ucxKV {
	t.Helper()
	k := newUCXKV(t, d, o, blockIDs, seed)
	mem, err := u.tr.AllocatePool(int64(len(k.mem)))
	require.NoError(t, err)
	copy(mem, k.mem)
	k.mem = mem
	return k
}

// Direct transfers between two engines over UCX, shared memory and TCP, across layouts and
// chunk sizes; every byte checked against the reference gather. No staging slot is used.
func TestUCXDirect_EveryByteAcrossLayouts(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cases := []struct {
		desc     string
		src, dst layout.Order
		chunk    int64
		blocks   int32
	}{
		{"block-major to layer-major, one message", layout.BlockMajor, layout.LayerMajor, 64 << 20, 40},
		{"layer-major to NHD, 100 KB chunks", layout.LayerMajor, layout.LayerMajorNHD, 100_000, 40},
		{"block-major to block-major, 4 KiB chunks", layout.BlockMajor, layout.BlockMajor, 4096, 7},
	}
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ucxTestConfig()
			src := newUCXEngine(t, tr.tls, tr.dev, cfg)
			dst := newUCXEngine(t, tr.tls, tr.dev, cfg)
			for i, c := range cases {
				t.Run(c.desc, func(t *testing.T) {
					sb, rb := make([]int32, c.blocks), make([]int32, c.blocks)
					for j := range sb {
						sb[j], rb[j] = int32(j*3)%64, int32(63-j)
					}
					s := mappedKV(t, src, dims, c.src, uniqueBlocks(sb), uint64(i+1))
					r := mappedKV(t, dst, dims, c.dst, rb[:len(s.plan.Blocks())], 0)
					id := RequestID(500 + i)
					dst.e.cfg.Tuning.DirectChunkBytes = c.chunk // read only by transfers started after this
					hs, hr := startKV(t, src, dst, id, s, r)
					waitQuiesced(t, hr, 20*time.Second)
					waitQuiesced(t, hs, 20*time.Second)
					require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
					require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
					for _, e := range []*Engine{src.e, dst.e} {
						require.Zero(t, e.pool.Stats().Leased)
					}
				})
			}
		})
	}
}

// A direct Send whose receiver's pool is Go memory runs through staging (the receiver
// decides), and a direct-capable receiver with a Go-memory sender is refused as incompatible.
func TestUCXDirect_FallbackAndRefusal(t *testing.T) {
	dims := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 16}
	tr := ucxTransports[0]
	src := newUCXEngine(t, tr.tls, tr.dev, ucxTestConfig())
	dcfg := ucxTestConfig()
	dcfg.Tuning.DisableInPlaceReads = true // else the layer-major receiver below takes the pull wire, not direct
	dst := newUCXEngine(t, tr.tls, tr.dev, dcfg)
	ids := []int32{1, 2, 3, 4}

	s := mappedKV(t, src, dims, layout.BlockMajor, ids, 3)
	r := newUCXKV(t, dims, layout.LayerMajor, ids, 0)
	hs, hr := startKV(t, src, dst, 1, s, r)
	waitQuiesced(t, hr, 10*time.Second)
	waitQuiesced(t, hs, 10*time.Second)
	require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
	require.Equal(t, s.stream(t), r.stream(t))
	require.False(t, ucxOf(dst.tr).Direct(r.mem), "Go memory is never direct-capable")

	s2 := newUCXKV(t, dims, layout.BlockMajor, ids, 4)
	r2 := mappedKV(t, dst, dims, layout.LayerMajor, ids, 0)
	hs, hr = startKV(t, src, dst, 2, s2, r2)
	waitQuiesced(t, hr, 10*time.Second)
	waitQuiesced(t, hs, 10*time.Second)
	require.Equal(t, Failed, hr.Status().State)
	require.ErrorIs(t, hr.Status().Err, ErrIncompatible)
	require.Equal(t, make([]byte, r2.plan.Bytes()), r2.stream(t), "nothing written into a refused receiver's pool")
}

// A transport's mapped pools are unmapped on Close; Close refuses (and keeps the memory) only
// while UCX still uses it, which no finished transfer does.
func TestUCXDirect_AllocatePoolAfterCloseFails(t *testing.T) {
	tr := ucxTransports[0]
	u := newUCXEngine(t, tr.tls, tr.dev, ucxTestConfig())
	mem, err := u.tr.AllocatePool(1 << 20)
	require.NoError(t, err)
	require.Len(t, mem, 1<<20)
	require.True(t, ucxOf(u.tr).Direct(mem[4096:8192]))
	require.False(t, ucxOf(u.tr).Direct(make([]byte, 16)))
	require.NoError(t, u.e.Close())
	_, err = u.tr.AllocatePool(1 << 20)
	require.ErrorIs(t, err, ErrClosed)
	require.False(t, ucxOf(u.tr).Direct(mem))
}

// The peer sending a direct request is killed mid-transfer, on each mode of the direct path:
// the survivor's handle ends within its deadline and, since UCX wrote straight into the
// caller's pool, quiesces only once the transport proves it is done (or stays quarantined
// with BlocksPoisoned, never quiesced); no slot is involved. On the RMA mode over shared
// memory the receiver's gets may finish after the kill (they read the dead sender's shared
// segment, still mapped here): then it completes, and every byte must be right.
func TestUCXDirect_PeerKilledMidTransfer(t *testing.T) {
	const blocks = 256 // 512 MiB: far more than moves before the signal on the message mode
	bin := peerproc.BuildEnginePeer(t)
	for _, tr := range ucxTransports {
		for _, rma := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/rma=%v/%v", tr.name, rma, syscall.SIGKILL), func(t *testing.T) {
				cfg := ucxPeerTestConfig()
				cfg.Tuning.DirectChunkBytes = 8 << 20
				cfg.Tuning.DisableRMA = !rma // the receiver decides
				cfg.Tuning.RMAWhereEmulated = rma
				// The survivor replaces a worker the kill wedged (see servedOrWedged).
				local := newUCXEngine(t, tr.tls, tr.dev, cfg, func(c *ucx.Config) { c.ReplaceWedgedWorker = true })
				// The deadline covers the peer's start (it fills and maps 512 MiB first: slow on a
				// loaded 2-core host); the kill is seen through the endpoint, not the deadline.
				peer, h, pool := directFromNewPeer(t, bin, tr, local, blocks, 31, 120*time.Second)
				require.Eventually(t, func() bool { return h.Status().Bytes > 0 || isClosed(h.Done()) }, 60*time.Second, time.Millisecond)
				peer.Signal(t, syscall.SIGKILL)
				waitClosed(t, h.Done(), "receiver done")
				st := h.Status()
				want := map[bool]Path{false: PathDirect, true: PathRMA}[rma]
				require.Equal(t, want, h.Path())
				if rma { // the peer's keys (pool, generation words) were unpacked once, and go with its failed endpoint
					require.LessOrEqual(t, rmaKeys(local.tr), 2)
					require.Eventually(t, func() bool { return rmaKeys(local.tr) == 0 }, 20*time.Second, time.Millisecond,
						"the dead peer's remote key outlived its endpoint")
				}
				if st.State == Completed {
					require.True(t, rma, "512 MiB cannot have moved before the kill on the message mode")
					waitClosed(t, h.Quiesced(), "completed receiver quiesced")
					src, _ := ucxEnginePool(t, blocks, 5, true)
					require.True(t, bytes.Equal(src, pool), "a completed transfer has every byte right")
					return
				}
				require.Error(t, st.Err)
				select {
				case <-h.Quiesced():
					require.False(t, h.Status().BlocksPoisoned)
				case <-time.After(cfg.Tuning.QuarantineTimeout + 5*time.Second):
					require.True(t, h.Status().BlocksPoisoned, "neither quiesced nor poisoned: %+v", h.Status())
					require.Equal(t, Quarantined, h.Status().State)
				}
				t.Logf("after the kill: %v, blocks poisoned: %v (%v)", h.Status().State, h.Status().BlocksPoisoned, st.Err)
				require.Zero(t, local.e.pool.Stats().Leased)
				survivorServesANewPeer(t, bin, tr, local)
			})
		}
	}
}

// survivorServesANewPeer: after a peer died mid-transfer, a new peer process's direct request
// to the survivor moves every byte within its deadline, unless the dead peer wedged the
// survivor's shared-memory receive queue: then the survivor must replace its worker
// (ucx.Config.ReplaceWedgedWorker) and serve a peer given its new address.
func survivorServesANewPeer(t *testing.T, bin string, tr struct{ name, tls, dev string }, local *ucxEngine) {
	t.Helper()
	const blocks = 16
	_, h, pool := directFromNewPeer(t, bin, tr, local, blocks, 32, 30*time.Second)
	if !servedOrWedged(t, local, h, 35*time.Second, tr.name == "shm") {
		require.Equal(t, 1, ucxOf(local.tr).WorkersReplaced(), "the survivor replaces its wedged worker")
		// A peer given the new address, as after a restart: served by the new worker.
		_, h, pool = directFromNewPeer(t, bin, tr, local, blocks, 33, 30*time.Second)
		require.True(t, servedOrWedged(t, local, h, 35*time.Second, false), "served after the replacement")
		require.True(t, local.e.Health().Healthy, local.e.Health().Reason)
	}
	t.Logf("new peer's request: %v", h.Path())
	want, _ := ucxEnginePool(t, blocks, 5, true)
	require.True(t, bytes.Equal(want, pool), "every byte of the new peer's request")
}

// directFromNewPeer starts a peer process that sends request id (blocks of the seeded pool)
// on the direct path, and has local receive it into a pool the transport mapped, with a 30 s
// deadline. peerTimeout bounds the peer's whole run.
func directFromNewPeer(t *testing.T, bin string, tr struct{ name, tls, dev string }, local *ucxEngine, blocks int64,
	id RequestID, peerTimeout time.Duration) (*peerproc.Proc, *Handle, []byte) {
	t.Helper()
	peer := peerproc.Start(t, bin, append(ucxPeerArgs(tr.tls, tr.dev, "engine-send", blocks, id, peerTimeout), "-direct")...)
	peer.Connect(t, string(local.tr.Self()))
	goPool, plan := ucxEnginePool(t, blocks, 5, false)
	pool, err := local.tr.AllocatePool(int64(len(goPool)))
	require.NoError(t, err)
	h, err := local.e.Receive(bg, Spec{ID: id, Peer: Peer(peer.Addr), Plan: plan, Pool: pool, Timeout: 30 * time.Second})
	require.NoError(t, err)
	return peer, h, pool
}
