// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// A peer whose endpoint failed gets no new endpoint for reconnectHoldoff, whatever asks for
// one (UCX 1.13's TCP aborts the process when a new endpoint takes over a connection of a peer
// that just died: holdoff.go); after it, the transport connects again.
func TestUCX_NoNewEndpointToAPeerJustLost(t *testing.T) {
	a, b, _, rb := newUCXPair(t, "tcp,self", "lo")
	peer := a.Self()
	require.NoError(t, b.SendControl(peer, []byte("hello")))
	b.mu.Lock()
	ep := b.eps[peer]
	b.mu.Unlock()
	require.NotNil(t, ep)

	var connects atomic.Int32
	b.mu.Lock()
	b.beforeConnect = func() { connects.Add(1) }
	b.mu.Unlock()
	now := time.Now()
	b.held.mu.Lock()
	b.held.now = func() time.Time { return now }
	b.held.mu.Unlock()

	require.NoError(t, a.Close(true)) // the peer dies: its connection hangs up
	select {
	case <-ep.Failed():
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the dead peer's endpoint never failed")
	}
	require.Eventually(t, func() bool {
		rb.mu.Lock()
		defer rb.mu.Unlock()
		return len(rb.lost) > 0
	}, 10*time.Second, time.Millisecond, "the loss reported")

	for _, after := range []time.Duration{0, reconnectHoldoff / 2, reconnectHoldoff - time.Millisecond} {
		b.held.mu.Lock()
		b.held.now = func() time.Time { return now.Add(after) }
		b.held.mu.Unlock()
		err := b.SendControl(peer, []byte("again"))
		require.ErrorIs(t, err, transport.ErrPeerLost, "%v after the loss", after)
		require.Zero(t, connects.Load(), "a new endpoint was made %v after the peer's failed", after)
	}
	b.held.mu.Lock()
	b.held.now = func() time.Time { return now.Add(reconnectHoldoff) }
	b.held.mu.Unlock()
	_ = b.SendControl(peer, []byte("later")) // a dead address: refused, or failed later
	require.Equal(t, int32(1), connects.Load(), "no endpoint made after the hold-off")
}

// The hold-off's table forgets a peer once its hold-off has passed, and holds only the peers
// lost within it.
func TestHoldoffForgetsPeersPastIt(t *testing.T) {
	now := time.Unix(1000, 0)
	h := holdoff{now: func() time.Time { return now }}
	h.failed("p1")
	require.ErrorIs(t, h.check("p1"), transport.ErrPeerLost)
	require.NoError(t, h.check("p2"))
	now = now.Add(reconnectHoldoff - time.Nanosecond)
	require.ErrorIs(t, h.check("p1"), transport.ErrPeerLost)
	h.failed("p2")
	now = now.Add(time.Nanosecond)
	require.NoError(t, h.check("p1"), "held past its hold-off")
	require.ErrorIs(t, h.check("p2"), transport.ErrPeerLost)
	now = now.Add(reconnectHoldoff)
	h.failed("p3") // sweeps p2, lost a hold-off ago
	require.Len(t, h.lost, 1)
}
