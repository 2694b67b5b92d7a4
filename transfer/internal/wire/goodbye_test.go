// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

var someEnded = []Ended{
	{Request: 0xdeadbeef01, Sub: 3, Nonce: 0x0123456789abcdef, Role: RoleSender},
	{Request: 7, Sub: 0, Nonce: 1, Role: RoleReceiver},
	{Request: 9, Sub: 0, Nonce: 0, Role: RoleSender}, // a Send that ended before its request reached it
}

func TestGoodbyeRoundTrip(t *testing.T) {
	cases := []struct {
		desc string
		m    *Goodbye
	}{
		{"three transfers (one without a nonce), the last part", &Goodbye{Flags: GoodbyeLast, Ended: someEnded}},
		{"a part with more to come", &Goodbye{Ended: someEnded[:1]}},
		{"no transfers: the peer only leaves", &Goodbye{Flags: GoodbyeLast}},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			b := Encode(c.m)
			require.Equal(t, byte(4), b[2], "a wire-4 kind carries version 4")
			got, err := Decode(b)
			require.NoError(t, err)
			want := *c.m
			want.Kind = KindGoodbye
			require.Equal(t, &want, got)
		})
	}
}

// Wire-3 kinds keep the version byte a wire-3 engine sends and expects: an engine of wire 4
// talks to one of wire 3 unchanged.
func TestWireV3KindsKeepVersion3(t *testing.T) {
	for _, m := range []Message{&Done{Header: Header{Request: 1, Nonce: 2}, Bytes: 5}, &AbortAck{Header: Header{Request: 3, Nonce: 4}},
		&SlotTaken{Header: Header{Request: 14, Nonce: 3}, Seq: 4}} {
		b := Encode(m)
		require.Equal(t, byte(3), b[2], "%T", m)
		b[2] = 4
		_, err := Decode(b)
		require.ErrorIs(t, err, ErrMalformed, "%T stamped 4", m)
	}
}

func TestGoodbyeRejectsGarbage(t *testing.T) {
	good := Encode(&Goodbye{Flags: GoodbyeLast, Ended: someEnded})
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	entry := goodbyeFixed // the first entry
	cases := []struct {
		desc string
		b    []byte
	}{
		{"stamped version 3 (what a wire-3 engine would refuse)", mut(func(b []byte) []byte { b[2] = 3; return b })},
		{"names a request", mut(func(b []byte) []byte { b[8] = 1; return b })},
		{"names a nonce", mut(func(b []byte) []byte { b[16] = 1; return b })},
		{"names a sub", mut(func(b []byte) []byte { b[4] = 1; return b })},
		{"unknown flags", mut(func(b []byte) []byte { b[HeaderBytes] |= 0x80; return b })},
		{"reserved set", mut(func(b []byte) []byte { b[HeaderBytes+4] = 1; return b })},
		{"count past its bytes", mut(func(b []byte) []byte {
			binary.LittleEndian.PutUint16(b[HeaderBytes+2:], uint16(len(someEnded)+1))
			return b
		})},
		{"count short of its bytes", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[HeaderBytes+2:], 1); return b })},
		{"truncated entry", good[:len(good)-1]},
		{"trailing byte", mut(func(b []byte) []byte { return append(b, 0) })},
		{"shorter than its fixed part", good[:goodbyeFixed-1]},
		{"nonce 0 from a receiver (only a Send that never had a request has none)", mut(func(b []byte) []byte {
			clear(b[entry+8 : entry+16])
			b[entry+18] = byte(RoleReceiver)
			return b
		})},
		{"role 0", mut(func(b []byte) []byte { b[entry+18] = 0; return b })},
		{"role 3", mut(func(b []byte) []byte { b[entry+18] = 3; return b })},
		{"entry reserved set", mut(func(b []byte) []byte { b[entry+19] = 1; return b })},
		{"a goodbye body under kind 12 (a challenge)", mut(func(b []byte) []byte { b[3] = 12; return b })},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			_, err := Decode(c.b)
			require.ErrorIs(t, err, ErrMalformed)
			var de *DecodeError
			require.ErrorAs(t, err, &de)
		})
	}
	for _, m := range []*Goodbye{
		{Header: Header{Request: 1}},
		{Flags: 0x8000},
		{Ended: []Ended{{Request: 1, Role: RoleReceiver}}},
		{Ended: []Ended{{Request: 1, Nonce: 1}}},
	} {
		_, err := m.AppendBinary(nil)
		require.ErrorIs(t, err, ErrMalformed, "%+v", m)
	}
}

// A goodbye too long for one control message goes in parts that each fit the room, the last
// marked, every transfer in exactly one part, in order.
func TestGoodbyePartsFitControlRoom(t *testing.T) {
	many := make([]Ended, 1000)
	for i := range many {
		many[i] = Ended{Request: transport.RequestID(i), Sub: uint16(i % 3), Nonce: uint64(i + 1), Role: Role(1 + i%2)}
	}
	cases := []struct {
		desc  string
		ended []Ended
		room  int
		parts int
	}{
		{"none: one empty last part", nil, 4000, 1},
		{"fits one", many[:10], 4000, 1},
		{"UCX's default room (about 3.9 KiB with a worker address)", many, 3900, 6},
		{"exactly one per part", many[:3], goodbyeFixed + GoodbyeEntryBytes, 3},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			parts, err := GoodbyeParts(c.ended, c.room)
			require.NoError(t, err)
			require.Len(t, parts, c.parts)
			var got []Ended
			for i, p := range parts {
				b := Encode(p)
				require.LessOrEqual(t, len(b), c.room)
				m, err := Decode(b)
				require.NoError(t, err)
				g := m.(*Goodbye)
				require.Equal(t, i == len(parts)-1, g.Flags&GoodbyeLast != 0)
				got = append(got, g.Ended...)
			}
			require.Equal(t, len(c.ended), len(got))
			if len(c.ended) > 0 {
				require.Equal(t, c.ended, got)
			}
		})
	}
	_, err := GoodbyeParts(many, goodbyeFixed+GoodbyeEntryBytes-1)
	require.ErrorIs(t, err, ErrMalformed)
}
