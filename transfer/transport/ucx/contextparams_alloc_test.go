// SPDX-License-Identifier: Apache-2.0

package ucx

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
)

// oneHopParams is what a prefill engine hands over for each 32-token one-hop request: two
// blocks, a secret, an Exposure section, anonymous, sealed.
func oneHopParams(t testing.TB) *ContextParams {
	c := withExposure(llamaParams())
	c.Blocks = []int32{3, 4}
	c.anonymous = true
	require.NoError(t, c.Sign([][]byte{bytes.Repeat([]byte{0x11}, wire.ClusterKeyBytes)}))
	return c
}

// TestContextParams_CodecAllocations: encoding and decoding a one-hop request's params costs a
// bounded number of heap allocations. Both run once per request (the prefill encodes, the
// decode decodes), so each allocation is paid at the request rate by both processes.
func TestContextParams_CodecAllocations(t *testing.T) {
	c := oneHopParams(t)
	blob, err := c.MarshalBinary()
	require.NoError(t, err)
	for _, tc := range []struct {
		desc string
		max  float64
		run  func()
	}{
		// The blob itself and Validate's plan (layout.NewPlan: the plan and its block list).
		// binary.Write's reflection made it 40.
		{"MarshalBinary", 3, func() { _, _ = c.MarshalBinary() }},
		// The params, their blocks, one buffer for the address, secret and the exposure's two
		// keys, the exposure and its regions, the seal, and Validate's plan. A copy of the blob
		// for its checksum and a buffer per byte field made it 12.
		{"UnmarshalContextParams", 8, func() { _, _ = UnmarshalContextParams(blob) }},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got := testing.AllocsPerRun(100, tc.run)
			t.Logf("%.0f allocations per call (at most %.0f)", got, tc.max)
			require.LessOrEqual(t, got, tc.max, "heap allocations per call")
		})
	}
}

// encodeReference is the Context Params encoding written field by field with binary.Write, as
// docs/protocol.md lays it out; the encoder must write the same bytes.
func encodeReference(c *ContextParams) []byte {
	var b bytes.Buffer
	le := binary.LittleEndian
	put := func(v any) { _ = binary.Write(&b, le, v) }
	var flags uint16
	if c.Secret != nil {
		flags |= contextParamsFlagSecret
	}
	if c.exposure != nil {
		flags |= contextParamsFlagExposure
	}
	if c.anonymous {
		flags |= contextParamsFlagAnonymous
	}
	if c.seal != nil {
		flags |= contextParamsFlagMAC
	}
	version := uint16(contextParamsVersion)
	if flags == 0 {
		version = contextParamsMinVersion
	}
	b.WriteString(cpMagic)
	put(version)
	put(flags)
	put(uint32(0))
	put(uint32(0))
	put(uint64(c.RequestID))
	put(c.Incarnation)
	l, s := c.Layout, c.Selection
	put([]int64{l.NumLayers, l.KVFactor, l.NumHeads, l.HeadDim, l.ElemSize, l.TokensPerBlock,
		l.NumBlocks, l.StrideBlock, l.StrideLayer, l.StrideKV, l.StrideHead, l.StrideToken})
	put([]int64{s.LayerBegin, s.LayerEnd, s.HeadBegin, s.HeadEnd})
	put(uint32(len(c.Blocks)))
	put(c.Blocks)
	put(uint32(len(c.WorkerAddress)))
	b.Write(c.WorkerAddress)
	b.Write(c.Secret)
	if x := c.exposure; x != nil {
		put([]uint64{x.Addr, x.GenAddr, x.Generation})
		put([]uint16{uint16(len(x.Key)), uint16(len(x.GenKey)), uint16(len(x.Regions)), 0})
		put(x.Regions)
		b.Write(x.Key)
		b.Write(x.GenKey)
	}
	if c.seal != nil {
		b.Write(c.seal.KeyID[:])
		b.Write(c.seal.MAC[:])
	}
	out := b.Bytes()
	le.PutUint32(out[8:], uint32(len(out)))
	return out
}

// TestContextParams_EncodingIsTheReference: every section combination encodes to the
// reference's bytes (the checksum left zero), sealed or not.
func TestContextParams_EncodingIsTheReference(t *testing.T) {
	small := llamaParams()
	small.Blocks = []int32{7}
	anon := withSecret(llamaParams())
	anon.anonymous = true
	for _, tc := range []struct {
		desc string
		in   *ContextParams
	}{
		{"no sections (version 2)", llamaParams()},
		{"one block", small},
		{"secret", withSecret(llamaParams())},
		{"secret, anonymous", anon},
		{"exposure", withExposure(llamaParams())},
		{"one-hop, sealed", oneHopParams(t)},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := tc.in.encode(tc.in.seal)
			require.NoError(t, err)
			require.Equal(t, encodeReference(tc.in), got)
		})
	}
}

// TestContextParams_DecodedFieldsDoNotOverlap: the decoded byte fields share one buffer, so an
// append to one of them must not write into the next (the address into the secret, the key into
// the generation key) nor the caller's blob be kept.
func TestContextParams_DecodedFieldsDoNotOverlap(t *testing.T) {
	blob, err := oneHopParams(t).MarshalBinary()
	require.NoError(t, err)
	keep := bytes.Clone(blob)
	out, err := UnmarshalContextParams(blob)
	require.NoError(t, err)
	clear(blob) // the caller may reuse its buffer
	want, err := UnmarshalContextParams(keep)
	require.NoError(t, err)
	require.Equal(t, want, out, "decoded params do not read the caller's blob")
	for _, f := range []*[]byte{&out.WorkerAddress, &out.Secret, &out.exposure.Key, &out.exposure.GenKey} {
		_ = append(*f, 0xee, 0xee, 0xee, 0xee)
	}
	require.Equal(t, want, out, "an append to a field leaves the others as they were")
	again, err := out.MarshalBinary()
	require.NoError(t, err)
	require.Equal(t, keep, again)
}
