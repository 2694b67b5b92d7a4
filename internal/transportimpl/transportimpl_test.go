// SPDX-License-Identifier: Apache-2.0

package transportimpl_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// handle is a public transport handle over an implementation, as ucx.Transport is.
type handle struct {
	transport.Transport // what the handle delegates to; the test only resolves it
	impl                transport.Transport
}

// A registered resolver finds the implementation behind its handles; every other transport,
// and nil, resolves to itself.
func TestOf(t *testing.T) {
	n := mem.NewNetwork()
	impl, other := n.Transport("a"), n.Transport("b")
	transportimpl.Register(func(tr transport.Transport) (transport.Transport, bool) {
		if h, ok := tr.(*handle); ok {
			return h.impl, true
		}
		return nil, false
	})
	cases := []struct {
		desc string
		in   transport.Transport
		want transport.Transport
	}{
		{"a handle: its implementation", &handle{Transport: impl, impl: impl}, impl},
		{"a transport no resolver knows: itself", other, other},
		{"nil: nil", nil, nil},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			require.Equal(t, c.want, transportimpl.Of(c.in))
		})
	}
}
