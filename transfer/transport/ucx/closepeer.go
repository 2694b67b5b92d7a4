// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"context"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

var _ transport.PeerCloser = (*ucxTransport)(nil)

// ClosePeer implements transport.PeerCloser: the endpoints to peer, the transport's own and its
// lanes', are force-closed in the background, and the next operation with peer connects anew.
// The engine calls it once a departing peer's goodbye ended every transfer it had with peer.
// Forced, because the peer is closing its worker: a flush would wait for answers that never
// come. UCX 1.13 keeps a send whose peer left without matching it (a rendezvous whose receive
// was cancelled) on the endpoint for as long as the endpoint lives; the close completes it with
// an error and, once UCX releases it, MemoryDone. One UCX still holds after the close is
// abandoned (native.Request.Abandoned) and stays busy until UCX lets go, as under Close. The
// endpoints' failure reports the peer lost, as any closed endpoint does.
func (t *ucxTransport) ClosePeer(peer transport.Peer) { t.closePeer(peer, false) }

// CloseDepartedPeer is ClosePeer after peer's goodbye, which said that its every operation with
// this process ended: it sends nothing more. Over an endpoint whose every lane is shared
// memory, the goodbye came through this worker's one receive FIFO behind every fragment the
// peer sent before it, so all of those have arrived: a receive UCX had matched when the
// peer's send stopped mid-message (its engine closed) fails with the close and releases its
// memory (native.Endpoint.ForceCloseDeparted), where ClosePeer keeps it busy until the worker
// closes and the engine poisons its slot. Over any other endpoint (TCP: the goodbye may come
// on another connection than a fragment still on its way) it is ClosePeer. The engine's
// goodbye handling asks for it (transfer's departedCloser).
func (t *ucxTransport) CloseDepartedPeer(peer transport.Peer) { t.closePeer(peer, true) }

func (t *ucxTransport) closePeer(peer transport.Peer, departed bool) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	var eps []*native.Endpoint
	own := t.eps[peer] // the one the goodbye came on: the lanes' carry gets, no receives
	if own != nil {
		eps = append(eps, own)
		delete(t.eps, peer)
	}
	for _, l := range t.rma.lanes.extra {
		if ep := l.eps[peer]; ep != nil {
			eps = append(eps, ep)
			delete(l.eps, peer)
		}
	}
	t.mu.Unlock()
	for _, ep := range eps {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
			defer cancel()
			if departed && ep == own {
				if lanes, err := ep.Lanes(ctx); err == nil && sharedMemoryOnly(lanes) {
					_ = ep.ForceCloseDeparted(ctx)
					return
				}
			}
			_ = ep.ForceClose(ctx)
		}()
	}
}
