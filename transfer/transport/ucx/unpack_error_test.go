// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// TestUnpackError_ClosedEndpointIsThePeersLossNotARefusal: a key that cannot be unpacked
// because its endpoint failed or was closed meanwhile (the peer's goodbye closes it) is the
// peer's loss; only a key refused or failed by UCX is a protocol violation, which the engine
// counts as refused input. Rehearsal ci13 saw a departing peer's slot key reported as a
// protocol violation.
func TestUnpackError_ClosedEndpointIsThePeersLossNotARefusal(t *testing.T) {
	peer := transport.Peer("peer-address")
	for _, c := range []struct {
		desc     string
		err      error
		lost     bool
		protocol bool
	}{
		{"endpoint closed", fmt.Errorf("%w: unpack remote key: the endpoint failed or is closing", native.ErrClosed), true, false},
		{"peer unreachable", fmt.Errorf("%w: unpack remote key: the endpoint failed", native.ErrPeerUnreachable), true, false},
		{"a key refused by the check", &native.RemoteKeyError{Offset: 3, Reason: "bad"}, false, true},
		{"a key UCX failed", fmt.Errorf("unpack remote key: some UCX status"), false, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			err := unpackError(c.err, peer)
			require.Equal(t, c.lost, errors.Is(err, transport.ErrPeerLost), "%v", err)
			require.Equal(t, c.protocol, errors.Is(err, transport.ErrProtocol), "%v", err)
			require.ErrorIs(t, err, c.err, "the cause stays in the chain")
			require.Contains(t, err.Error(), "unpacking the peer's remote key")
		})
	}
}
