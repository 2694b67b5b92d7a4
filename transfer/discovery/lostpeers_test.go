// SPDX-License-Identifier: Apache-2.0

package discovery_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

var _ discovery.LostPeers = (*transfer.Engine)(nil)

// CheckParams consults the engine's lost peers: params of a sender whose transport address
// the engine's transport reported lost fail at once with an error matching ErrPeerLost that
// names the worker, though the registry still lists it (its entry lives until its TTL).
// Params of a live sender pass, and without LostPeers only the registry is asked.
func TestCheckParams_RefusesASenderTheTransportLost(t *testing.T) {
	mux, h := http.NewServeMux(), discovery.Handler()
	mux.Handle(discovery.WorkersPath, h)
	mux.Handle(discovery.WorkersPath+"/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx := t.Context()
	reg, err := discovery.Open(srv.URL, discovery.Config{TTL: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	addr := []byte("prefill-0 worker address")
	_, err = reg.Publish(ctx, discovery.Worker{Name: "prefill-0", Role: "prefill", Incarnation: 7, Address: addr})
	require.NoError(t, err)
	cp := &ucx.ContextParams{Incarnation: 7, WorkerAddress: addr}

	// The decode engine, whose transport knows the prefill by the peer its address names.
	n := mem.NewNetwork()
	prefill := ucx.PeerFromAddress(addr)
	_ = n.Transport(prefill)
	decode, err := transfer.New(n.Transport("decode-0"), transfer.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = decode.Close() })

	cases := []struct {
		desc    string
		lost    discovery.LostPeers
		dies    bool // the prefill's process is gone before the check
		wantErr error
	}{
		{"a live sender passes", decode, false, nil},
		{"without LostPeers only the registry is asked", nil, true, nil},
		{"a sender the transport lost is refused at once", decode, true, transfer.ErrPeerLost},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			if c.dies {
				n.LosePeer(prefill)
				require.Eventually(t, func() bool { return decode.PeerLost(prefill) != nil }, 10*time.Second, time.Millisecond)
			}
			err := discovery.CheckParams(ctx, reg, "prefill-0", cp, c.lost)
			if c.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, c.wantErr)
			var pl *transfer.PeerLostError
			require.True(t, errors.As(err, &pl), "%v", err)
			require.Contains(t, err.Error(), "prefill-0")
		})
	}
}
