// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"testing"

	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/stretchr/testify/require"
)

// collidingTags finds two tags of different requests from peer whose UCX tag hashes are
// equal (28 bits: a birthday search needs some 20,000 draws).
func collidingTags(t *testing.T, peer transport.Peer) (transport.Tag, transport.Tag) {
	seen := map[uint64]transport.Tag{}
	for i := range 1 << 20 {
		tag := transport.Tag{Request: transport.RequestID(i), Nonce: uint64(i) * 0x9e3779b97f4a7c15}
		h := ucxTagHash(ucxDataTag(peer, tag))
		if other, ok := seen[h]; ok {
			return other, tag
		}
		seen[h] = tag
	}
	t.Fatal("no collision among 2^20 tags")
	return transport.Tag{}, transport.Tag{}
}

// TestUCXReserveTagsRefusesACollision: two transfers whose 28-bit tag hashes collide are never
// live at once: the second reservation fails with transport.ErrTagCollision until the first is given
// back, and a hash that drains of a cancelled transfer still watch is refused too.
func TestUCXReserveTagsRefusesACollision(t *testing.T) {
	tr, err := newTransport(Config{TLS: "posix,cma,self", StagingBytes: 1 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close(true)) }()
	require.NoError(t, tr.Bind(nopInbound{}))
	peer := tr.Self()
	a, b := collidingTags(t, peer)

	release, err := tr.ReserveTags(peer, a)
	require.NoError(t, err)
	again, err := tr.ReserveTags(peer, a) // the same transfer, reserved twice: no collision
	require.NoError(t, err)
	_, err = tr.ReserveTags(peer, b)
	require.ErrorIs(t, err, transport.ErrTagCollision)
	release()
	again()
	releaseB, err := tr.ReserveTags(peer, b)
	require.NoError(t, err)
	releaseB()

	tr.mu.Lock()
	tr.startDrainLocked(ucxDataTag(peer, a))
	tr.mu.Unlock()
	_, err = tr.ReserveTags(peer, b)
	require.ErrorIs(t, err, transport.ErrTagCollision, "a drained hash is not free")
}
