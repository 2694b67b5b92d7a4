// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"context"

	"github.com/kvxfer/kvxfer/native"
)

var _ RMAEmulation = (*UCXTransport)(nil)

// ucxGetLanes is what UCX reported about the lanes of the endpoint to a peer.
type ucxGetLanes struct {
	ep     *native.Endpoint
	native bool
}

// GetsEmulated implements RMAEmulation by what UCX says about the endpoint to peer
// (native.Endpoint.Lanes): gets are native where a lane serves them (shared memory, cma,
// RDMA), emulated with active messages where none does (TCP in UCX 1.13). The answer is kept
// per endpoint; a replaced endpoint is asked again. When UCX cannot be asked it answers false,
// and the receiver keeps the RMA mode, which works on every transport.
func (t *UCXTransport) GetsEmulated(peer Peer) bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	ep, err := t.endpointLocked(peer)
	if err != nil {
		t.mu.Unlock()
		return false
	}
	if l, ok := t.rma.lanes[peer]; ok && l.ep == ep {
		t.mu.Unlock()
		return !l.native
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	defer cancel()
	lanes, err := ep.Lanes(ctx) // a worker round trip: not under mu
	if err != nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rma.lanes == nil {
		t.rma.lanes = map[Peer]ucxGetLanes{}
	}
	t.rma.lanes[peer] = ucxGetLanes{ep: ep, native: lanes.NativeGet}
	return !lanes.NativeGet
}
