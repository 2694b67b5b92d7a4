// SPDX-License-Identifier: Apache-2.0

package discovery

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/stretchr/testify/require"
)

// A peer this process found through the registry is named in logs by its discovery name and
// its short hash (Peer.Short), whichever way it was found: a lookup, a wait, a list. A peer
// never looked up keeps the bare hash, and a worker that restarted under the same name with
// another address is told apart by the hash.
func TestLookup_NamesThePeerInLogs(t *testing.T) {
	srv := serveRegistry(t)
	pub := openHTTP(t, srv.URL(), Config{})
	look := openHTTP(t, srv.URL(), Config{})
	ctx := t.Context()
	run := make([]byte, 8) // this run's addresses: the labels are the process's, across -count runs
	_, err := rand.Read(run)
	require.NoError(t, err)
	addr := func(b byte) []byte { return append(bytes.Repeat([]byte{b}, 192), run...) } // as long as a UCX worker address
	for _, c := range []struct {
		desc string
		name string
		addr []byte
		find func(name string) error
	}{
		{"lookup", "prefill-3", addr(1), func(name string) error { _, err := look.Lookup(ctx, name); return err }},
		{"wait", "prefill-4", addr(2), func(name string) error { _, err := WaitFor(ctx, look, name); return err }},
		{"list", "decode-9", addr(3), func(string) error { _, err := look.List(ctx, "decode"); return err }},
		{"restart under the same name", "prefill-3", addr(4), func(name string) error { _, err := look.Lookup(ctx, name); return err }},
	} {
		role := strings.SplitN(c.name, "-", 2)[0]
		peer := ucx.PeerFromAddress(c.addr)
		hash := peer.Short()
		require.True(t, strings.HasPrefix(hash, "peer-"), "%s: unnamed before: %s", c.desc, hash)
		_, err := pub.Publish(ctx, Worker{Name: c.name, Role: role, Incarnation: uint64(c.addr[0]), Address: c.addr})
		require.NoError(t, err, c.desc)
		require.NoError(t, c.find(c.name), c.desc)
		require.Equal(t, c.name+"/"+hash, peer.Short(), c.desc)
		require.LessOrEqual(t, len(peer.Short()), 64, c.desc)
	}
	require.True(t, strings.HasPrefix(ucx.PeerFromAddress(addr(1)).Short(), "prefill-3/peer-"), "the first life keeps its label")
	require.NotEqual(t, ucx.PeerFromAddress(addr(1)).Short(), ucx.PeerFromAddress(addr(4)).Short(), "two lives, two hashes")
	require.True(t, strings.HasPrefix(ucx.PeerFromAddress(addr(5)).Short(), "peer-"), "never looked up: the hash alone")
}
