// SPDX-License-Identifier: Apache-2.0

package mem

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// nopInbound ignores control messages and peer failures.
type nopInbound struct{}

func (nopInbound) OnControl(transport.Peer, []byte) {}
func (nopInbound) OnPeerLost(transport.Peer, error) {}

// Transport.ForgetDirect undoes AllowDirect for that very slice: Direct says no, and a get
// with a key made before names nothing and is refused; another slice of the same memory is
// not that pool.
func TestMemTransportForgetDirect(t *testing.T) {
	n := NewNetwork()
	a, b := n.Transport("a"), n.Transport("b")
	for _, tr := range []*Transport{a, b} {
		require.NoError(t, tr.Bind(nopInbound{}))
		t.Cleanup(func() { require.NoError(t, tr.Close(true)) })
	}
	pool, dst := make([]byte, 4096), make([]byte, 64)
	a.AllowDirect(pool)
	b.AllowDirect(dst)
	addr, key, err := a.RMAKey(pool)
	require.NoError(t, err)
	require.True(t, a.Direct(pool[100:200]))

	require.False(t, a.ForgetDirect(pool[:100]), "a part of the pool is not the pool")
	require.True(t, a.ForgetDirect(pool))
	require.False(t, a.ForgetDirect(pool), "forgotten already")
	require.False(t, a.Direct(pool))
	_, _, err = a.RMAKey(pool)
	require.ErrorIs(t, err, transport.ErrInvalidSpec)
	_, err = b.PostGet("a", transport.Tag{Request: 1}, key, addr, dst, func(transport.Completion) {})
	require.ErrorIs(t, err, transport.ErrInvalidSpec, "a key of a forgotten pool names nothing")

	a.AllowDirect(pool)
	addr2, key2, err := a.RMAKey(pool)
	require.NoError(t, err)
	require.Equal(t, addr, addr2)
	require.NotEqual(t, key, key2, "a pool allowed again has a new key")
}
