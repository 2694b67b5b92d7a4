// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// A lost peer leaves nothing behind in the transport: the remote keys unpacked from it are
// released when the transport reports it lost (its endpoints may still look alive: the loss
// was seen on a lane's endpoint, or proven by a failed read), not when the transport closes,
// and what UCX said about its failed endpoint's lanes (getLanes) is forgotten with it.
func TestUCXPeerLost_ReleasesWhatThePeerHeld(t *testing.T) {
	const n = 64 << 10
	for _, c := range []struct {
		desc, tls, dev string
		dies           bool // a peer closed in this process fails its endpoint (shared memory's keepalive watches the process, which lives)
	}{
		{"shm", "posix,cma,self", "", false},
		{"tcp", "tcp,self", "lo", true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			srcMem, dstMem := mmapRegion(t, n), mmapRegion(t, n)
			a, b, _, rb := newUCXPair(t, c.tls, c.dev)
			pool := registered(t, a, srcMem)
			dst := registered(t, b, dstMem)
			peer := a.Self()
			keysOf := func() int {
				b.mu.Lock()
				defer b.mu.Unlock()
				k := 0
				for id := range b.rma.keys {
					if id.peer == peer {
						k++
					}
				}
				return k
			}
			lanesOf := func() bool {
				b.mu.Lock()
				defer b.mu.Unlock()
				_, ok := b.rma.getLanes[peer]
				return ok
			}
			heardLost := func() int {
				rb.mu.Lock()
				defer rb.mu.Unlock()
				return len(slices.DeleteFunc(slices.Clone(rb.lost), func(p transport.Peer) bool { return p != peer }))
			}
			cs := awaitCMAFinal(t, rb, cmaGet(t, a, b, rb, pool, 0, dst))
			require.NoError(t, cs[0].Err)
			b.GetsEmulated(peer)
			require.Positive(t, keysOf(), "the peer's key unpacked")
			require.True(t, lanesOf(), "UCX asked about the endpoint's lanes")

			// The transport reports the peer lost while its endpoint still looks alive.
			b.push(ucxReport{lost: peer, err: fmt.Errorf("%w: test: a lane's endpoint failed", transport.ErrPeerLost)})
			require.Eventually(t, func() bool { return heardLost() == 1 }, 10*time.Second, time.Millisecond, "the loss delivered")
			require.Zero(t, keysOf(), "the lost peer's keys outlived its loss")

			if !c.dies {
				return
			}
			// The peer dies: its failed endpoint leaves getLanes.
			b.mu.Lock()
			ep := b.eps[peer]
			b.mu.Unlock()
			require.NotNil(t, ep)
			require.NoError(t, a.Close(true))
			select {
			case <-ep.Failed():
			case <-time.After(20 * time.Second):
				require.FailNow(t, "the dead peer's endpoint never failed")
			}
			require.Eventually(t, func() bool { return heardLost() == 2 }, 10*time.Second, time.Millisecond, "the failure reported")
			require.False(t, lanesOf(), "getLanes kept the dead endpoint")
		})
	}
}
