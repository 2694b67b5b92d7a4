// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, ClusterKeyBytes) }

// A sealed hello, challenge or proof decodes to its message with the seal, and opens under a
// ring that holds its key (the first or any later one: a fleet rotating keys); one changed
// anywhere, sealed with a key the ring lacks, or not sealed does not open, with the reason.
func TestSealOpensOnlyWhatAKeyOfTheRingMade(t *testing.T) {
	old, cur, other := testKey(1), testKey(2), testKey(3)
	signer, err := NewKeyring([][]byte{cur, old})
	require.NoError(t, err)
	rotating, err := NewKeyring([][]byte{old, cur}) // holds cur second: it still opens
	require.NoError(t, err)
	stranger, err := NewKeyring([][]byte{other})
	require.NoError(t, err)
	for _, m := range []Message{&Hello{Min: MinVersion, Max: Version, Reply: true, Features: KnownFeatures},
		&HelloChallenge{Challenge: [ChallengeBytes]byte{4, 5}}, goodProof()} {
		b := signer.SealMessage(m)
		sealOf := func(b []byte) Seal {
			got, err := Decode(b)
			require.NoError(t, err)
			switch g := got.(type) {
			case *Hello:
				return g.Seal
			case *HelloChallenge:
				return g.Seal
			}
			return got.(*HelloProof).Seal
		}
		got, err := Decode(b)
		require.NoError(t, err)
		seal := sealOf(b)
		require.True(t, seal.Sealed)
		require.NoError(t, signer.Open(b, seal))
		require.NoError(t, rotating.Open(b, seal))
		require.ErrorIs(t, stranger.Open(b, seal), ErrUnknownKey)
		re, err := got.AppendBinary(nil)
		require.NoError(t, err)
		require.Equal(t, b, re, "one message, one encoding")
		for _, c := range []struct {
			at   int
			want error
		}{{len(b) - SealBytes - 1, ErrBadMAC}, {len(b) - 1, ErrBadMAC}, {len(b) - SealBytes, ErrUnknownKey}} {
			changed := append([]byte(nil), b...)
			changed[c.at] ^= 1
			require.ErrorIs(t, signer.Open(changed, sealOf(changed)), c.want, "byte %d changed", c.at)
		}
		require.ErrorIs(t, signer.Open(Encode(m), Seal{}), ErrUnsealed)
		_, err = Decode(b[:len(b)-1])
		require.ErrorIs(t, err, ErrMalformed, "a cut seal")
	}
	for _, keys := range [][][]byte{{testKey(1)[:31]}, {old, old}} {
		_, err := NewKeyring(keys)
		require.Error(t, err)
	}
}

// A ContextParams seal is made under its own derived key (label "kvxfer params v3"): the same
// bytes sealed as params do not open as a hello's seal, nor a sealed hello as params, so a
// seal of one kind can never be replayed as the other.
func TestParamsSealIsNotAHelloSeal(t *testing.T) {
	ring, err := NewKeyring([][]byte{testKey(1)})
	require.NoError(t, err)
	hello := ring.SealMessage(&Hello{Min: MinVersion, Max: Version, Features: KnownFeatures})
	require.ErrorIs(t, ring.OpenParams(hello), ErrBadMAC, "a hello's seal is no params seal")

	params := append(bytes.Repeat([]byte{7}, 64), make([]byte, SealBytes)...)
	ring.SealParams(params)
	require.NoError(t, ring.OpenParams(params))
	seal := Seal{Sealed: true}
	copy(seal.KeyID[:], params[len(params)-SealBytes:])
	copy(seal.MAC[:], params[len(params)-MACBytes:])
	require.ErrorIs(t, ring.Open(params, seal), ErrBadMAC, "a params seal is no hello's seal")
	require.ErrorIs(t, ring.OpenParams(params[:SealBytes-1]), ErrUnsealed)
}
