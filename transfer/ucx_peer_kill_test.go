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
)

// The receiving peer is killed (SIGKILL) while this engine sends to it, over shared memory
// and over TCP. Over TCP this is where UCX 1.13 completed a zero-copy send piece twice and
// aborted the survivor (docs/ucx.md, "TCP without zero-copy"): the process must live on. The
// send handle is done within its deadline and quiesced within the quarantine bound; every
// slot is free or poisoned, none leased (L5, L9); a new peer then receives every byte, or,
// over shared memory, the survivor reports the receive queue the kill wedged (servedOrWedged).
func TestUCXTransport_ReceiverKilledWhileWeSend(t *testing.T) {
	const blocks = 256 // 512 MiB: far more than moves before the kill
	bin := peerproc.BuildEnginePeer(t)
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ucxPeerTestConfig()
			local := newUCXEngine(t, tr.tls, tr.dev, cfg)
			peer := peerproc.Start(t, bin, ucxPeerArgs(tr.tls, tr.dev, "engine-recv", blocks, 31, 120*time.Second)...)
			peer.Connect(t, string(local.tr.Self()))
			pool, plan := ucxEnginePool(t, blocks, 5, true)
			h, err := local.e.Send(bg, Spec{ID: 31, Peer: Peer(peer.Addr), Plan: plan, Pool: pool})
			require.NoError(t, err)
			peer.WaitGot(t, 1, 60*time.Second) // bytes are landing in the peer: kill it mid-transfer
			peer.Signal(t, syscall.SIGKILL)
			waitQuiesced(t, h, cfg.TransferTimeout+cfg.Tuning.QuarantineTimeout+10*time.Second)
			st := h.Status()
			require.NotEqual(t, Completed, st.State, "512 MiB cannot have been received before the kill")
			require.Error(t, st.Err)
			ps := local.e.pool.Stats()
			require.Equal(t, ps.Total, ps.Free+ps.Leased+ps.Poisoned)
			require.Zero(t, ps.Leased)
			t.Logf("handle %v (%v); slots: %d free, %d poisoned of %d", st.State, st.Err, ps.Free, ps.Poisoned, ps.Total)

			// A new peer receives every byte of the next request from this survivor.
			peer2 := peerproc.Start(t, bin, ucxPeerArgs(tr.tls, tr.dev, "engine-recv", 16, 32, 30*time.Second)...)
			peer2.Connect(t, string(local.tr.Self()))
			pool2, plan2 := ucxEnginePool(t, 16, 5, true)
			want := bytes.Clone(pool2)
			h2, err := local.e.Send(bg, Spec{ID: 32, Peer: Peer(peer2.Addr), Plan: plan2, Pool: pool2, Timeout: 30 * time.Second})
			require.NoError(t, err)
			// The killed peer may have died mid-write into this worker's shared-memory receive
			// queue, which wedges it for good (a UCX limitation, docs/ucx.md): peer2's request
			// then never arrives, and the survivor must say so through Health (servedOrWedged).
			if !servedOrWedged(t, local, h2, 35*time.Second, tr.name == "shm") {
				return
			}
			require.Equal(t, Completed.String()+" OK", peer2.Expect(t, "DONE ", 30*time.Second), "the peer checks every byte")
			require.True(t, bytes.Equal(want, pool2), "a send leaves its pool as it was")
		})
	}
}
