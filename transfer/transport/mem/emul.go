// SPDX-License-Identifier: Apache-2.0

package mem

import "github.com/kvxfer/kvxfer/transfer/transport"

var (
	_ transport.RMAEmulation = (*Transport)(nil)
	_ transport.RMALanes     = (*Transport)(nil)
)

// SetGetLanes makes GetLanes report n, as a transport striping gets over n lanes would: the
// in-memory network copies each get the same way, and the engine's cut of the gets is what a
// test of it watches.
func (t *Transport) SetGetLanes(n int) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	t.getLanes = n
}

// GetLanes implements transport.RMALanes: what SetGetLanes said, 1 by default.
func (t *Transport) GetLanes() int {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	return max(1, t.getLanes)
}

// EmulateGets makes GetsEmulated report on for gets from peer, as UCX over TCP would: the
// in-memory network copies the same way either way, and the engine's choice of path is what
// a test of it watches.
func (t *Transport) EmulateGets(peer transport.Peer, on bool) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if t.emulated == nil {
		t.emulated = map[transport.Peer]bool{}
	}
	t.emulated[peer] = on
}

// GetsEmulated implements transport.RMAEmulation: what EmulateGets said for peer, false by default.
func (t *Transport) GetsEmulated(peer transport.Peer) bool {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	return t.emulated[peer]
}
