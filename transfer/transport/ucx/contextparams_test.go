// SPDX-License-Identifier: Apache-2.0

package ucx

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// llamaParams is a Llama-3-8B-shaped request: 32 layers, 8 KV heads of 128, BF16, 16-token
// blocks, 256 blocks (4096 tokens) out of a 1024-block pool.
func llamaParams() *ContextParams {
	l := layout.Packed(layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2,
		TokensPerBlock: 16, NumBlocks: 1024}, layout.LayerMajor)
	blocks := make([]int32, 256)
	for i := range blocks {
		blocks[i] = int32(1023 - 3*i)
	}
	return &ContextParams{
		RequestID: 0xfeedface, Incarnation: 42,
		WorkerAddress: []byte("worker-address-bytes\x00\x01\x02"),
		Layout:        l, Selection: l.All(), Blocks: blocks,
	}
}

// reseal fixes the length and checksum after a test edits a blob, so the edit reaches the
// body checks instead of stopping at the checksum.
func reseal(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[8:], uint32(len(b)))
	binary.LittleEndian.PutUint32(b[cpCRCOffset:], 0)
	binary.LittleEndian.PutUint32(b[cpCRCOffset:], crc32.Checksum(b, cpCRCTable))
	return b
}

func TestContextParams_RoundTrip(t *testing.T) {
	small := llamaParams()
	small.Blocks = []int32{7}
	tp := llamaParams()
	tp.Selection = layout.Selection{LayerBegin: 8, LayerEnd: 16, HeadBegin: 4, HeadEnd: 8}
	for _, tc := range []struct {
		desc string
		in   *ContextParams
	}{
		{"llama 4096 tokens with an RMA region", llamaParams()},
		{"one block, staging only", small},
		{"a PP and TP share of the pool", tp},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			blob, err := tc.in.MarshalBinary()
			require.NoError(t, err)
			out, err := UnmarshalContextParams(blob)
			require.NoError(t, err)
			require.Equal(t, tc.in, out)
			again, err := out.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, blob, again, "one encoding per value")
			p, err := out.Plan()
			require.NoError(t, err)
			require.Equal(t, tc.in.Blocks, p.Blocks())
		})
	}
}

func TestContextParams_InvalidParamsAreNotEncoded(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		edit  func(*ContextParams)
		field string
	}{
		{"no worker address", func(c *ContextParams) { c.WorkerAddress = nil }, "WorkerAddress"},
		{"no blocks", func(c *ContextParams) { c.Blocks = nil }, "plan"},
		{"duplicate block", func(c *ContextParams) { c.Blocks[1] = c.Blocks[0] }, "plan"},
		{"block outside the pool", func(c *ContextParams) { c.Blocks[0] = 5000 }, "plan"},
		{"bad selection", func(c *ContextParams) { c.Selection.HeadEnd = 9 }, "plan"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c := llamaParams()
			tc.edit(c)
			_, err := c.MarshalBinary()
			require.ErrorIs(t, err, ErrBadMetadata)
			require.Contains(t, err.Error(), tc.field)
		})
	}
}

func TestContextParams_GarbageIsBadMetadata(t *testing.T) {
	good, err := llamaParams().MarshalBinary()
	require.NoError(t, err)
	le := binary.LittleEndian
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tc := range []struct {
		desc string
		blob []byte
	}{
		{"empty", nil},
		{"short header", good[:10]},
		{"wrong magic", edit(func(b []byte) []byte { b[0] = 'X'; return reseal(b) })},
		{"next version", edit(func(b []byte) []byte { le.PutUint16(b[4:], contextParamsVersion+1); return reseal(b) })},
		{"old version", edit(func(b []byte) []byte { le.PutUint16(b[4:], 0); return reseal(b) })},
		{"unknown flags", edit(func(b []byte) []byte { le.PutUint16(b[6:], 0x10); return reseal(b) })},
		{"a secret announced, none there", edit(func(b []byte) []byte { le.PutUint16(b[6:], contextParamsFlagSecret); return reseal(b) })},
		{"a seal announced, none there", edit(func(b []byte) []byte { le.PutUint16(b[6:], contextParamsFlagMAC); return reseal(b) })},
		{"length disagrees", edit(func(b []byte) []byte { le.PutUint32(b[8:], uint32(len(b)+1)); return b })},
		{"one bit flipped in the body", edit(func(b []byte) []byte { b[40] ^= 1; return b })},
		{"truncated and resealed", edit(func(b []byte) []byte { return reseal(b[:len(b)-3]) })},
		{"trailing byte", edit(func(b []byte) []byte { return reseal(append(b, 0)) })},
		{"huge block count", edit(func(b []byte) []byte { le.PutUint32(b[cpHeaderSize+8+8+12*8+4*8:], 1<<30); return reseal(b) })},
		{"invalid layout", edit(func(b []byte) []byte { le.PutUint64(b[cpHeaderSize+16+4*8:], 3); return reseal(b) })}, // ElemSize 3
		{"random bytes", []byte("this is not a context params blob at all, just text")},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			before := append([]byte(nil), tc.blob...)
			out, err := UnmarshalContextParams(tc.blob)
			require.ErrorIs(t, err, ErrBadMetadata)
			require.Nil(t, out, "nothing decoded in part")
			require.Equal(t, before, tc.blob, "the input is not modified")
		})
	}
	// Every truncation and every single-byte corruption is refused.
	for n := 0; n < len(good); n++ {
		_, err := UnmarshalContextParams(good[:n])
		require.ErrorIs(t, err, ErrBadMetadata, "truncated to %d bytes", n)
	}
	for i := range good {
		b := append([]byte(nil), good...)
		b[i] ^= 0x5a
		_, err := UnmarshalContextParams(b)
		require.ErrorIs(t, err, ErrBadMetadata, "byte %d corrupted", i)
	}
}

// FuzzContextParams: any input either decodes to params that re-encode to the same bytes, or
// fails with ErrBadMetadata; it never panics or allocates without bound.
func FuzzContextParams(f *testing.F) {
	good, err := llamaParams().MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	small := llamaParams()
	small.Blocks = []int32{3, 1}
	blob, err := small.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(blob)
	withSecret(small)
	if err := small.Sign([][]byte{paramsKey(9)}); err != nil {
		f.Fatal(err)
	}
	if blob, err = small.MarshalBinary(); err != nil {
		f.Fatal(err)
	}
	f.Add(blob) // version 3, both sections
	exposed := withExposure(llamaParams())
	exposed.Blocks = []int32{5, 9}
	if blob, err = exposed.MarshalBinary(); err != nil {
		f.Fatal(err)
	}
	f.Add(blob) // version 3, a secret and an exposure
	exposed.exposure.Regions = [][2]uint64{{poolAt, 64}, {poolAt + 4096, 4096}}
	anonymous(exposed)
	if err := exposed.Sign([][]byte{paramsKey(9)}); err != nil {
		f.Fatal(err)
	}
	if blob, err = exposed.MarshalBinary(); err != nil {
		f.Fatal(err)
	}
	f.Add(blob) // version 3, every section
	v3 := append([]byte(nil), good...)
	binary.LittleEndian.PutUint16(v3[4:], 3)
	f.Add(reseal(v3)) // version 3 without sections
	f.Add([]byte("KVXP"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := UnmarshalContextParams(b)
		if err != nil {
			require.ErrorIs(t, err, ErrBadMetadata)
			require.Nil(t, c)
			return
		}
		again, err := c.MarshalBinary()
		require.NoError(t, err)
		if binary.LittleEndian.Uint16(b[4:]) == 3 && c.Secret == nil && c.seal == nil { // re-encoded as version 2, otherwise the same
			binary.LittleEndian.PutUint16(again[4:], 3)
			reseal(again)
		}
		require.Equal(t, b, again)
	})
}
