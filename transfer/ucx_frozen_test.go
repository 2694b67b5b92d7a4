// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
)

// TestL12_UCXFrozenPeerTurnsTheOtherSideUnhealthyOnEveryPath is
// TestL12_FrozenPeerTurnsTheOtherSideUnhealthyOnEveryPath over real UCX, shared memory and TCP,
// with the peer in another process stopped by SIGSTOP while a request moves on the path
// (ucxCancelPaths: staging, pull, pull in place, direct, RMA, RMA in place, CMA), in both
// directions. The side still running must tell the truth within the progress deadline: it
// turns unhealthy ("no transfer progressed") while its request is not done, or, a receiver
// whose frozen sender's memory it reads without the sender's help (RMA and CMA over shared
// memory), its request completes with every byte. After SIGCONT the request completes on both
// sides, every byte checked, and health is back. One peer process per transport serves every
// case (enginepeer -serve); the receiver's freeze is the peer's own SIGSTOP at its first bytes
// (-freeze), since a sender on the RMA mode sees no byte until the end.
func TestL12_UCXFrozenPeerTurnsTheOtherSideUnhealthyOnEveryPath(t *testing.T) {
	const blocks = 32 // 64 MiB, in 4 MiB gets or messages: far more than moves before the freeze
	bin := peerproc.BuildEnginePeer(t)
	// Each transport has its own peer process, and its cases mostly wait: both at once.
	rows := newRowGroup(t, len(ucxLifecycleTransports))
	defer rows.wait()
	for _, tr := range ucxLifecycleTransports {
		rows.run(tr.name, func(t *testing.T) {
			peer := peerproc.StartServing(t, bin, ucxPeerArgs(tr.tls, tr.dev, "engine-recv", blocks, 0, 120*time.Second)...)
			want := newUCXKV(t, engineDims(blocks), layout.BlockMajor, seqBlocks(0, blocks), 5).mem // enginepeer's -seed (ucxPeerArgs)
			id := RequestID(600)
			for _, pc := range ucxCancelPaths {
				if pc.shmOnly && !ucxShm(tr.name) {
					continue
				}
				for _, frozen := range []string{"sender", "receiver"} {
					t.Run(pc.name+"/frozen "+frozen, func(t *testing.T) {
						const attempts = 5 // the receiver's freeze needs a moment with some bytes read and not all
						for a := 1; a <= attempts; a++ {
							id++
							if frozenPeerCase(t, peer, tr.tls, tr.dev, pc, frozen == "sender", want, id) {
								return
							}
						}
						t.Skipf("the request ended before its peer froze, %d times: nothing to check", attempts)
					})
				}
			}
		})
	}
}

// frozenPeerCase runs one request of TestL12_UCXFrozenPeerTurnsTheOtherSideUnhealthyOnEveryPath
// with a new engine here and one in the serving peer; want is the sender's pool, the bytes the
// receiver must end with. It reports false, with nothing checked, when the request ended
// before the freeze could hold it back.
func frozenPeerCase(t *testing.T, peer *peerproc.Proc, tls, dev string, pc ucxPathCase, senderFrozen bool, want []byte, id RequestID) bool {
	t.Helper()
	const slack = 5 * time.Second // a loaded 2-core box; the deadline itself is 200 ms
	cfg := ucxPeerTestConfig()
	cfg.TransferTimeout = 60 * time.Second // the freeze, not a deadline, is under test
	cfg.ProgressDeadline = 200 * time.Millisecond
	cfg.Tuning.DirectChunkBytes = 4 << 20 // the receiver sees its first bytes early
	pc.cfg(&cfg)
	local := newUCXEngine(t, tls, dev, cfg)
	mode := "engine-recv"
	if senderFrozen {
		mode = "engine-send"
	}
	args := append([]string{"-mode", mode, "-id", strconv.FormatUint(uint64(id), 10), "-direct-chunk", strconv.Itoa(4 << 20)}, pc.peer...)
	if !senderFrozen {
		args = append(args, "-freeze")
	}
	peer.Run(t, args...)
	defer func() { // the peer's engine closes before a next attempt runs, and before ours
		_ = peer.Cmd.Process.Signal(syscall.SIGCONT)
		peer.CloseRun(t, 150*time.Second)
	}()
	peer.Connect(t, string(local.tr.Self()))
	blocks := int32(len(want) / engineBlockBytes)
	k := pc.kv(t, local, engineDims(int64(blocks)), seqBlocks(0, blocks), 0)
	var h *Handle
	var err error
	spec := func(k *ucxKV) Spec {
		return Spec{ID: id, Peer: Peer(peer.Addr), Plan: k.plan, Pool: k.mem, Timeout: 60 * time.Second}
	}
	if senderFrozen {
		h, err = local.e.Receive(bg, spec(k))
	} else {
		copy(k.mem, want) // the bytes the peer checks
		h, err = local.e.Send(bg, spec(k))
	}
	require.NoError(t, err)
	ended := func() bool { // the request ended before the freeze: both sides finish, nothing to check
		waitQuiesced(t, h, 60*time.Second)
		require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
		require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", 60*time.Second))
		t.Logf("request %d ended before its peer froze", id)
		return false
	}

	if senderFrozen {
		require.Eventually(t, func() bool { return h.Status().Bytes > 0 || isClosed(h.Done()) }, 60*time.Second, 20*time.Microsecond,
			"bytes moving (the peer fills its pool first: slow on a loaded box)")
		if isClosed(h.Done()) {
			return ended()
		}
		peer.Signal(t, syscall.SIGSTOP)
	} else if peer.Expect(t, "FREEZE ", 60*time.Second) == "missed" {
		return ended()
	}
	froze := time.Now()
	for local.e.Health().Healthy && !isClosed(h.Done()) && time.Since(froze) < cfg.ProgressDeadline+slack {
		time.Sleep(time.Millisecond)
	}
	hl, st := local.e.Health(), h.Status()
	t.Logf("%v after the %s froze: healthy %v (%s); request %v, path %v, %d of %d bytes",
		time.Since(froze).Round(time.Millisecond), map[bool]string{true: "sender", false: "receiver"}[senderFrozen],
		hl.Healthy, hl.Reason, st.State, h.Path(), st.Bytes, st.Total)
	require.Equal(t, pc.want, h.Path())
	switch {
	case isClosed(h.Done()) && senderFrozen:
		// The receiver read what it needed without its sender (gets of a stopped process's
		// memory, or data the sender had posted before it stopped): true, if every byte is right.
		waitQuiesced(t, h, 30*time.Second)
		require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
	case isClosed(h.Done()):
		peer.Signal(t, syscall.SIGCONT)
		if peer.Expect(t, "THAW ", 30*time.Second) == "true" { // it may have ended in the instant before its stop
			return ended()
		}
		require.FailNow(t, "the sender ended while its receiver was frozen", "%+v", h.Status())
	default:
		require.False(t, hl.Healthy, "healthy %v after the peer froze with the request in flight: %+v", time.Since(froze), hl)
		require.Contains(t, hl.Reason, "no transfer progressed")
	}

	peer.Signal(t, syscall.SIGCONT)
	if !senderFrozen {
		peer.Expect(t, "THAW ", 30*time.Second)
	}
	waitQuiesced(t, h, 60*time.Second)
	require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
	require.False(t, h.Status().BlocksPoisoned)
	require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", 60*time.Second), "the peer's verdict")
	if senderFrozen {
		require.True(t, bytes.Equal(want, k.mem), "every byte")
	}
	eventually(t, func() bool { return local.e.Health().Healthy }, "healthy after the thaw")
	requireSlotsAccounted(t, local.e)
	require.Zero(t, local.e.pool.Stats().Poisoned)
	return true
}

// engineDims is enginepeer's model (EngineDims) with blocks blocks, block-major: a pool of it
// from newUCXKV holds the bytes enginepeer's EnginePool does for the same seed.
func engineDims(blocks int64) layout.Dims {
	return layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: blocks}
}

// engineBlockBytes is the bytes of one block of engineDims.
const engineBlockBytes = 32 * 2 * 8 * 128 * 2 * 16
