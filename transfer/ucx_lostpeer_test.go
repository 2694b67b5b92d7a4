// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
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

// TestL11_UCXSendToAKilledPeerFailsAtOnceOnEveryPath: over real UCX, shared memory and TCP, with
// each sending path's configuration and pool (staging, the pull wire read with gets or in
// place, direct IOV messages, RMA gets, RMA read in place, CMA reads of a registered pool): a
// receiver process that greeted this engine is SIGKILLed. A Send already waiting for its
// request fails within a second of the transport reporting the loss, and a Send made after it
// fails at once with a *PeerLostError naming the peer, instead of waiting out QueueTimeout (60 s
// here). Nothing is poisoned or quarantined, and both handles quiesce.
// (TestL11_ASendToALostPeerFailsAtOnceOnEveryPath has the queued waits for admission and a
// slot, on mem.)
func TestL11_UCXSendToAKilledPeerFailsAtOnceOnEveryPath(t *testing.T) {
	const bound, lossBound = time.Second, 10 * time.Second // the promise; docs/ucx.md, "A killed peer"
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 16}
	paths := goodbyePaths // CMA and the pull wire read in place included
	bin := peerproc.BuildEnginePeer(t)
	for _, tr := range ucxTransports {
		for _, pc := range paths {
			if pc.shmOnly && tr.name != "shm" {
				continue
			}
			t.Run(tr.name+"/"+pc.name, func(t *testing.T) {
				cfg := ucxPeerTestConfig()
				cfg.QueueTimeout = 60 * time.Second
				pc.cfg(&cfg)
				q := &quarantineCounter{}
				cfg.Observer = q
				local := newUCXEngine(t, tr.tls, tr.dev, cfg)
				peer := peerproc.Start(t, bin, ucxPeerArgs(tr.tls, tr.dev, "engine-recv", 1, 31, 60*time.Second)...)
				p := Peer(peer.Addr)
				kv := func() *ucxKV {
					switch {
					case pc.path == PathStaging:
						return newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 16), 7)
					case strings.HasPrefix(pc.name, "CMA"):
						k, _ := callerKV(t, local, dims, layout.BlockMajor, seqBlocks(0, 16), 7, "anon")
						return k
					}
					return mappedKV(t, local, dims, layout.BlockMajor, seqBlocks(0, 16), 7)
				}
				send := func(id RequestID) *Handle {
					k := kv()
					h, err := local.e.Send(bg, Spec{ID: id, Peer: p, Plan: k.plan, Pool: k.mem})
					require.NoError(t, err)
					return h
				}
				peer.Connect(t, string(local.tr.Self()))
				require.Eventually(t, func() bool { // its hello came: both endpoints exist
					local.e.mu.Lock()
					defer local.e.mu.Unlock()
					ph, ok := local.e.peers[p]
					return ok && chanClosed(ph.met)
				}, 30*time.Second, time.Millisecond)
				queued := send(41) // the peer asks only for 31: this Send waits for its request
				peer.Signal(t, syscall.SIGKILL)
				killed := time.Now()
				for local.e.PeerLost(p) == nil && time.Since(killed) < lossBound {
					time.Sleep(time.Millisecond)
				}
				lost := time.Now()
				require.Error(t, local.e.PeerLost(p), "not lost %v after SIGKILL", lost.Sub(killed))
				t.Logf("peer reported lost %v after SIGKILL", lost.Sub(killed).Round(time.Millisecond))
				select {
				case <-queued.Done():
				case <-time.After(bound):
					t.Fatalf("the queued Send is not done %v after its peer was lost: %+v", time.Since(lost), queued.Status())
				}
				t.Logf("the queued Send failed %v after the loss was reported", time.Since(lost).Round(time.Millisecond))
				start := time.Now()
				next := send(42)
				select {
				case <-next.Done():
				case <-time.After(bound):
					t.Fatalf("a Send to a known lost peer is not done after %v: %+v", bound, next.Status())
				}
				t.Logf("the next Send failed %v after it was made", time.Since(start).Round(time.Millisecond))
				var pl *PeerLostError
				require.True(t, errors.As(next.Status().Err, &pl), "%v", next.Status().Err)
				require.Equal(t, p, pl.Peer)
				for _, h := range []*Handle{queued, next} {
					waitQuiesced(t, h, bound)
					st := h.Status()
					require.Equal(t, Failed, st.State, "%v", st.Err)
					require.ErrorIs(t, st.Err, ErrPeerLost)
					require.False(t, st.BlocksPoisoned)
				}
				require.Zero(t, q.n.Load(), "a quarantine")
				requireSlotsAccounted(t, local.e)
				require.Zero(t, local.e.pool.Stats().Poisoned)
			})
		}
	}
}
