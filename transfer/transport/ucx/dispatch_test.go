// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// lastControl keeps the sender and payload of the last control message.
type lastControl struct {
	from transport.Peer
	msg  []byte
	n    int
}

func (l *lastControl) OnControl(from transport.Peer, msg []byte) {
	l.from, l.msg, l.n = from, msg, l.n+1
}
func (*lastControl) OnPeerLost(transport.Peer, error) {}

// controlFrame is a control message as it arrives: the sender's address, then the payload.
func controlFrame(addr, payload []byte) []byte {
	b := binary.LittleEndian.AppendUint16(nil, uint16(len(addr)))
	return append(append(b, addr...), payload...)
}

// TestDeliverControl_NamesTheSender: every control message names the peer at its sender's
// address (PeerFromAddress) however many addresses came before it, the first ones again after
// more than peerNamesMax others; and a message from a known sender allocates nothing.
func TestDeliverControl_NamesTheSender(t *testing.T) {
	tr := &ucxTransport{}
	in := &lastControl{}
	addr := func(i int) []byte { return fmt.Appendf(nil, "worker-address-%04d-\x00\x01", i) }
	for _, round := range []struct {
		desc  string
		addrs int
	}{
		{"one sender", 1},
		{"a few senders", 8},
		{"more senders than are remembered", 3*peerNamesMax + 1},
		{"the first senders again", 4},
	} {
		t.Run(round.desc, func(t *testing.T) {
			for i := range round.addrs {
				payload := []byte{byte(i), 0x42}
				tr.deliverControl(in, controlFrame(addr(i), payload))
				require.Equal(t, PeerFromAddress(addr(i)), in.from, "sender %d", i)
				require.Equal(t, payload, in.msg)
				require.LessOrEqual(t, len(tr.peerNames), peerNamesMax)
			}
		})
	}
	frame := controlFrame(addr(1), []byte("msg"))
	tr.deliverControl(in, frame)
	require.Zero(t, testing.AllocsPerRun(100, func() { tr.deliverControl(in, frame) }), "heap allocations per message")
	n := in.n
	for _, bad := range [][]byte{nil, {1}, {0, 0, 'x'}, {5, 0, 'a', 'b'}} {
		tr.deliverControl(in, bad)
	}
	require.Equal(t, n, in.n, "a frame without a whole address is dropped")
}
