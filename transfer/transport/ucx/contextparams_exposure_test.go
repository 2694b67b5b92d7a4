// SPDX-License-Identifier: Apache-2.0

package ucx

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// poolAt is where the test's sender pool starts in the sender's address space.
const poolAt = 0x7f00_0000_0000

// withExposure gives c (which needs a secret) an Exposure section over its whole pool.
func withExposure(c *ContextParams) *ContextParams {
	withSecret(c)
	span := uint64(c.Layout.SpanBytes())
	c.exposure = &transport.Exposure{
		Addr:       poolAt,
		Key:        bytes.Repeat([]byte{0x6b}, 40),
		Regions:    [][2]uint64{{poolAt, span}},
		GenAddr:    0x5500_0000_1000,
		GenKey:     bytes.Repeat([]byte{0x67}, 24),
		Generation: 7,
	}
	return c
}

// exposureAt is the offset of the Exposure section in a blob of c's encoding.
func exposureAt(c *ContextParams) int {
	return cpHeaderSize + 16 + 16*8 + 4 + 4*len(c.Blocks) + 4 + len(c.WorkerAddress) + wire.ParamsSecretBytes
}

// TestContextParams_ExposureSection: the Exposure section (flag 2) round-trips alone, with a
// seal and anonymous, announced by its flag in a version-3 blob, between the secret and the
// seal, its size what docs/protocol.md says; one encoding per value.
func TestContextParams_ExposureSection(t *testing.T) {
	key := paramsKey(1)
	signed := func(c *ContextParams) *ContextParams {
		require.NoError(t, c.Sign([][]byte{key}))
		return c
	}
	twoRegions := withExposure(llamaParams())
	span := uint64(twoRegions.Layout.SpanBytes())
	twoRegions.exposure.Regions = [][2]uint64{{poolAt, 4096}, {poolAt + span/2, span / 2}}
	for _, tc := range []struct {
		desc  string
		in    *ContextParams
		flags uint16
	}{
		{"an exposure", withExposure(llamaParams()), contextParamsFlagSecret | contextParamsFlagExposure},
		{"two regions", twoRegions, contextParamsFlagSecret | contextParamsFlagExposure},
		{"sealed", signed(withExposure(llamaParams())), contextParamsFlagSecret | contextParamsFlagExposure | contextParamsFlagMAC},
		{"anonymous and sealed", signed(anonymous(withExposure(llamaParams()))),
			contextParamsFlagSecret | contextParamsFlagExposure | contextParamsFlagAnonymous | contextParamsFlagMAC},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			blob, err := tc.in.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, uint16(3), binary.LittleEndian.Uint16(blob[4:]))
			require.Equal(t, tc.flags, binary.LittleEndian.Uint16(blob[6:]))
			bare := *tc.in
			bare.exposure, bare.seal = nil, nil
			plain, err := bare.MarshalBinary()
			require.NoError(t, err)
			x := tc.in.exposure
			size := contextParamsExposureFixed + 16*len(x.Regions) + len(x.Key) + len(x.GenKey)
			require.LessOrEqual(t, size, contextParamsMaxExposure)
			sealBytes := 0
			if tc.in.seal != nil {
				sealBytes = contextParamsSealBytes
			}
			require.Equal(t, len(plain)+size+sealBytes, len(blob), "the section its size")
			require.Equal(t, x.Addr, binary.LittleEndian.Uint64(blob[exposureAt(tc.in):]), "after the secret")
			out, err := UnmarshalContextParams(blob)
			require.NoError(t, err)
			require.Equal(t, tc.in, out)
			again, err := out.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, blob, again, "one encoding per value")
		})
	}
}

// TestContextParams_ExposureBounds: an Exposure section that does not describe memory a
// receiver may read is neither encoded nor decoded: each field out of its bounds is refused
// with ErrBadMetadata naming the field, before anything uses it (the remote keys' sizes, the
// regions inside the layout's pool and sorted apart, no address that wraps, the generation
// word's key, and a secret to claim it with). Decoding a blob the encoder would refuse (the
// field written by hand, the blob resealed) is refused the same.
func TestContextParams_ExposureBounds(t *testing.T) {
	span := uint64(llamaParams().Layout.SpanBytes())
	for _, tc := range []struct {
		desc  string
		edit  func(*ContextParams)
		field string
	}{
		{"no secret", func(c *ContextParams) { c.Secret = nil }, "Exposure"},
		{"no key", func(c *ContextParams) { c.exposure.Key = nil }, "Exposure.Key"},
		{"a key over the bound", func(c *ContextParams) { c.exposure.Key = make([]byte, wire.MaxRMAKey+1) }, "Exposure.Key"},
		{"no generation key", func(c *ContextParams) { c.exposure.GenKey = nil }, "Exposure.GenKey"},
		{"a generation key over the bound", func(c *ContextParams) { c.exposure.GenKey = make([]byte, wire.MaxRMAKey+1) }, "Exposure.GenKey"},
		{"a generation word that wraps", func(c *ContextParams) { c.exposure.GenAddr = math.MaxUint64 - 4 }, "Exposure.GenAddr"},
		{"no region", func(c *ContextParams) { c.exposure.Regions = nil }, "Exposure.Regions"},
		{"too many regions", func(c *ContextParams) {
			c.exposure.Regions = nil
			for i := range contextParamsMaxRegions + 1 {
				c.exposure.Regions = append(c.exposure.Regions, [2]uint64{poolAt + uint64(i)*64, 64})
			}
		}, "Exposure.Regions"},
		{"an empty region", func(c *ContextParams) { c.exposure.Regions[0][1] = 0 }, "Exposure.Regions"},
		{"a region before the pool", func(c *ContextParams) { c.exposure.Regions[0][0] = poolAt - 1 }, "Exposure.Regions"},
		{"a region past the pool", func(c *ContextParams) { c.exposure.Regions[0][1] = span + 1 }, "Exposure.Regions"},
		{"a region that wraps", func(c *ContextParams) { c.exposure.Regions[0] = [2]uint64{poolAt + 64, math.MaxUint64 - 32} }, "Exposure.Regions"},
		{"a pool that wraps", func(c *ContextParams) {
			c.exposure.Addr = math.MaxUint64 - span/2
			c.exposure.Regions[0] = [2]uint64{c.exposure.Addr, 64}
		}, "Exposure.Addr"},
		{"regions that overlap", func(c *ContextParams) {
			c.exposure.Regions = [][2]uint64{{poolAt, 128}, {poolAt + 64, 128}}
		}, "Exposure.Regions"},
		{"regions out of order", func(c *ContextParams) {
			c.exposure.Regions = [][2]uint64{{poolAt + 256, 64}, {poolAt, 64}}
		}, "Exposure.Regions"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c := withExposure(llamaParams())
			tc.edit(c)
			_, err := c.MarshalBinary()
			require.ErrorIs(t, err, ErrBadMetadata)
			require.Contains(t, err.Error(), tc.field)

			// The same params written past the encoder's checks are refused by the decoder.
			blob, err := c.encodeUnchecked(nil)
			require.NoError(t, err)
			out, err := UnmarshalContextParams(reseal(blob))
			require.ErrorIs(t, err, ErrBadMetadata)
			require.Nil(t, out, "nothing decoded in part")
		})
	}
	t.Run("hostile lengths are refused before they allocate", func(t *testing.T) {
		c := withExposure(llamaParams())
		good, err := c.MarshalBinary()
		require.NoError(t, err)
		at := exposureAt(c)
		for _, tc := range []struct {
			desc string
			off  int
			v    uint16
		}{
			{"key length", 24, math.MaxUint16},
			{"generation key length", 26, math.MaxUint16},
			{"region count", 28, math.MaxUint16},
			{"reserved", 30, 1},
		} {
			b := append([]byte(nil), good...)
			binary.LittleEndian.PutUint16(b[at+tc.off:], tc.v)
			out, err := UnmarshalContextParams(reseal(b))
			require.ErrorIs(t, err, ErrBadMetadata, tc.desc)
			require.Nil(t, out)
		}
	})
	t.Run("every truncation of the section is refused", func(t *testing.T) {
		c := withExposure(llamaParams())
		good, err := c.MarshalBinary()
		require.NoError(t, err)
		for n := exposureAt(c); n < len(good); n++ {
			_, err := UnmarshalContextParams(reseal(append([]byte(nil), good[:n]...)))
			require.ErrorIs(t, err, ErrBadMetadata, "truncated to %d bytes", n)
		}
	})
	t.Run("version 2 with the flag", func(t *testing.T) {
		b, err := withExposure(llamaParams()).MarshalBinary()
		require.NoError(t, err)
		binary.LittleEndian.PutUint16(b[4:], 2)
		_, err = UnmarshalContextParams(reseal(b))
		require.ErrorIs(t, err, ErrBadMetadata, "version 2 has no flags")
	})
}

// TestContextParams_ExposureIsSealed: with a cluster key, every byte of the Exposure section
// is under the params' MAC: a remote key, region, generation word or value changed after
// signing, or the section stripped or added, is refused as bad-mac (a forger cannot point a
// receiver's gets elsewhere, nor change the generation it checks).
func TestContextParams_ExposureIsSealed(t *testing.T) {
	key := paramsKey(1)
	c := withExposure(llamaParams())
	require.NoError(t, c.Sign([][]byte{key}))
	for _, tc := range []struct {
		desc string
		edit func(*transport.Exposure)
	}{
		{"pool address", func(x *transport.Exposure) { x.Addr += 64; x.Regions[0][0] += 64; x.Regions[0][1] -= 64 }},
		{"remote key", func(x *transport.Exposure) { x.Key[3] ^= 1 }},
		{"region", func(x *transport.Exposure) { x.Regions[0][1] -= 64 }},
		{"generation address", func(x *transport.Exposure) { x.GenAddr += 8 }},
		{"generation key", func(x *transport.Exposure) { x.GenKey[0] ^= 1 }},
		{"generation", func(x *transport.Exposure) { x.Generation++ }},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			blob, err := c.MarshalBinary()
			require.NoError(t, err)
			out, err := UnmarshalContextParams(blob)
			require.NoError(t, err)
			require.NoError(t, out.Verify([][]byte{key}))
			tc.edit(out.exposure)
			forged, err := out.MarshalBinary()
			require.NoError(t, err, "a well-formed forgery")
			f, err := UnmarshalContextParams(forged)
			require.NoError(t, err)
			var ae *transport.AuthError
			require.ErrorAs(t, f.Verify([][]byte{key}), &ae)
			require.Equal(t, transport.AuthBadMAC, ae.Reason)
		})
	}
	t.Run("stripped", func(t *testing.T) {
		out := *c
		out.exposure = nil
		var ae *transport.AuthError
		require.ErrorAs(t, out.Verify([][]byte{key}), &ae)
		require.Equal(t, transport.AuthBadMAC, ae.Reason)
	})
	t.Run("added", func(t *testing.T) {
		plain := withSecret(llamaParams())
		require.NoError(t, plain.Sign([][]byte{key}))
		seal := plain.seal
		withExposure(plain)
		plain.seal = seal
		var ae *transport.AuthError
		require.ErrorAs(t, plain.Verify([][]byte{key}), &ae)
		require.Equal(t, transport.AuthBadMAC, ae.Reason)
	})
}
