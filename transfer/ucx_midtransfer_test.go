// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
)

// midTransfer is one request between this side's engine and an enginepeer process, caught
// while its bytes move on a path: what the tests that then kill or stop the peer
// (TestL9_UCXPeerKilledMidTransferOnEveryPath, TestL9_UCXPeerFrozenPastItsDeadlineOnEveryPath)
// work on.
type midTransfer struct {
	local      *ucxEngine
	peer       *peerproc.Proc
	k          *ucxKV // this side's pool
	h          *Handle
	localSends bool
}

// startMidTransfer starts this side's engine with cfg on pc's path, in 4 MiB chunks, and an
// enginepeer (bin) on the same path, over tls and dev; this side sends want (enginepeer's pool
// for its -seed, ucxPeerArgs) when localSends, and receives it otherwise, as request id with
// timeout for its Spec.Timeout (0: cfg's). peerFlags go to the peer after the path's. It
// returns once the request's bytes move: a receiving peer stops itself at its first bytes
// (-freeze) and says so, and this side, receiving, has seen some. A request that ended before
// leaves nothing to check: the test is skipped. The peer is killed at the test's end (peerproc).
func startMidTransfer(t *testing.T, bin, tls, dev string, pc ucxPathCase, cfg Config, localSends bool, id RequestID,
	want []byte, timeout time.Duration, peerFlags ...string) *midTransfer {
	t.Helper()
	blocks := int64(len(want) / engineBlockBytes)
	cfg.Tuning.DirectChunkBytes = 4 << 20
	pc.cfg(&cfg)
	m := &midTransfer{local: newUCXEngine(t, tls, dev, cfg), localSends: localSends}
	mode := "engine-send"
	if localSends {
		mode = "engine-recv"
	}
	args := append(ucxPeerArgs(tls, dev, mode, blocks, id, 120*time.Second), "-direct-chunk", strconv.Itoa(4<<20))
	args = append(args, pc.peer...)
	if localSends {
		args = append(args, "-freeze") // it stops itself at its first bytes
	}
	m.peer = peerproc.Start(t, bin, append(args, peerFlags...)...)
	m.peer.Connect(t, string(m.local.tr.Self()))
	m.k = pc.kv(t, m.local, engineDims(blocks), seqBlocks(0, int32(blocks)), 0)
	spec := Spec{ID: id, Peer: Peer(m.peer.Addr), Plan: m.k.plan, Pool: m.k.mem, Timeout: timeout}
	var err error
	if localSends {
		copy(m.k.mem, want) // the bytes the peer checks
		m.h, err = m.local.e.Send(bg, spec)
		require.NoError(t, err)
		if m.peer.Expect(t, "FREEZE ", 60*time.Second) == "missed" {
			waitQuiesced(t, m.h, 30*time.Second)
			t.Skip("the request ended before the peer's first bytes were seen: nothing to check")
		}
	} else {
		m.h, err = m.local.e.Receive(bg, spec)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return m.h.Status().Bytes > 0 || isClosed(m.h.Done()) }, 60*time.Second, 20*time.Microsecond,
			"bytes moving (the peer fills its pool first: slow on a loaded box)")
		if isClosed(m.h.Done()) {
			t.Skip("the request ended before any byte was seen here: nothing to check")
		}
	}
	require.Equal(t, pc.want, m.h.Path())
	return m
}
