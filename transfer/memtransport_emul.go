// SPDX-License-Identifier: Apache-2.0

package transfer

var _ RMAEmulation = (*MemTransport)(nil)

// EmulateGets makes GetsEmulated report on for gets from peer, as UCX over TCP would: the
// in-memory network copies the same way either way, and the engine's choice of path is what
// a test of it watches.
func (t *MemTransport) EmulateGets(peer Peer, on bool) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if t.emulated == nil {
		t.emulated = map[Peer]bool{}
	}
	t.emulated[peer] = on
}

// GetsEmulated implements RMAEmulation: what EmulateGets said for peer, false by default.
func (t *MemTransport) GetsEmulated(peer Peer) bool {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	return t.emulated[peer]
}
