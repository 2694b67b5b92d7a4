// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestL10_ForgedClaimLeavesTheSendToTheRealReceiver: a Send that carries a per-request secret
// (with cluster keys, or Config.RequireClaimProof) takes a request only with a valid claim
// proof. A Receive with the wrong secret or none is refused: it fails with ErrUnauthenticated
// and the refusal is counted (what "claim"), while the Send keeps waiting, frees and poisons
// nothing, and completes with the real receiver, every byte. Without a secret on the Send, or
// without keys and RequireClaimProof, no proof is asked for.
func TestL10_ForgedClaimLeavesTheSendToTheRealReceiver(t *testing.T) {
	secret := bytes.Repeat([]byte{0x5c}, ClaimSecretBytes)
	wrong := bytes.Repeat([]byte{0x3a}, ClaimSecretBytes)
	key := clusterKey(4)
	for _, c := range []struct {
		desc       string
		keys       [][]byte
		require    bool
		first      []byte // the first Receive's secret
		refused    string // its refusal's reason; "" when it is not refused
		sendSecret bool
	}{
		{"cluster keys: the right secret", [][]byte{key}, false, secret, "", true},
		{"cluster keys: a wrong secret", [][]byte{key}, false, wrong, "bad-mac", true},
		{"cluster keys: no proof", [][]byte{key}, false, nil, "unsealed", true},
		{"RequireClaimProof: a wrong secret", nil, true, wrong, "bad-mac", true},
		{"RequireClaimProof: no proof", nil, true, nil, "unsealed", true},
		{"no keys, not required: no proof asked", nil, false, nil, "", true},
		{"a Send without a secret: no proof asked", [][]byte{key}, true, nil, "", false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			n := mem.NewNetwork()
			src, dst := patientConfig(), patientConfig()
			src.ClusterKeys, dst.ClusterKeys = c.keys, c.keys
			src.RequireClaimProof = c.require
			refusals := &refusalCounter{}
			src.Observer = refusals
			a, err := New(n.Transport("prefill"), src)
			require.NoError(t, err)
			b, err := New(n.Transport("decode"), dst)
			require.NoError(t, err)
			t.Cleanup(func() {
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
			})
			sp, dp := pools(t, 3)
			send := Spec{ID: 1, Peer: "decode", Plan: sp.plan, Pool: sp.mem}
			if c.sendSecret {
				send.Secret = secret
			}
			hs, err := a.Send(bg, send)
			require.NoError(t, err)
			h1, err := b.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dp.plan, Pool: dp.mem, Secret: c.first})
			require.NoError(t, err)
			waitClosed(t, h1.Quiesced(), "the first receiver quiesced")
			if c.refused == "" {
				requireState(t, h1, Completed)
				waitClosed(t, hs.Quiesced(), "sender quiesced")
				requireState(t, hs, Completed)
				require.Equal(t, sp.stream(t), dp.stream(t), "every byte")
				require.Zero(t, refusals.auth())
				return
			}
			requireState(t, h1, Failed, ErrUnauthenticated)
			eventually(t, func() bool { return refusals.auth("claim", c.refused) == 1 }, "the claim refused and counted")
			select {
			case <-hs.Done():
				t.Fatalf("a refused claim ended the Send: %+v", hs.Status())
			default:
			}
			require.NoError(t, h1.Release()) // its id is free for the real receiver
			// The real receiver, with the blob's secret, still gets every byte.
			h2, err := b.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dp.plan, Pool: dp.mem, Secret: secret})
			require.NoError(t, err)
			waitClosed(t, h2.Quiesced(), "the real receiver quiesced")
			requireState(t, h2, Completed)
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hs, Completed)
			require.Equal(t, sp.stream(t), dp.stream(t), "every byte")
			require.Equal(t, 1, refusals.auth(), "one refusal")
		})
	}
}
