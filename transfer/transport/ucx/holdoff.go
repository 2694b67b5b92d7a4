// SPDX-License-Identifier: Apache-2.0

package ucx

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// reconnectHoldoff is how long the transport refuses to make a new endpoint to a peer whose
// endpoint failed (or whose address refused a connection), failing the operation with
// transport.ErrPeerLost instead. UCX 1.13's TCP transport aborts the process when a new
// endpoint reaches a peer that just died while the worker still holds the dead peer's own
// connection to it: uct_tcp_ep_connect takes over that connection, the connection request
// it sends on it fails inside the call, which marks the endpoint failed and queues its
// destruction before the call gives it its send capability, and the queued destruction then
// asserts (tcp_ep.c, uct_tcp_ep_destroy_progress; docs/ucx.md, "A reconnect to a peer that just
// died"). The dead peer's connection goes on the worker's next progress after its hang-up,
// so a short hold-off, long beside a starved worker's progress, closes that window. A peer
// that restarts comes back at a new address, which is not held off.
const reconnectHoldoff = 500 * time.Millisecond

// holdoff remembers when each peer's endpoint last failed, for reconnectHoldoff. Its own
// lock: connect runs with and without the transport's mu.
type holdoff struct {
	mu   sync.Mutex
	lost map[transport.Peer]time.Time
	now  func() time.Time // time.Now; tests move it
}

// failed records that peer's endpoint failed (or its address refused a connection) now.
// Entries older than the hold-off go as new ones come, so the map holds only the peers lost
// in the last reconnectHoldoff.
func (h *holdoff) failed(peer transport.Peer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clock()
	if h.lost == nil {
		h.lost = make(map[transport.Peer]time.Time)
	}
	for p, at := range h.lost {
		if now.Sub(at) >= reconnectHoldoff {
			delete(h.lost, p)
		}
	}
	h.lost[peer] = now
}

// check returns transport.ErrPeerLost, saying when, while peer is held off; else nil.
func (h *holdoff) check(peer transport.Peer) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.lost[peer]
	if !ok {
		return nil
	}
	if ago := h.clock().Sub(at); ago < reconnectHoldoff {
		return fmt.Errorf("%w: its endpoint failed %v ago; no new endpoint to it for %v", transport.ErrPeerLost,
			ago.Round(time.Millisecond), reconnectHoldoff)
	}
	delete(h.lost, peer)
	return nil
}

func (h *holdoff) clock() time.Time {
	if h.now != nil {
		return h.now()
	}
	return time.Now()
}
