// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
)

func TestPullWireRoundTrip(t *testing.T) {
	h := Header{Sub: 2, Request: 77, Nonce: 0xfeed}
	for _, tc := range []struct {
		m    Message
		kind Kind
	}{
		{&Slots{Header: h, Addr: 0x7f0000000000, Bytes: 64 << 20, Key: []byte{9, 8, 7}}, KindSlots},
		{&Slots{Header: h, Flags: SlotsDeclined, Reason: "no key"}, KindSlots},
		{&Slots{Header: h, Flags: SlotsValidated, Addr: 4096, Bytes: 1 << 20, Key: []byte{1}, GenAddr: 0x7f00, GenKey: []byte{2, 3}, Generation: 99}, KindSlots},
		{&SlotReady{Header: h, Seq: 5, Offset: 8 << 20, Length: 4<<20 + DataHeaderBytes}, KindSlotReady},
		{&SlotTaken{Header: h, Seq: 5}, KindSlotTaken},
	} {
		got, err := Decode(Encode(tc.m))
		require.NoError(t, err)
		require.Equal(t, tc.kind, got.Head().Kind)
		switch w := tc.m.(type) {
		case *Slots:
			c := *w
			c.Kind = KindSlots
			require.Equal(t, &c, got)
		case *SlotReady:
			c := *w
			c.Kind = KindSlotReady
			require.Equal(t, &c, got)
		case *SlotTaken:
			c := *w
			c.Kind = KindSlotTaken
			require.Equal(t, &c, got)
		}
	}
	ri := &RequestInfo{Header: h, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 9, Heads: 4, TokensPerBlock: 16, HeadDim: 128, ElemSize: 2}, ChunkBytes: 4096, Depth: 2, Flags: FlagPull}
	got, err := Decode(Encode(ri))
	require.NoError(t, err)
	require.Equal(t, FlagPull, got.(*RequestInfo).Flags)
}

// A peer's garbage pull messages are a *DecodeError, never a message.
func TestPullWireRefusesGarbage(t *testing.T) {
	h := Header{Sub: 1, Request: 3, Nonce: 4}
	slots := Encode(&Slots{Header: h, Addr: 4096, Bytes: 1 << 20, Key: []byte{1, 2}})
	vslots := Encode(&Slots{Header: h, Flags: SlotsValidated, Addr: 4096, Bytes: 1 << 20, Key: []byte{1, 2}, GenAddr: 8, GenKey: []byte{5, 6}, Generation: 7})
	ready := Encode(&SlotReady{Header: h, Seq: 1, Offset: 0, Length: DataHeaderBytes + 8})
	taken := Encode(&SlotTaken{Header: h, Seq: 1})
	put32 := func(b []byte, at int, v uint32) []byte {
		c := append([]byte(nil), b...)
		binary.LittleEndian.PutUint32(c[at:], v)
		return c
	}
	put64 := func(b []byte, at int, v uint64) []byte {
		c := append([]byte(nil), b...)
		binary.LittleEndian.PutUint64(c[at:], v)
		return c
	}
	ri := Encode(&RequestInfo{Header: h, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 9, Heads: 4, TokensPerBlock: 16, HeadDim: 128, ElemSize: 2}, ChunkBytes: 4096, Depth: 2, Flags: FlagPull})
	for name, b := range map[string][]byte{
		"slots short":              slots[:HeaderBytes+10],
		"slots unknown flag":       put32(slots, HeaderBytes, 1<<5),
		"slots key longer":         put32(slots, HeaderBytes+4, 3),
		"slots empty key":          put32(slots[:slotsFixed], HeaderBytes+4, 0),
		"slots zero bytes":         put64(slots, HeaderBytes+16, 0),
		"slots negative bytes":     put64(slots, HeaderBytes+16, 1<<63),
		"decline with an address":  put32(slots, HeaderBytes, uint32(SlotsDeclined)),
		"validated without a word": put32(slots, HeaderBytes, uint32(SlotsValidated)),
		"generation key longer":    put32(vslots, len(vslots)-6, 3),
		"generation key empty":     put32(vslots[:len(vslots)-2], len(vslots)-6, 0),
		"ready short":              ready[:len(ready)-1],
		"ready long":               append(append([]byte(nil), ready...), 0),
		"ready reserved":           put32(ready, HeaderBytes+4, 1),
		"ready negative offset":    put64(ready, HeaderBytes+8, 1<<63),
		"ready no payload":         put64(ready, HeaderBytes+16, DataHeaderBytes),
		"taken short":              taken[:len(taken)-1],
		"taken reserved":           put32(taken, HeaderBytes+4, 7),
		"pull with direct":         put32(ri, RequestInfoBytes, uint32(FlagPull|FlagDirect)),
	} {
		_, err := Decode(b)
		var de *DecodeError
		require.True(t, errors.As(err, &de), "%s: %v", name, err)
	}
}
