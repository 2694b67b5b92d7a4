// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TagSendIOVEager sends a message of up to EagerIOVBytes eagerly on UCX 1.13, where this
// package leaves UCX_RNDV_THRESH to UCX: its data reaches a receiver that has posted no receive
// yet (held whole, charged its length), and the send completes without one. A larger message,
// a TagSendIOV, or any send on UCX 1.22 (where this package sets UCX_RNDV_THRESH) is a
// rendezvous: the receiver holds only its request (charged 16 KiB), and the data stays with
// the sender until the receive is posted. Either way the message is then received intact.
func TestUCX_EagerIOVSendsOnlyWhatItMay(t *testing.T) {
	cases := []struct {
		desc  string
		eager bool
		size  int64
		// wantEager: the receiver holds the data before any receive
		wantEager bool
	}{
		{"eager, at the limit", true, EagerIOVBytes, !protocolsV2()},
		{"eager asked, above the limit", true, EagerIOVBytes + 64<<10, false},
		{"a plain IOV send", false, EagerIOVBytes, false},
	}
	for _, tr := range transports {
		for _, tc := range cases {
			t.Run(tr.name+"/"+tc.desc, func(t *testing.T) {
				p := newPairWith(t, ContextConfig{TLS: tr.tls}, ContextConfig{TLS: tr.tls}, WorkerConfig{})
				src := alloc(t, p.ctxA, tc.size)
				dst := alloc(t, p.ctxB, tc.size)
				require.NoError(t, src.FillPattern(0, tc.size, 0, 5))
				clear(dst.Bytes())
				waitAll(t, 30*time.Second, p.ab.TagSendBytes([]byte("x"), 1), p.b.TagRecvBytes(nil, 8, 1, ^uint64(0)))
				half := tc.size / 2
				segs := []Segment{{half, tc.size - half}, {0, half}} // two pieces, out of order
				var send *Request
				if tc.eager {
					send = p.ab.TagSendIOVEager(src, segs, 77)
				} else {
					send = p.ab.TagSendIOV(src, segs, 77)
				}
				// A marker behind it on the same endpoint: once received, the message before it
				// has reached the receiver (its data, or its rendezvous request).
				waitAll(t, 2*time.Minute, p.ab.TagSendBytes([]byte("m"), 2), p.b.TagRecvBytes(nil, 8, 2, ^uint64(0)))
				var st WorkerStats
				require.Eventually(t, func() bool { st = p.b.Stats(); return st.UnexpectedHeld == 1 },
					time.Minute, 10*time.Millisecond, "the message held: %+v", p.b.Stats())
				heldData := st.UnexpectedBytes >= uint64(tc.size)
				if heldData {
					waitAll(t, time.Minute, send) // no receive posted: only an eager send completes
				}
				recv := p.b.TagRecv(dst, 0, tc.size, 77, ^uint64(0))
				waitAll(t, time.Minute, recv, send) // before any check: a failed test closes no pending send
				if tc.wantEager {
					require.True(t, heldData, "eager: the data is with the receiver before its receive: %+v", st)
				} else {
					require.False(t, heldData, "rendezvous: only its request is with the receiver: %+v", st)
				}
				require.Equal(t, tc.size, recv.Length())
				// The sent order: [half, size) of src, then [0, half).
				bad, err := dst.CheckPattern(0, tc.size-half, uint64(half), 5)
				require.NoError(t, err)
				require.Equal(t, int64(-1), bad)
				bad, err = dst.CheckPattern(tc.size-half, half, 0, 5)
				require.NoError(t, err)
				require.Equal(t, int64(-1), bad)
			})
		}
	}
}
