// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/paramhooks"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// paramsFor is a sender's ContextParams for a one-block request, with a per-request secret.
func paramsFor(t *testing.T) *ucx.ContextParams {
	l := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 8, ElemSize: 2,
		TokensPerBlock: 4, NumBlocks: 8}, layout.LayerMajor)
	return &ucx.ContextParams{RequestID: 9, Incarnation: 3, WorkerAddress: []byte("prefill-worker"),
		Layout: l, Selection: l.All(), Blocks: []int32{5}, Secret: make([]byte, wire.ParamsSecretBytes)}
}

// TestClusterKeysAuthenticateContextParams: an engine with cluster keys signs the params it
// hands out (SignParams) and a receiving engine of the same fleet verifies them
// (VerifyParams); params unsigned, of another fleet, or changed after signing (a request id,
// a block, the secret, a seal copied from other params) are refused with an *AuthError that
// names "params" and the reason, and each refusal is counted once (kvxfer_auth_refused_total
// {what="params"}). An engine without keys signs nothing and refuses nothing.
func TestClusterKeysAuthenticateContextParams(t *testing.T) {
	cur, old, other := clusterKey(1), clusterKey(2), clusterKey(3)
	for _, c := range []struct {
		desc                     string
		senderKeys, receiverKeys [][]byte
		edit                     func(p *ucx.ContextParams)
		refused                  string // "" verifies
	}{
		{"one key on both", [][]byte{cur}, [][]byte{cur}, nil, ""},
		{"a rotation", [][]byte{old, cur}, [][]byte{cur, old}, nil, ""},
		{"no keys anywhere", nil, nil, nil, ""},
		{"a sender without keys", nil, [][]byte{cur}, nil, "unsealed"},
		{"another fleet's key", [][]byte{other}, [][]byte{cur}, nil, "unknown-key"},
		{"request id changed", [][]byte{cur}, [][]byte{cur}, func(p *ucx.ContextParams) { p.RequestID++ }, "bad-mac"},
		{"a block changed", [][]byte{cur}, [][]byte{cur}, func(p *ucx.ContextParams) { p.Blocks[0]++ }, "bad-mac"},
		{"secret changed", [][]byte{cur}, [][]byte{cur}, func(p *ucx.ContextParams) { p.Secret[0] ^= 1 }, "bad-mac"},
		{"incarnation changed (a replay into another life)", [][]byte{cur}, [][]byte{cur}, func(p *ucx.ContextParams) { p.Incarnation++ }, "bad-mac"},
		{"another request's seal", [][]byte{cur}, [][]byte{cur}, func(p *ucx.ContextParams) {
			donor := paramsFor(t)
			donor.RequestID = 77
			require.NoError(t, donor.Sign([][]byte{cur}))
			paramhooks.Hooks.CopySeal(p, donor)
		}, "bad-mac"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			n := mem.NewNetwork()
			src, dst := patientConfig(), patientConfig()
			src.ClusterKeys, dst.ClusterKeys = c.senderKeys, c.receiverKeys
			refusals := &refusalCounter{}
			dst.Observer = refusals
			a, err := New(n.Transport("prefill"), src)
			require.NoError(t, err)
			b, err := New(n.Transport("decode"), dst)
			require.NoError(t, err)
			t.Cleanup(func() {
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
			})
			p := paramsFor(t)
			require.NoError(t, a.SignParams(p))
			require.Equal(t, len(c.senderKeys) > 0, paramhooks.Hooks.Sealed(p), "signed when the sender has keys")
			// Through the blob, as the serving stack carries it.
			blob, err := p.MarshalBinary()
			require.NoError(t, err)
			got, err := ucx.UnmarshalContextParams(blob)
			require.NoError(t, err)
			if c.edit != nil {
				c.edit(got)
			}
			err = b.VerifyParams(got)
			if c.refused == "" {
				require.NoError(t, err)
				require.Zero(t, refusals.auth())
				return
			}
			require.ErrorIs(t, err, ErrUnauthenticated)
			var ae *AuthError
			require.True(t, errors.As(err, &ae))
			require.Equal(t, "params", ae.What)
			require.Equal(t, c.refused, ae.Reason.String())
			eventually(t, func() bool { return refusals.auth("params", c.refused) == 1 }, "the refusal counted")
			require.Equal(t, 1, refusals.auth(), "once")
		})
	}
}
