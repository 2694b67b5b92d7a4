// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// A peer killed with SIGKILL, over real UCX with the default keepalive (1s): the transport
// reports it lost within the bound docs/ucx.md gives ("A killed peer"), whether this side's
// endpoint to it existed before the kill (keepalive, or the broken socket over TCP) or is made
// after it (a Receive for a prefill that already died: the hello's new endpoint to an address
// nobody answers). The Receive fails with ErrPeerLost, and the next one at once, naming the
// peer (TestL11_ARequestToALostPeerFailsAtOnce has the engine's side on mem).
func TestL11_UCXKilledPeerIsLostWithinTheBound(t *testing.T) {
	const bound = 10 * time.Second // docs/ucx.md, "A killed peer"
	bin := peerproc.BuildEnginePeer(t)
	for _, tr := range ucxTransports {
		for _, when := range []string{"endpoint before the kill", "endpoint after the kill"} {
			t.Run(tr.name+"/"+when, func(t *testing.T) {
				cfg := ucxPeerTestConfig()
				cfg.QueueTimeout = 60 * time.Second // far past the bound: the loss must end it
				local := newUCXEngine(t, tr.tls, tr.dev, cfg, func(c *ucx.Config) { c.KeepaliveInterval = 0 })
				peer := peerproc.Start(t, bin, ucxPeerArgs(tr.tls, tr.dev, "engine-recv", 1, 31, 60*time.Second)...)
				pool, plan := ucxEnginePool(t, 1, 5, true)
				p := Peer(peer.Addr)
				if when == "endpoint before the kill" {
					peer.Connect(t, string(local.tr.Self())) // the peer greets us; we answer on our endpoint
					require.Eventually(t, func() bool {      // its hello came: both endpoints exist
						local.e.mu.Lock()
						defer local.e.mu.Unlock()
						ph, ok := local.e.peers[p]
						return ok && chanClosed(ph.met)
					}, 30*time.Second, time.Millisecond)
				}
				peer.Signal(t, syscall.SIGKILL)
				killed := time.Now()
				var h *Handle
				if when == "endpoint after the kill" {
					var err error
					h, err = local.e.Receive(bg, Spec{ID: 31, Peer: p, Plan: plan, Pool: pool})
					require.NoError(t, err)
				}
				for local.e.PeerLost(p) == nil && time.Since(killed) < bound+5*time.Second {
					time.Sleep(5 * time.Millisecond)
				}
				took := time.Since(killed)
				t.Logf("%s: peer reported lost %v after SIGKILL", when, took.Round(time.Millisecond))
				require.Error(t, local.e.PeerLost(p), "not lost %v after SIGKILL", took)
				require.Less(t, took, bound)
				if h != nil {
					waitQuiesced(t, h, 5*time.Second)
					require.Equal(t, Failed, h.Status().State)
					require.ErrorIs(t, h.Status().Err, ErrPeerLost)
				}
				start := time.Now()
				h2, err := local.e.Receive(bg, Spec{ID: 32, Peer: p, Plan: plan, Pool: pool})
				require.NoError(t, err)
				waitQuiesced(t, h2, time.Second)
				t.Logf("the next Receive failed %v after it was made", time.Since(start))
				var pl *PeerLostError
				require.True(t, errors.As(h2.Status().Err, &pl), "%v", h2.Status().Err)
				require.Equal(t, p, pl.Peer)
			})
		}
	}
}
