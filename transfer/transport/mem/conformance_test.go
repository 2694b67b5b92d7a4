// SPDX-License-Identifier: Apache-2.0

package mem

import (
	"testing"

	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/transporttest"
)

// The in-memory transport keeps the Transport contract, with its direct path and RMA gets,
// its control messages bounded (as SetMaxControl makes them) or not.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		desc       string
		maxControl int
	}{
		{"control bounded to 4 KiB", 4096},
		{"control unbounded", 0},
	} {
		t.Run(c.desc, func(t *testing.T) {
			transporttest.Run(t, transporttest.Harness{Pair: func(transporttest.TB) (a, b transporttest.Endpoint) {
				n := NewNetwork()
				n.SetMaxControl(c.maxControl)
				ep := func(name transport.Peer) transporttest.Endpoint {
					tr := n.Transport(name)
					return transporttest.Endpoint{Transport: tr, Peer: name, Buffer: func(k int) []byte {
						b := make([]byte, k)
						tr.AllowDirect(b) // the direct path and RMA gets may use every buffer
						return b
					}}
				}
				return ep("a"), ep("b")
			}})
		})
	}
}
