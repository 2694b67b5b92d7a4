// SPDX-License-Identifier: Apache-2.0

package transportimpl_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// handle is a public transport handle over an implementation, as ucx.Transport is: it keeps
// none of the contract itself.
type handle struct {
	impl transport.Transport
}

// A registered resolver finds the implementation behind its handles; every other transport,
// resolves to itself, and nil and a value that keeps no contract to nil.
func TestOf(t *testing.T) {
	n := mem.NewNetwork()
	impl, other := n.Transport("a"), n.Transport("b")
	transportimpl.Register(func(tr any) (transport.Transport, bool) {
		if h, ok := tr.(*handle); ok {
			return h.impl, true
		}
		return nil, false
	})
	cases := []struct {
		desc string
		in   any
		want transport.Transport
	}{
		{"a handle: its implementation", &handle{impl: impl}, impl},
		{"a transport no resolver knows: itself", other, other},
		{"nil: nil", nil, nil},
		{"neither a handle nor a transport: nil", struct{}{}, nil},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			require.Equal(t, c.want, transportimpl.Of(c.in))
		})
	}
}
