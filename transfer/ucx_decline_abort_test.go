// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
)

// TestL3_AReceiverAbortedBeforeTheDeclineStrandsNoChunkOfTheSender over real UCX shared
// memory, the sender in another process, as the soak found it (docs/stress.md): the sender
// declines what the receiver asked (the pull wire, the RMA mode) and is stopped (SIGSTOP)
// before it reads the request; the receiver's caller cancels while it waits for the answer;
// on SIGCONT the sender declines, sends its first chunks as rendezvous messages, and reads
// the abort. UCX 1.13 cannot cancel a rendezvous send no receive matched, so the sender used
// to quarantine and then poison its slots (staging) or its caller's blocks for good (direct).
// The receiver's abort now posts and cancels the receives the decline would have made it
// post, and the transport's drains take those chunks: the sender quiesces, nothing poisoned.
// Shared memory only: over TCP the receiver asks neither (its gets are emulated).
func TestL3_UCXAReceiverAbortedBeforeTheDeclineStrandsNoChunkOfTheSender(t *testing.T) {
	const blocks = 4 // 8 MiB: 8 chunks of 1 MiB
	bin := peerproc.BuildEnginePeer(t)
	shm := ucxTransports[0]
	for _, c := range []struct {
		desc string
		args []string // the sending peer's: which answer it declines, and its pool
		want Path
	}{
		{"staging: the sender declines the pull wire", []string{"-disable-pull"}, PathStaging},
		{"direct: the sender declines the rma mode", []string{"-disable-rma", "-direct"}, PathDirect},
	} {
		t.Run(c.desc, func(t *testing.T) {
			const first = 31 // completes, so both sides know each other before the freeze
			args := append(ucxPeerArgs(shm.tls, shm.dev, "engine-send", blocks, first, 60*time.Second),
				"-repeat", "2", "-quarantine", "1s", "-quiesce-bound", "10s")
			peer := peerproc.Start(t, bin, append(args, c.args...)...)
			local := newUCXEngine(t, shm.tls, shm.dev, ucxPeerTestConfig())
			peer.Connect(t, string(local.tr.Self()))
			receive := func(id RequestID) *Handle {
				pool, plan := ucxEnginePool(t, blocks, 5, false)
				if c.want == PathDirect {
					mapped, err := local.tr.AllocatePool(int64(len(pool)))
					require.NoError(t, err)
					pool = mapped
				}
				h, err := local.e.Receive(bg, Spec{ID: id, Peer: Peer(peer.Addr), Plan: plan, Pool: pool, Timeout: 30 * time.Second})
				require.NoError(t, err)
				return h
			}
			h := receive(first)
			waitQuiesced(t, h, 30*time.Second)
			require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
			require.Equal(t, c.want, h.Path())
			require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", 30*time.Second))
			require.Equal(t, "true 0 false", peer.Expect(t, "QUIESCED ", 30*time.Second))

			peer.Signal(t, syscall.SIGSTOP)
			thawed := false
			defer func() {
				if !thawed {
					peer.Signal(t, syscall.SIGCONT)
				}
			}()
			h = receive(first + 1)
			require.Eventually(t, func() bool { return h.Status().State != Queued }, 10*time.Second, time.Millisecond,
				"the request sent to the stopped sender")
			require.Equal(t, CancelRequestedInFlight, local.e.Cancel(first+1))
			waitQuiesced(t, h, 10*time.Second)
			require.Equal(t, Cancelled, h.Status().State, "%v", h.Status().Err)
			peer.Signal(t, syscall.SIGCONT)
			thawed = true

			done := peer.Expect(t, "DONE ", 30*time.Second)
			t.Logf("the sender: %s", done)
			require.False(t, strings.HasPrefix(done, Completed.String()), "the receiver cancelled")
			require.Equal(t, "true 0 false", peer.Expect(t, "QUIESCED ", 30*time.Second),
				"the sender's handle quiesced (true), no slot poisoned (0), its blocks not poisoned (false)")
			require.False(t, h.Status().BlocksPoisoned)
			require.Zero(t, local.e.Health().Numbers.PoisonedSlots)
		})
	}
}
