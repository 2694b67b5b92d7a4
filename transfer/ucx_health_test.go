// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
)

// L12 on the RMA mode over real UCX, shared memory and TCP: the receiver, in another process,
// is frozen (SIGSTOP) while the sender's pool is offered to it. The sender moves nothing
// itself; no Done comes, and its engine must turn unhealthy within the progress deadline
// (it used to count as awaiting its peer and stayed healthy until its deadline). After SIGCONT
// the receiver reads every byte, and the sender's engine is healthy again.
func TestL12_UCXFrozenRMAReceiverTurnsTheSenderUnhealthy(t *testing.T) {
	const blocks = 256 // 512 MiB: reads of it outlast the signal
	bin := peerproc.BuildEnginePeer(t)
	for _, tr := range ucxTransports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ucxPeerTestConfig()
			local := newUCXEngine(t, tr.tls, tr.dev, cfg)
			peer := peerproc.Start(t, bin, append(ucxPeerArgs(tr.tls, tr.dev, "engine-recv", blocks, 81, 120*time.Second), "-direct", "-rma-where-emulated")...)
			defer func() { _ = peer.Cmd.Process.Signal(syscall.SIGCONT) }()
			peer.Connect(t, string(local.tr.Self()))
			goPool, plan := ucxEnginePool(t, blocks, 5, true)
			pool, err := local.tr.AllocatePool(int64(len(goPool)))
			require.NoError(t, err)
			copy(pool, goPool)
			h, err := local.e.Send(bg, Spec{ID: 81, Peer: Peer(peer.Addr), Plan: plan, Pool: pool, Timeout: 60 * time.Second})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return h.Path() == PathRMA || isClosed(h.Done()) }, 60*time.Second, 20*time.Microsecond,
				"the peer maps and fills 512 MiB first: slow on a loaded host")
			peer.Signal(t, syscall.SIGSTOP)
			froze := time.Now()
			require.False(t, isClosed(h.Done()), "done before the receiver froze: %+v", h.Status())
			for local.e.Health().Healthy && time.Since(froze) < cfg.ProgressDeadline+2*time.Second {
				time.Sleep(time.Millisecond)
			}
			hl := local.e.Health()
			t.Logf("health %v after the freeze: healthy %v; handle %v, %d bytes", time.Since(froze).Round(time.Millisecond), hl.Healthy, h.Status().State, h.Status().Bytes)
			require.False(t, isClosed(h.Done()), "the sender ended while its receiver was frozen: %+v", h.Status())
			require.False(t, hl.Healthy, "healthy %v after its receiver froze: %+v", time.Since(froze), hl)
			require.Contains(t, hl.Reason, "no transfer progressed")

			peer.Signal(t, syscall.SIGCONT)
			waitQuiesced(t, h, 60*time.Second)
			require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
			require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", 30*time.Second))
			require.True(t, local.e.Health().Healthy, local.e.Health().Reason)
		})
	}
}
