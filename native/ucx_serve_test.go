// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// What UCX itself serves to a connected peer through its RMA emulation (docs/security.md,
// "What UCX itself serves to a connected peer"). A peer that runs its own code packs a remote
// key for its own memory and puts to, or gets from, an address of the victim that the victim
// never gave it a key for: over TCP no transport key bounds the access, and UCX turns the
// put and the get into active messages (ucp_put_handler, ucp_get_req_handler) that the
// victim's worker serves at whatever address they name. Those handlers exist only in a
// context opened with UCP_FEATURE_RMA: against one without (ContextConfig.NoRMA) the put
// changes no byte, the get is never answered (it ends only when the attacker force-closes its
// endpoint), and the victim goes on working.
//
// The syncs are messages, not time: a tagged message the attacker sends after its put, on the
// same endpoint and so on the same TCP connection, reaches the victim after the put's message
// (UCX serves them in order); a round trip after the get proves the victim has seen the get's
// request.
func TestUCX_RMAEmulationServesAPeerOnlyWithTheFeature(t *testing.T) {
	cases := []struct {
		desc   string
		noRMA  bool // the victim's context
		served bool // what must happen: the attacker's put lands and its get reads the secret
	}{
		{"victim with UCP_FEATURE_RMA: any address is written and read", false, true},
		{"victim without UCP_FEATURE_RMA (NoRMA): nothing served", true, false},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			const n = 4096
			victimCfg := ContextConfig{TLS: "tcp,self", NoRMA: tc.noRMA}
			attackerCfg := ContextConfig{TLS: "tcp,self"}
			p := newPairWith(t, attackerCfg, victimCfg, WorkerConfig{})

			// The victim's memory: registered (as a KV pool is), no key given to anyone.
			secret := alloc(t, p.ctxB, n)
			require.NoError(t, secret.FillPattern(0, n, 0, 7))
			// The attacker's own memory, its own key, unpacked on its endpoint to the victim.
			own := alloc(t, p.ctxA, n)
			require.NoError(t, own.FillPattern(0, n, 0, 9))
			ownKey, err := own.PackRemoteKey()
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rk, err := p.ab.UnpackRemoteKey(ctx, ownKey)
			require.NoError(t, err)
			defer rk.Close()

			// marker: a tagged message from attacker to victim after what was posted before it.
			marker := func(tag uint64) {
				t.Helper()
				recv := p.b.TagRecvBytes(nil, 8, tag, ^uint64(0))
				send := p.ab.TagSendBytes([]byte("marker!!"), tag)
				waitAll(t, 30*time.Second, send, recv)
			}

			put := p.ab.Put(own, 0, n, secret.Addr(), rk)
			marker(0x5e47e_0001)
			if tc.served {
				waitAll(t, 30*time.Second, put, p.ab.Flush())
				bad, _ := secret.CheckPattern(0, n, 0, 9)
				require.Equal(t, int64(-1), bad, "the attacker's bytes at the victim's address")
			} else {
				bad, _ := secret.CheckPattern(0, n, 0, 7)
				require.Equal(t, int64(-1), bad, "a victim without RMA changed at byte %d", bad)
			}

			clear(own.Bytes())
			get := p.ab.Get(own, 0, n, secret.Addr(), rk)
			if tc.served {
				waitAll(t, 30*time.Second, get)
				bad, _ := own.CheckPattern(0, n, 0, 9) // the put's bytes, now the victim's
				require.Equal(t, int64(-1), bad, "the victim's bytes read by the attacker")
				return
			}
			// A round trip: the victim has handled the get's request before it answers.
			marker(0x5e47e_0002)
			recv := p.a.TagRecvBytes(nil, 8, 0x5e47e_0003, ^uint64(0))
			waitAll(t, 30*time.Second, p.ba.TagSendBytes([]byte("answered"), 0x5e47e_0003), recv)
			require.False(t, get.Completed(), "a victim without RMA answered a get: %v", get.Err())
			// The victim still works, and the get ends only when the attacker gives up.
			marker(0x5e47e_0004)
			require.NoError(t, p.ab.ForceClose(ctx))
			require.Error(t, get.Wait(ctx), "the unanswered get ends with its endpoint")
			require.True(t, bytes.Equal(own.Bytes(), make([]byte, n)), "nothing of the victim was read")
			bad, _ := secret.CheckPattern(0, n, 0, 7)
			require.Equal(t, int64(-1), bad, "the victim's memory after the attack")
		})
	}
}

// A context without UCP_FEATURE_RMA posts no puts and no gets: each fails at once with
// ErrInvalidArgument. UCX 1.13 refuses them itself; UCX 1.22 as the libucx-cu12 wheel builds
// it checks no feature flags, sends the put's and the get's messages anyway, and the get,
// which a peer without RMA never answers, ends only with its endpoint (this test hung there
// before native refused them itself).
func TestUCX_NoRMAContextRefusesPutsAndGets(t *testing.T) {
	p := newPairConfig(t, ContextConfig{TLS: "tcp,self", NoRMA: true})
	const n = 4096
	local := alloc(t, p.ctxA, n)
	remote := alloc(t, p.ctxB, n)
	packed, err := remote.PackRemoteKey()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rk, err := p.ab.UnpackRemoteKey(ctx, packed)
	require.NoError(t, err)
	defer rk.Close()
	for _, op := range []struct {
		name string
		req  *Request
	}{
		{"put", p.ab.Put(local, 0, n, remote.Addr(), rk)},
		{"get", p.ab.Get(local, 0, n, remote.Addr(), rk)},
	} {
		err := op.req.Wait(ctx)
		require.ErrorIs(t, err, ErrInvalidArgument, op.name)
	}
}
