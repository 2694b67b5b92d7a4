// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

var _ transport.RMAMapper = (*ucxTransport)(nil)

// MapRemote implements transport.RMAMapper: where the peer's key is mapped here (memory UCX
// allocated for the peer, seen over shared memory: native.RemoteKey.View), the view is that
// mapping. The key, unpacked on the transport's own endpoint to from, counts the view as a
// get in flight until release, so neither the peer's loss nor a replaced endpoint destroys it
// (and unmaps the segment) while the caller reads. A key UCX could not safely unpack
// (native.ErrBadRemoteKey), and a range outside the segment the key names
// (native.ErrOutOfBounds), are refused as transport.ErrProtocol: the peer named memory it
// does not have (docs/security.md).
func (t *ucxTransport) MapRemote(from transport.Peer, key []byte, addr uint64, n int) ([]byte, func(), error) {
	if err := t.ensureEndpoint(from); err != nil {
		return nil, nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, nil, transport.ErrClosed
	}
	ep, err := t.laneEndpointLocked(0, from)
	if err != nil {
		return nil, nil, err
	}
	rk, err := t.remoteKeyLocked(from, 0, ep, key)
	if err != nil {
		return nil, nil, err
	}
	view, err := rk.rk.View(addr, n)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %.16s: mapping its memory: %w", transport.ErrProtocol, from, err)
	}
	if view == nil {
		return nil, nil, nil
	}
	rk.inflight++
	var once sync.Once
	return view, func() { once.Do(func() { t.keyUnused(rk) }) }, nil
}
