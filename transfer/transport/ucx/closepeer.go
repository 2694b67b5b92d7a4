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
func (t *ucxTransport) ClosePeer(peer transport.Peer) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	var eps []*native.Endpoint
	if ep := t.eps[peer]; ep != nil {
		eps = append(eps, ep)
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
			_ = ep.ForceClose(ctx)
		}()
	}
}
