// SPDX-License-Identifier: Apache-2.0

package ucx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

func paramsKey(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func anonymous(c *ContextParams) *ContextParams {
	c.anonymous = true
	return c
}

func withSecret(c *ContextParams) *ContextParams {
	c.Secret = bytes.Repeat([]byte{0xa5}, wire.ParamsSecretBytes)
	return c
}

// TestContextParams_V3Sections: the secret and the seal round-trip, alone and together, each
// announced by its flag in a version-3 blob; params without them are written as version 2
// (the oldest format that carries them, so a decoder of the previous release reads them), and
// a version-3 blob without sections is those bytes but for the version field and decodes to
// the same params.
func TestContextParams_V3Sections(t *testing.T) {
	key := paramsKey(1)
	signed := func(c *ContextParams) *ContextParams {
		require.NoError(t, c.Sign([][]byte{key}))
		return c
	}
	for _, tc := range []struct {
		desc    string
		in      *ContextParams
		version uint16
		flags   uint16
		extra   int
	}{
		{"no sections: version 2", llamaParams(), 2, 0, 0},
		{"a secret", withSecret(llamaParams()), 3, contextParamsFlagSecret, wire.ParamsSecretBytes},
		{"a seal", signed(llamaParams()), 3, contextParamsFlagMAC, contextParamsSealBytes},
		{"a secret and a seal", signed(withSecret(llamaParams())), 3, contextParamsFlagSecret | contextParamsFlagMAC, wire.ParamsSecretBytes + contextParamsSealBytes},
		{"anonymous: a flag, no section", anonymous(withSecret(llamaParams())), 3, contextParamsFlagSecret | contextParamsFlagAnonymous, wire.ParamsSecretBytes},
		{"anonymous and sealed", signed(anonymous(withSecret(llamaParams()))), 3,
			contextParamsFlagSecret | contextParamsFlagAnonymous | contextParamsFlagMAC, wire.ParamsSecretBytes + contextParamsSealBytes},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			blob, err := tc.in.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, tc.version, binary.LittleEndian.Uint16(blob[4:]))
			require.Equal(t, tc.flags, binary.LittleEndian.Uint16(blob[6:]))
			bare := *tc.in
			bare.Secret, bare.seal, bare.anonymous = nil, nil, false
			plain, err := bare.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, len(plain)+tc.extra, len(blob), "each section its size")
			out, err := UnmarshalContextParams(blob)
			require.NoError(t, err)
			require.Equal(t, tc.in, out)
			again, err := out.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, blob, again, "one encoding per value")
		})
	}
	t.Run("anonymous without a secret", func(t *testing.T) {
		_, err := anonymous(llamaParams()).MarshalBinary()
		require.ErrorIs(t, err, ErrBadMetadata, "params anyone could claim")
		blob, err := withSecret(llamaParams()).MarshalBinary()
		require.NoError(t, err)
		// The flag set on a blob without the secret's section: refused as the encoder refuses it.
		forged := append([]byte(nil), blob[:len(blob)-wire.ParamsSecretBytes]...)
		binary.LittleEndian.PutUint16(forged[6:], contextParamsFlagAnonymous)
		binary.LittleEndian.PutUint32(forged[8:], uint32(len(forged)))
		_, err = UnmarshalContextParams(reseal(forged))
		require.ErrorIs(t, err, ErrBadMetadata)
	})
	t.Run("the anonymous flag is sealed", func(t *testing.T) {
		c := signed(withSecret(llamaParams()))
		c.anonymous = true // claimed after signing: whoever proves the secret may pull it
		var ae *transport.AuthError
		require.ErrorAs(t, c.Verify([][]byte{key}), &ae)
		require.Equal(t, transport.AuthBadMAC, ae.Reason)
	})
	t.Run("version 3 without sections", func(t *testing.T) {
		v2, err := llamaParams().MarshalBinary()
		require.NoError(t, err)
		v3 := append([]byte(nil), v2...)
		binary.LittleEndian.PutUint16(v3[4:], 3)
		reseal(v3)
		require.Equal(t, v2[6:cpCRCOffset], v3[6:cpCRCOffset])
		require.Equal(t, v2[cpHeaderSize:], v3[cpHeaderSize:], "byte-identical but the version (and so the crc)")
		out, err := UnmarshalContextParams(v3)
		require.NoError(t, err)
		require.Equal(t, llamaParams(), out)
	})
	t.Run("version 2 with a section", func(t *testing.T) {
		v3, err := withSecret(llamaParams()).MarshalBinary()
		require.NoError(t, err)
		binary.LittleEndian.PutUint16(v3[4:], 2)
		_, err = UnmarshalContextParams(reseal(v3))
		require.ErrorIs(t, err, ErrBadMetadata, "version 2 has no flags")
	})
	t.Run("a secret of the wrong size is not encoded", func(t *testing.T) {
		c := llamaParams()
		c.Secret = []byte{1, 2, 3}
		_, err := c.MarshalBinary()
		require.ErrorIs(t, err, ErrBadMetadata)
		require.Contains(t, err.Error(), "Secret")
	})
	t.Run("flags without their sections, and unknown flags, are refused", func(t *testing.T) {
		for _, f := range []uint16{2, 4, 16, 0x8000} {
			b, err := llamaParams().MarshalBinary()
			require.NoError(t, err)
			binary.LittleEndian.PutUint16(b[6:], f)
			_, err = UnmarshalContextParams(reseal(b))
			require.ErrorIs(t, err, ErrBadMetadata, "flag %#x", f)
		}
	})
}

// TestContextParams_VerifyRefusesForgeries: with cluster keys, params their own key signed
// verify, under any key order (a rotation); unsigned, forged, changed, transplanted (a seal
// replayed onto another request's blob) and other-fleet params are refused with an *AuthError
// that names "params", the sender and the reason, and matches ErrUnauthenticated. Decoding
// needs no key: every one decodes.
func TestContextParams_VerifyRefusesForgeries(t *testing.T) {
	cur, old, other := paramsKey(1), paramsKey(2), paramsKey(3)
	sign := func(c *ContextParams, key []byte) []byte {
		require.NoError(t, c.Sign([][]byte{key}))
		b, err := c.MarshalBinary()
		require.NoError(t, err)
		return b
	}
	good := func() []byte { return sign(withSecret(llamaParams()), cur) }
	// flip changes a byte of a signed blob and fixes its crc, as a forger would.
	flip := func(at func(b []byte) int) []byte {
		b := good()
		b[at(b)] ^= 1
		return reseal(b)
	}
	for _, tc := range []struct {
		desc   string
		blob   []byte
		keys   [][]byte
		reason transport.AuthRefusal // -1: verifies
	}{
		{"signed by the key", good(), [][]byte{cur}, -1},
		{"signed by the old key in a rotation", sign(withSecret(llamaParams()), old), [][]byte{cur, old}, -1},
		{"no keys: nothing to check", func() []byte { b, _ := llamaParams().MarshalBinary(); return b }(), nil, -1},
		{"unsigned", func() []byte { b, _ := withSecret(llamaParams()).MarshalBinary(); return b }(), [][]byte{cur}, transport.AuthUnsealed},
		{"another fleet's key", sign(withSecret(llamaParams()), other), [][]byte{cur}, transport.AuthUnknownKey},
		{"request id changed", flip(func([]byte) int { return cpHeaderSize }), [][]byte{cur}, transport.AuthBadMAC},
		{"incarnation changed", flip(func([]byte) int { return cpHeaderSize + 8 }), [][]byte{cur}, transport.AuthBadMAC},
		{"a block changed", flip(func([]byte) int { return cpHeaderSize + 16 + 16*8 + 4 }), [][]byte{cur}, transport.AuthBadMAC},
		{"the secret changed", flip(func(b []byte) int { return len(b) - contextParamsSealBytes - 1 }), [][]byte{cur}, transport.AuthBadMAC},
		{"the mac changed", flip(func(b []byte) int { return len(b) - 1 }), [][]byte{cur}, transport.AuthBadMAC},
		{"a made-up mac under the key's id", func() []byte {
			b := good()
			clear(b[len(b)-32:])
			return reseal(b)
		}(), [][]byte{cur}, transport.AuthBadMAC},
		{"another request's seal replayed onto this blob", func() []byte {
			donor := withSecret(llamaParams())
			donor.RequestID++
			d := sign(donor, cur)
			b := good()
			copy(b[len(b)-contextParamsSealBytes:], d[len(d)-contextParamsSealBytes:])
			return reseal(b)
		}(), [][]byte{cur}, transport.AuthBadMAC},
		{"the secret stripped", func() []byte {
			c, err := UnmarshalContextParams(good())
			require.NoError(t, err)
			c.Secret = nil
			b, err := c.MarshalBinary()
			require.NoError(t, err)
			return b
		}(), [][]byte{cur}, transport.AuthBadMAC},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c, err := UnmarshalContextParams(tc.blob)
			require.NoError(t, err, "decoding needs no key")
			err = c.Verify(tc.keys)
			if tc.reason < 0 {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, transport.ErrUnauthenticated)
			var ae *transport.AuthError
			require.True(t, errors.As(err, &ae))
			require.Equal(t, "params", ae.What)
			require.Equal(t, tc.reason, ae.Reason)
			require.Equal(t, PeerFromAddress(c.WorkerAddress), ae.Peer)
		})
	}
	t.Run("keys that make no keyring", func(t *testing.T) {
		require.Error(t, llamaParams().Sign([][]byte{{1, 2}}))
		require.Error(t, llamaParams().Verify([][]byte{{1, 2}}))
		require.Error(t, llamaParams().Sign(nil), "signing needs a key")
	})
}

// BenchmarkContextParams_Seal4096Tokens is what a cluster key adds to the blob of one
// 4096-token request (256 blocks): "plain" encodes and decodes it, "sealed" also draws its
// secret, signs it on the sender and verifies it on the receiver (docs/security.md, "What a
// cluster key costs").
//
//	go test -run '^$' -bench ContextParams_Seal ./transfer/transport/ucx/
func BenchmarkContextParams_Seal4096Tokens(b *testing.B) {
	keys := [][]byte{paramsKey(7)}
	for _, sealed := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "sealed"}[sealed]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				p := llamaParams()
				if sealed {
					p.Secret = bytes.Repeat([]byte{0xa5}, wire.ParamsSecretBytes)
					if err := p.Sign(keys); err != nil {
						b.Fatal(err)
					}
				}
				blob, err := p.MarshalBinary()
				if err != nil {
					b.Fatal(err)
				}
				out, err := UnmarshalContextParams(blob)
				if err != nil {
					b.Fatal(err)
				}
				if sealed {
					if err := out.Verify(keys); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
