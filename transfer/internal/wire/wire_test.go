// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// testDims is a small model: 2 layers, K and V, 4 heads of 8 FP16 elements, 4 tokens a block.
var testDims = layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 4, HeadDim: 8, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 64}

// The data header's size stated in package transport, for transports, is this format's.
func TestDataHeaderBytesIsTransports(t *testing.T) {
	require.Equal(t, transport.DataHeaderBytes, DataHeaderBytes)
	require.Equal(t, transport.KindData, KindData)
}

func TestWireRoundTrip(t *testing.T) {
	h := Header{Sub: 3, Request: 0xdeadbeef01, Nonce: 0x0123456789abcdef}
	msgs := []Message{
		&RequestInfo{Header: h, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 9, Heads: 4, TokensPerBlock: 16, HeadDim: 128, ElemSize: 2}, ChunkBytes: 4096, Depth: 2},
		&RequestInfo{Header: h, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 9, Heads: 4, TokensPerBlock: 16, HeadDim: 128, ElemSize: 2}, ChunkBytes: 64 << 20, Depth: 2, Flags: FlagDirect},
		&RequestInfo{Header: h, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 9, Heads: 4, TokensPerBlock: 16, HeadDim: 128, ElemSize: 2}, ChunkBytes: 64, Depth: 2, Flags: FlagDirect | FlagLayerCut, Held: []int{1}, HeldOf: 10},
		&Done{Header: h, Bytes: 123456},
		&Abort{Header: h, Code: AbortDeadline, Reason: "too slow"},
		&AbortAck{Header: h},
		&RequestInfo{Header: h, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 9, Heads: 4, TokensPerBlock: 16, HeadDim: 128, ElemSize: 2}, ChunkBytes: 64 << 20, Depth: 2, Flags: FlagDirect | FlagRMA},
		&RequestInfo{Header: h, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 9, Heads: 4, TokensPerBlock: 16, HeadDim: 128, ElemSize: 2}, ChunkBytes: 64, Depth: 2, Flags: FlagClaim,
			Claim: Claim{Incarnation: 0xabcdef, Proof: [ClaimProofBytes]byte{1, 2, 3, 15: 16}}},
		&RequestInfo{Header: h, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 9, Heads: 4, TokensPerBlock: 16, HeadDim: 128, ElemSize: 2}, ChunkBytes: 64, Depth: 2, Flags: FlagClaim | FlagLayerCut, Held: []int{3}, HeldOf: 10,
			Claim: Claim{Incarnation: 1, Proof: [ClaimProofBytes]byte{9}}},
		&RMAOffer{Header: h, Addr: 0x7f0000001000, PoolBytes: 1 << 30, Layout: layout.Packed(testDims, layout.BlockMajor),
			Selection: layout.Selection{LayerEnd: 2, HeadBegin: 1, HeadEnd: 3}, Blocks: []int32{7, 3, -1}, Key: []byte{1, 2, 3}},
		&RMAOffer{Header: h, Flags: RMADeclined, Reason: "streaming"},
		&RMAOffer{Header: h, Flags: RMAOfferPart, Addr: 0x7f0000001000, PoolBytes: 1 << 30, Layout: layout.Packed(testDims, layout.BlockMajor),
			Blocks: []int32{4, 5}, First: 768, Total: 770, Key: []byte{1, 2, 3}},
		&RMAOffer{Header: h, Flags: RMAValidated, Addr: 0x7f0000001000, PoolBytes: 1 << 30, Layout: layout.Packed(testDims, layout.BlockMajor),
			Blocks: []int32{7}, Key: []byte{1, 2, 3}, GenAddr: 0x7f0000100008, GenKey: []byte{4, 5}, Generation: 1<<40 + 3},
		&RMAOffer{Header: h, Flags: RMAOfferPart | RMAValidated, Addr: 0x7f0000001000, PoolBytes: 1 << 30, Layout: layout.Packed(testDims, layout.BlockMajor),
			Blocks: []int32{4, 5}, First: 768, Total: 770, Key: []byte{1, 2, 3}, GenAddr: 8, GenKey: []byte{6}, Generation: 9},
		&RMARelease{Header: h},
		&HelloChallenge{Challenge: [ChallengeBytes]byte{0: 1, 15: 0xff}},
		goodProof(),
		&HelloProof{Echo: [ChallengeBytes]byte{9}, Min: ProofVersion, Max: 200, Features: ^Feature(0)}, // a newer peer's
	}
	for _, m := range msgs {
		b := Encode(m)
		got, err := Decode(b)
		require.NoError(t, err)
		want := m
		switch w := m.(type) { // Decode fills in the kind
		case *RequestInfo:
			c := *w
			c.Kind = KindRequestInfo
			want = &c
		case *Done:
			c := *w
			c.Kind = KindDone
			want = &c
		case *Abort:
			c := *w
			c.Kind = KindAbort
			want = &c
		case *AbortAck:
			c := *w
			c.Kind = KindAbortAck
			want = &c
		case *RMAOffer:
			c := *w
			c.Kind = KindRMAOffer
			want = &c
		case *RMARelease:
			c := *w
			c.Kind = KindRMARelease
			want = &c
		case *HelloChallenge:
			c := *w
			c.Kind = KindHelloChallenge
			want = &c
		case *HelloProof:
			c := *w
			c.Kind = KindHelloProof
			want = &c
		}
		require.Equal(t, want, got)
	}
	d := DataHeader{Header: h, Seq: 7, Offset: 4096, Length: 3}
	b, _ := d.AppendBinary(nil)
	b = append(b, 1, 2, 3)
	got, payload, err := DecodeData(b)
	require.NoError(t, err)
	d.Kind = KindData
	require.Equal(t, d, got)
	require.Equal(t, []byte{1, 2, 3}, payload)
}

// rmaPartAt is where an offer part's First and Total lie.
const rmaPartAt = OfferFixedBytes + OfferBodyBytes

func TestWireRejectsGarbage(t *testing.T) {
	good := Encode(&Done{Header: Header{Request: 1}, Bytes: 5})
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := []struct {
		desc string
		b    []byte
	}{
		{"empty", nil},
		{"short header", good[:10]},
		{"bad magic", mut(func(b []byte) []byte { b[0] = 0; return b })},
		{"bad version", mut(func(b []byte) []byte { b[2] = 9; return b })},
		{"version 1 (no nonce)", mut(func(b []byte) []byte { b[2] = 1; return append(b[:16], b[HeaderBytes:]...) })},
		{"unknown kind", mut(func(b []byte) []byte { b[3] = 77; return b })},
		{"reserved set", mut(func(b []byte) []byte { b[6] = 1; return b })},
		{"trailing byte", mut(func(b []byte) []byte { return append(b, 0) })},
		{"truncated body", good[:len(good)-1]},
		{"data through Decode", mut(func(b []byte) []byte { b[3] = byte(KindData); return b })},
		{"abort with unknown code", encodeRaw(&Abort{Header: Header{Request: 1}, Code: 99})},
		{"request-info with zero layers", Encode(&RequestInfo{Shape: kvplan.Shape{KVFactor: 2, Blocks: 1, Heads: 1, TokensPerBlock: 1, HeadDim: 1, ElemSize: 2}, ChunkBytes: 2, Depth: 1})},
		{"rma offer with a block count past its bytes", func() []byte {
			b := Encode(&RMAOffer{Header: Header{Request: 1}, Layout: layout.Packed(testDims, layout.BlockMajor), Blocks: []int32{1}, Key: []byte{9}})
			b[HeaderBytes+4] = 2
			return b
		}()},
		{"rma offer without a key", func() []byte {
			b := Encode(&RMAOffer{Header: Header{Request: 1}, Blocks: []int32{1}, Key: []byte{9}})
			return b[:len(b)-1]
		}()},
		{"rma offer with unknown flags", func() []byte {
			b := Encode(&RMAOffer{Header: Header{Request: 1}, Flags: RMADeclined})
			b[HeaderBytes] |= 0x80
			return b
		}()},
		{"declined offer with blocks", func() []byte {
			b := Encode(&RMAOffer{Header: Header{Request: 1}, Flags: RMADeclined})
			b[HeaderBytes+4] = 1
			return b
		}()},
		{"rma offer part past its total", mutPart(func(b []byte) { binary.LittleEndian.PutUint32(b[rmaPartAt:], 3) })},
		{"rma offer part of a total past MaxBlocks", mutPart(func(b []byte) { binary.LittleEndian.PutUint32(b[rmaPartAt+4:], MaxBlocks+1) })},
		{"rma offer part of no blocks", mutPart(func(b []byte) { binary.LittleEndian.PutUint32(b[HeaderBytes+4:], 0) })},
		{"declined offer part", func() []byte {
			b := Encode(&RMAOffer{Header: Header{Request: 1}, Flags: RMADeclined})
			b[HeaderBytes] |= byte(RMAOfferPart)
			return b
		}()},
		{"whole rma offer with a part's fields", func() []byte {
			b := Encode(&RMAOffer{Header: Header{Request: 1}, Flags: RMAOfferPart, Layout: layout.Packed(testDims, layout.BlockMajor),
				Blocks: []int32{1}, First: 0, Total: 2, Key: []byte{9}})
			b[HeaderBytes] &^= byte(RMAOfferPart)
			return b
		}()},
		{"rma release with a body", append(Encode(&RMARelease{Header: Header{Request: 1}}), 0)},
		{"a version-3 kind stamped 4", mut(func(b []byte) []byte { b[2] = ProofVersion; return b })},
		{"a challenge stamped 3", func() []byte { b := Encode(&HelloChallenge{}); b[2] = 3; return b }()},
		{"a challenge naming a request", func() []byte { b := Encode(&HelloChallenge{}); b[8] = 1; return b }()},
		{"a short challenge", Encode(&HelloChallenge{})[:HelloChallengeBytes-1]},
		{"a long challenge", append(Encode(&HelloChallenge{}), 0)},
		{"a proof stamped 3", func() []byte { b := Encode(goodProof()); b[2] = 3; return b }()},
		{"a proof naming a nonce", func() []byte { b := Encode(goodProof()); b[16] = 1; return b }()},
		{"a short proof", Encode(goodProof())[:HelloProofBytes-1]},
		{"a long proof", append(Encode(goodProof()), 0)},
		{"a proof of a wire-3 engine", func() []byte { b := Encode(goodProof()); b[HeaderBytes+ChallengeBytes+1] = 3; return b }()},
		{"a proof with min above max", func() []byte { b := Encode(goodProof()); b[HeaderBytes+ChallengeBytes] = 9; return b }()},
		{"a proof with min zero", func() []byte { b := Encode(goodProof()); b[HeaderBytes+ChallengeBytes] = 0; return b }()},
		{"a proof with flags", func() []byte { b := Encode(goodProof()); b[HeaderBytes+ChallengeBytes+2] = 1; return b }()},
		{"a proof with reserved set", func() []byte { b := Encode(goodProof()); b[HeaderBytes+ChallengeBytes+4] = 1; return b }()},
		{"request-info chunk not whole elements", Encode(&RequestInfo{Shape: kvplan.Shape{Layers: 1, KVFactor: 2, Blocks: 1, Heads: 1, TokensPerBlock: 1, HeadDim: 1, ElemSize: 2}, ChunkBytes: 3, Depth: 1})},
		{"request-info with a claim cut short", claimed()[:len(claimed())-1]},
		{"request-info with a claim and a byte more", append(claimed(), 0)},
		{"request-info with a claim's bytes but no flag", func() []byte {
			b := claimed()
			b[RequestInfoBytes] &^= byte(FlagClaim)
			return b
		}()},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			_, err := Decode(c.b)
			require.ErrorIs(t, err, ErrMalformed)
			var de *DecodeError
			require.ErrorAs(t, err, &de)
		})
	}
	d := DataHeader{Seq: 1, Offset: 0, Length: 4}
	b, _ := d.AppendBinary(nil)
	_, _, err := DecodeData(append(b, 1, 2)) // length says 4, payload has 2
	require.ErrorIs(t, err, ErrMalformed)
	_, _, err = DecodeData(good)
	require.ErrorIs(t, err, ErrMalformed)
}

// goodProof is a valid hello proof, for the garbage cases to break.
func goodProof() *HelloProof {
	return &HelloProof{Echo: [ChallengeBytes]byte{1, 2, 3}, Min: MinVersion, Max: Version, Features: KnownFeatures}
}

func encodeRaw(m Message) []byte { b, _ := m.AppendBinary(nil); return b }

// mutPart returns a good two-block part (First 0, Total 4) changed by f.
func mutPart(f func(b []byte)) []byte {
	b := Encode(&RMAOffer{Header: Header{Request: 1}, Flags: RMAOfferPart, Layout: layout.Packed(testDims, layout.BlockMajor),
		Blocks: []int32{1, 2}, Total: 4, Key: []byte{9}})
	f(b)
	return b
}

// The encoder refuses a part that is not one: no blocks, past its total, or a total past
// MaxBlocks, and a decline that claims to be a part.
// claimed is a request-info with a claim, for the decoder's tables.
func claimed() []byte {
	return Encode(&RequestInfo{Shape: kvplan.Shape{Layers: 1, KVFactor: 2, Blocks: 1, Heads: 1, TokensPerBlock: 1, HeadDim: 1, ElemSize: 2},
		ChunkBytes: 2, Depth: 1, Flags: FlagClaim, Claim: Claim{Incarnation: 5, Proof: [ClaimProofBytes]byte{7}}})
}

// A claim's proof is bound to every field it covers: the same secret over another request,
// sub-transfer, nonce or receiver incarnation, or another secret, proves something else.
func TestClaimProofBindsItsFields(t *testing.T) {
	secret := []byte("0123456789abcdef")
	p := ClaimProof(secret, 1, 2, 3, 4)
	require.Equal(t, p, ClaimProof(secret, 1, 2, 3, 4), "deterministic")
	for _, c := range []struct {
		desc string
		got  [ClaimProofBytes]byte
	}{
		{"another request", ClaimProof(secret, 9, 2, 3, 4)},
		{"another sub-transfer", ClaimProof(secret, 1, 9, 3, 4)},
		{"another nonce", ClaimProof(secret, 1, 2, 9, 4)},
		{"another incarnation", ClaimProof(secret, 1, 2, 3, 9)},
		{"another secret", ClaimProof([]byte("fedcba9876543210"), 1, 2, 3, 4)},
	} {
		require.NotEqual(t, p, c.got, c.desc)
	}
}

func TestWireRefusesToEncodeBadOfferParts(t *testing.T) {
	l := layout.Packed(testDims, layout.BlockMajor)
	for _, m := range []*RMAOffer{
		{Flags: RMAOfferPart, Layout: l, Total: 4, Key: []byte{9}},
		{Flags: RMAOfferPart, Layout: l, Blocks: []int32{1, 2}, First: 3, Total: 4, Key: []byte{9}},
		{Flags: RMAOfferPart, Layout: l, Blocks: []int32{1}, First: -1, Total: 4, Key: []byte{9}},
		{Flags: RMAOfferPart, Layout: l, Blocks: []int32{1}, Total: MaxBlocks + 1, Key: []byte{9}},
		{Flags: RMAOfferPart | RMADeclined, Reason: "no"},
		{Layout: l, Blocks: []int32{1}, First: 1, Total: 4, Key: []byte{9}},
	} {
		_, err := m.AppendBinary(nil)
		require.ErrorIs(t, err, ErrMalformed, "%+v", m)
	}
}

// FuzzDecode feeds arbitrary bytes to both decoders: they must return a message or a typed
// error, never panic, and whatever decodes must re-Encode to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(&Done{Header: Header{Request: 1}, Bytes: 5}))
	f.Add(Encode(&Done{Header: Header{Request: 1, Nonce: 0xfedcba9876543210}, Bytes: 5}))
	v1 := Encode(&Done{Header: Header{Request: 1}, Bytes: 5}) // a version-1 peer: 16-byte header, no nonce
	v1[2] = 1
	f.Add(append(v1[:16], v1[HeaderBytes:]...))
	f.Add(Encode(&Abort{Header: Header{Request: 2, Sub: 1, Nonce: 7}, Code: AbortCancelled, Reason: "x"}))
	f.Add(Encode(&AbortAck{Header: Header{Request: 3}}))
	f.Add(Encode(&RequestInfo{Header: Header{Request: 4}, Shape: kvplan.Shape{Layers: 1, KVFactor: 2, Blocks: 3, Heads: 1, TokensPerBlock: 4, HeadDim: 8, ElemSize: 2}, ChunkBytes: 64, Depth: 2}))
	f.Add(Encode(&RequestInfo{Header: Header{Request: 5}, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 3, Heads: 1, TokensPerBlock: 4, HeadDim: 8, ElemSize: 2},
		ChunkBytes: 64, Depth: 2, Flags: FlagLayerCut, Held: []int{0, 9}, HeldOf: 12}))
	f.Add(Encode(&RequestInfo{Header: Header{Request: 6}, Shape: kvplan.Shape{Layers: 2, KVFactor: 2, Blocks: 3, Heads: 1, TokensPerBlock: 4, HeadDim: 8, ElemSize: 2},
		ChunkBytes: 1 << 26, Depth: 2, Flags: FlagDirect}))
	f.Add(claimed())
	f.Add(Encode(&RMAOffer{Header: Header{Request: 7}, Addr: 4096, PoolBytes: 1 << 20, Layout: layout.Packed(testDims, layout.BlockMajor),
		Selection: layout.Selection{LayerEnd: 2, HeadEnd: 4}, Blocks: []int32{1, 2}, Key: []byte("key")}))
	f.Add(Encode(&RMAOffer{Header: Header{Request: 8}, Flags: RMADeclined, Reason: "no"}))
	f.Add(Encode(&RMARelease{Header: Header{Request: 9}}))
	f.Add(Encode(&Hello{Min: MinVersion, Max: Version, Features: KnownFeatures}))
	f.Add(Encode(&Hello{Min: MinVersion, Max: Version + 1, Reply: true, Features: KnownFeatures | 1<<20})) // a newer peer's
	f.Add(Encode(&RMAOffer{Header: Header{Request: 10}, Flags: RMAOfferPart, Addr: 4096, PoolBytes: 1 << 20,
		Layout: layout.Packed(testDims, layout.BlockMajor), Blocks: []int32{2, 3}, First: 1, Total: 3, Key: []byte{5}}))
	f.Add(Encode(&Slots{Header: Header{Request: 11, Nonce: 3}, Addr: 4096, Bytes: 1 << 20, Key: []byte("key")}))
	f.Add(Encode(&Slots{Header: Header{Request: 12, Nonce: 3}, Flags: SlotsDeclined, Reason: "no"}))
	f.Add(Encode(&Slots{Header: Header{Request: 15, Nonce: 3}, Flags: SlotsValidated, Addr: 4096, Bytes: 1 << 20, Key: []byte("key"), GenAddr: 8, GenKey: []byte{1}, Generation: 2}))
	f.Add(Encode(&SlotReady{Header: Header{Request: 13, Nonce: 3}, Seq: 4, Offset: 1 << 22, Length: 1<<22 + DataHeaderBytes}))
	f.Add(Encode(&SlotTaken{Header: Header{Request: 14, Nonce: 3}, Seq: 4}))
	f.Add(Encode(&HelloChallenge{Challenge: [ChallengeBytes]byte{7, 7, 7}}))
	f.Add(Encode(goodProof()))
	ring, _ := NewKeyring([][]byte{make([]byte, ClusterKeyBytes)})
	f.Add(ring.SealMessage(&Hello{Min: MinVersion, Max: Version, Features: KnownFeatures}))
	f.Add(ring.SealMessage(&HelloChallenge{Challenge: [ChallengeBytes]byte{1}}))
	f.Add(ring.SealMessage(goodProof()))
	f.Add(Encode(&HelloProof{Echo: [ChallengeBytes]byte{1}, Min: MinVersion, Max: Version + 1, Features: KnownFeatures | 1<<30}))
	f.Add(Encode(&Goodbye{Flags: GoodbyeLast, Ended: []Ended{{Request: 16, Sub: 1, Nonce: 3, Role: RoleSender}, {Request: 17, Nonce: 4, Role: RoleReceiver}}}))
	f.Add(Encode(&Goodbye{}))
	d, _ := (&DataHeader{Header: Header{Nonce: 1 << 63}, Seq: 2, Offset: 8, Length: 1}).AppendBinary(nil)
	f.Add(append(d, 7))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
		} else {
			re, err := m.AppendBinary(nil)
			require.NoError(t, err)
			require.Equal(t, b, re)
		}
		dh, payload, err := DecodeData(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		require.Equal(t, dh.Length, int64(len(payload)))
		re, _ := dh.AppendBinary(nil)
		require.Equal(t, b, append(re, payload...))
	})
}

// A wire-3 peer reads every kind of version 3 that an engine of version 4 sends: they are
// stamped 3, and only the challenge and the proof (sent only to a peer whose hello says 4)
// are stamped 4. A proof that says it comes from a wire-3 engine does not encode.
func TestWireKindsOfVersion3AreStampedThree(t *testing.T) {
	h := Header{Request: 1, Nonce: 2}
	for _, c := range []struct {
		desc string
		m    Message
		want uint8
	}{
		{"done", &Done{Header: h, Bytes: 1}, 3},
		{"abort", &Abort{Header: h, Code: AbortClosed}, 3},
		{"rma release", &RMARelease{Header: h}, 3},
		{"slot taken", &SlotTaken{Header: h, Seq: 1}, 3},
		{"hello: its sender's highest", &Hello{Min: MinVersion, Max: Version}, Version},
		{"challenge", &HelloChallenge{}, ProofVersion},
		{"proof", goodProof(), ProofVersion},
	} {
		require.Equal(t, c.want, Encode(c.m)[2], c.desc)
	}
	_, err := (&HelloProof{Min: 3, Max: 3}).AppendBinary(nil)
	require.Error(t, err, "a wire-3 engine proves nothing")
}
