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

// Over shared memory, a receiver pulling from a pool the sender registered (its own mmap, not
// AllocatePool) reads it with process_vm_readv, since UCX 1.13 would emulate those gets:
// the transfer takes the RMA path, every byte checked, and the receiver's transport counts
// the reads. From an AllocatePool pool the gets stay UCX's (posix maps it).
func TestUCXCMA_CallerPoolsReadByProcessVMReadv(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cfg := ucxTestConfig()
	cfg.Tuning.RMAMinRegionBytes = 64 << 10
	cfg.Tuning.DirectChunkBytes = 1 << 20
	src := newUCXEngine(t, "posix,cma,self", "", cfg)
	dst := newUCXEngine(t, "posix,cma,self", "", cfg)
	ucxhooks.Hooks.AllowSameProcessCMA(dst.tr) // both engines in this process
	ids := seqBlocks(0, 32)

	s := mappedKV(t, src, dims, layout.BlockMajor, ids, 3)
	r, _ := callerKV(t, dst, dims, layout.BlockMajor, ids, 0, "anon")
	hs, hr := startKV(t, src, dst, 1600, s, r)
	waitQuiesced(t, hr, 20*time.Second)
	waitQuiesced(t, hs, 20*time.Second)
	require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
	require.Equal(t, PathRMA, hr.Path())
	require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
	require.Zero(t, ucxOf(dst.tr).CMAStats().Gets, "an AllocatePool pool: UCX's gets")

	s2, _ := callerKV(t, src, dims, layout.BlockMajor, ids, 4, "anon")
	r2, _ := callerKV(t, dst, dims, layout.BlockMajor, ids, 0, "anon")
	hs, hr = startKV(t, src, dst, 1601, s2, r2)
	waitQuiesced(t, hr, 20*time.Second)
	waitQuiesced(t, hs, 20*time.Second)
	require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
	require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
	require.Equal(t, PathRMA, hr.Path())
	require.True(t, bytes.Equal(s2.stream(t), r2.stream(t)), "every byte")
	st := ucxOf(dst.tr).CMAStats()
	require.NotZero(t, st.Gets, "a registered pool: process_vm_readv")
	require.Equal(t, uint64(hr.Status().Bytes), st.Bytes, "every byte of the request read that way, once")
}

// Two processes: the peer sends from a pool it mapped and registered (-caller); this side
// receives into its own registered memory, by process_vm_readv, every byte checked.
func TestUCXCMA_TwoProcessesEveryByteChecked(t *testing.T) {
	const blocks = 16 // 32 MiB
	bin := peerproc.BuildEnginePeer(t)
	peer := peerproc.Start(t, bin, append(ucxPeerArgs("posix,cma,self", "", "engine-send", blocks, 83, 30*time.Second), "-caller")...)
	local := newUCXEngine(t, "posix,cma,self", "", ucxPeerTestConfig())
	peer.Connect(t, string(local.tr.Self()))
	goPool, plan := ucxEnginePool(t, blocks, 5, false)
	region, err := local.tr.RegisterHost(mmapPool(t, len(goPool), "anon"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, region.Unregister()) })
	h, err := local.e.Receive(bg, Spec{ID: 83, Peer: Peer(peer.Addr), Plan: plan, Pool: region.Pool(), Timeout: 30 * time.Second})
	require.NoError(t, err)
	waitQuiesced(t, h, 30*time.Second)
	require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
	require.Equal(t, PathRMA, h.Path())
	require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", 30*time.Second))
	want, _ := ucxEnginePool(t, blocks, 5, true)
	require.True(t, bytes.Equal(want, region.Pool()), "every byte")
	require.Equal(t, uint64(len(want)), ucxOf(local.tr).CMAStats().Bytes, "every byte read by process_vm_readv")
}

// The peer is killed while this side reads its registered pool with process_vm_readv: the
// receive ends (failed, or completed with every byte right if the reads won the race), then
// quiesces or stays poisoned for good; no slot, op or key is left, and this process lives on.
func TestUCXCMA_PeerKilledMidTransfer(t *testing.T) {
	const blocks = 256 // 512 MiB
	bin := peerproc.BuildEnginePeer(t)
	cfg := ucxPeerTestConfig()
	cfg.Tuning.DirectChunkBytes = 8 << 20
	local := newUCXEngine(t, "posix,cma,self", "", cfg)
	peer := peerproc.Start(t, bin, append(ucxPeerArgs("posix,cma,self", "", "engine-send", blocks, 84, 120*time.Second), "-caller")...)
	peer.Connect(t, string(local.tr.Self()))
	goPool, plan := ucxEnginePool(t, blocks, 5, false)
	region, err := local.tr.RegisterHost(mmapPool(t, len(goPool), "anon"))
	require.NoError(t, err)
	h, err := local.e.Receive(bg, Spec{ID: 84, Peer: Peer(peer.Addr), Plan: plan, Pool: region.Pool(), Timeout: 60 * time.Second})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return h.Status().Bytes > 0 || isClosed(h.Done()) }, 60*time.Second, 100*time.Microsecond)
	peer.Signal(t, syscall.SIGKILL)
	waitClosed(t, h.Done(), "receiver done")
	require.Equal(t, PathRMA, h.Path())
	require.NotZero(t, ucxOf(local.tr).CMAStats().Gets, "the reads went by process_vm_readv")
	st := h.Status()
	t.Logf("after the kill: %v (%v)", st.State, st.Err)
	if st.State == Completed {
		waitClosed(t, h.Quiesced(), "completed receiver quiesced")
		want, _ := ucxEnginePool(t, blocks, 5, true)
		require.True(t, bytes.Equal(want, region.Pool()), "a completed transfer has every byte right")
	} else {
		require.Error(t, st.Err)
		select {
		case <-h.Quiesced():
			require.False(t, h.Status().BlocksPoisoned)
		case <-time.After(cfg.Tuning.QuarantineTimeout + 5*time.Second):
			require.True(t, h.Status().BlocksPoisoned, "neither quiesced nor poisoned: %+v", h.Status())
		}
	}
	require.Zero(t, local.e.pool.Stats().Leased)
	ops, keys := -1, -1
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if ops, keys = ucxhooks.Hooks.Ops(local.tr), rmaKeys(local.tr); ops == 0 && keys == 0 {
			break
		}
	}
	require.Zero(t, ops, "ops left after the peer died")
	require.Zero(t, keys, "remote keys left after the peer died")
	if isClosed(h.Quiesced()) {
		require.NoError(t, region.Unregister(), "the region is free once the receive quiesced")
	}
}

// Two processes: the peer's registered pool is half backed by a userfaultfd nobody serves, so
// this side's process_vm_readv of that half blocks (no signal ends it). The receive fails
// within the read bound, its blocks poisoned rather than released (the call may still write
// them, L9), and the engine and its transport close though the call still runs; it returns
// once the peer is gone.
func TestL9_UCXCMABlockedReadPoisonsTheBlocks(t *testing.T) {
	const blocks = 16 // 32 MiB
	bin := peerproc.BuildEnginePeer(t)
	peer := peerproc.Start(t, bin, append(ucxPeerArgs("posix,cma,self", "", "engine-send", blocks, 86, 30*time.Second), "-caller", "-uffd-tail")...)
	cfg := ucxPeerTestConfig()
	cfg.TransferTimeout = 30 * time.Second // the read's bound, not the deadline, ends it
	local := newUCXEngine(t, "posix,cma,self", "", cfg, func(c *ucx.Config) { c.CMAReadTimeout = 300 * time.Millisecond })
	peer.Connect(t, string(local.tr.Self()))
	goPool, plan := ucxEnginePool(t, blocks, 5, false)
	region, err := local.tr.RegisterHost(mmapPool(t, len(goPool), "anon"))
	require.NoError(t, err)
	h, err := local.e.Receive(bg, Spec{ID: 86, Peer: Peer(peer.Addr), Plan: plan, Pool: region.Pool(), Timeout: 30 * time.Second})
	require.NoError(t, err)
	waitClosed(t, h.Done(), "receiver done")
	require.Equal(t, PathRMA, h.Path())
	require.Eventually(t, func() bool { return h.Status().BlocksPoisoned }, cfg.Tuning.QuarantineTimeout+20*time.Second, time.Millisecond,
		"the blocked call may still write them: %+v", h.Status())
	st := h.Status()
	t.Logf("%v: %v", st.State, st.Err)
	require.Error(t, st.Err)
	require.False(t, isClosed(h.Quiesced()), "poisoned blocks never quiesce")
	require.NotZero(t, ucxOf(local.tr).CMAStats().Blocked)
	closed := make(chan error, 1)
	go func() { closed <- local.e.Close() }()
	select {
	case <-closed:
	case <-time.After(60 * time.Second):
		require.FailNow(t, "the engine's Close waits for a blocked read")
	}
	peer.Signal(t, syscall.SIGKILL)
	require.Eventually(t, func() bool { return ucxhooks.Hooks.CMAReadsStuck(local.tr) == 0 }, 20*time.Second, time.Millisecond,
		"the blocked call returns once the peer is gone")
}
