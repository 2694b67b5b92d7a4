// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"

	"github.com/kvxfer/kvxfer/layout"
)

// The RMA mode's two messages (see package transfer's rma.go). An offer's body after the common header:
//
//	flags u32 | block count u32 | then, declined: reason length u16 | reason
//	                              else: address u64 | pool bytes u64 | layout 12 x u64 |
//	                                    selection 4 x u64 | key length u16 |
//	                                    generation key length u16 (0 unless validated) |
//	                                    [part only: first u32 | total u32] |
//	                                    [validated only: generation address u64 | generation u64] |
//	                                    block ids count x u32 | key | generation key
//
// An offer of more blocks than one control message holds goes in parts (RMAOfferPart): each
// part is a whole offer but for its block ids, positions [first, first+count) of the sender's
// list of total. A receiver that predates parts refuses the flag as unknown; a sender sends
// parts only for requests of more than rmaMaxOfferBlocks blocks, which such a receiver's
// sender declined before.
//
// A validated offer (RMAValidated) also names the exposure's generation word: the receiver
// reads it after its data gets and completes only if it still holds the offered generation
// (see transport.RMAGenerations). A receiver that predates the flag refuses it as unknown.
//
// Decoding checks the structure only (lengths, flags, bounds on counts); whether the layout,
// the block ids and the pool size make sense together is the receiver's check (checkOffer),
// which fails the request with an ErrBadRMAOffer instead of dropping the message.

const (
	OfferFixedBytes      = HeaderBytes + 8
	OfferBodyBytes       = 8 + 8 + 12*8 + 4*8 + 4
	rmaDeclineFixedBytes = OfferFixedBytes + 2
	// MaxRMAKey bounds a packed remote key in an offer.
	MaxRMAKey = 1 << 12
)

// RMAOfferFlags are options of an RMA offer.
type RMAOfferFlags uint32

// The offer flags.
const (
	// RMADeclined: the sender will not expose its pool (see RMAOffer.Reason); it sends direct
	// chunks instead, as if the request had no FlagRMA.
	RMADeclined RMAOfferFlags = 1 << 0
	// RMAOfferPart: this offer is one part of a larger one (RMAOffer.First, Total); the
	// receiver reads nothing until it holds every position.
	RMAOfferPart RMAOfferFlags = 1 << 1
	// RMAValidated: the offer names its exposure's generation word (GenAddr, GenKey) and the
	// Generation it holds while the pool is exposed; the receiver checks it after its gets.
	RMAValidated    RMAOfferFlags = 1 << 2
	knownOfferFlags               = RMADeclined | RMAOfferPart | RMAValidated
	OfferPartBytes                = 8  // first u32, total u32
	OfferGenBytes                 = 16 // generation address u64, generation u64
)

// RMAOffer answers a request with FlagRMA: the sender's pool as the transport names it
// (Addr, the address of the pool's first byte, and Key, its packed remote key), the pool's
// size, and the sender's plan (layout, selection and block ids, held blocks already dropped),
// from which the receiver works out which pool range to read into which of its own.
type RMAOffer struct {
	Header
	Flags RMAOfferFlags
	// Reason says why the sender declined (RMADeclined only).
	Reason    string
	Addr      uint64
	PoolBytes int64
	Layout    layout.Layout
	Selection layout.Selection
	Blocks    []int32
	// First and Total (RMAOfferPart only): Blocks are positions [First, First+len(Blocks)) of
	// the sender's block list of Total.
	First, Total int
	Key          []byte
	// GenAddr, GenKey and Generation (RMAValidated only): the exposure's generation word, the
	// packed key of the region holding it, and the value it holds while the pool is exposed.
	GenAddr    uint64
	GenKey     []byte
	Generation uint64
}

// RMARelease tells the sender that the receiver will not read its offered pool again.
type RMARelease struct {
	Header
}

func (m *RMAOffer) layoutFields() []*int64 {
	l, s := &m.Layout, &m.Selection
	return []*int64{&l.NumLayers, &l.KVFactor, &l.NumHeads, &l.HeadDim, &l.ElemSize, &l.TokensPerBlock, &l.NumBlocks,
		&l.StrideBlock, &l.StrideLayer, &l.StrideKV, &l.StrideHead, &l.StrideToken,
		&s.LayerBegin, &s.LayerEnd, &s.HeadBegin, &s.HeadEnd}
}

// AppendBinary implements Message. A declined offer carries only its reason (cut to
// MaxAbortReason); an offer needs a key of 1 to MaxRMAKey bytes and at most MaxBlocks blocks.
func (m *RMAOffer) AppendBinary(b []byte) ([]byte, error) {
	if m.Flags&^knownOfferFlags != 0 {
		return nil, malformed(HeaderBytes, "unknown offer flags %#x", uint32(m.Flags))
	}
	b = m.Header.append(b, KindRMAOffer)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Flags))
	part := m.Flags&RMAOfferPart != 0
	if m.Flags&RMADeclined != 0 {
		if part || m.Flags&RMAValidated != 0 {
			return nil, malformed(HeaderBytes, "a declined offer cannot be a part or validated")
		}
		r := m.Reason
		if len(r) > MaxAbortReason {
			r = r[:MaxAbortReason]
		}
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(r)))
		return append(b, r...), nil
	}
	if len(m.Key) == 0 || len(m.Key) > MaxRMAKey || len(m.Blocks) > MaxBlocks {
		return nil, malformed(HeaderBytes, "an offer of %d blocks with a %d-byte key: at most %d blocks, a key of 1 to %d bytes",
			len(m.Blocks), len(m.Key), MaxBlocks, MaxRMAKey)
	}
	if err := checkOfferPart(part, int64(len(m.Blocks)), int64(m.First), int64(m.Total)); err != nil {
		return nil, err
	}
	validated := m.Flags&RMAValidated != 0
	if validated != (len(m.GenKey) > 0) || len(m.GenKey) > MaxRMAKey {
		return nil, malformed(HeaderBytes, "an offer with flags %#x and a %d-byte generation key", uint32(m.Flags), len(m.GenKey))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Blocks)))
	b = binary.LittleEndian.AppendUint64(b, m.Addr)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.PoolBytes))
	for _, f := range m.layoutFields() {
		b = binary.LittleEndian.AppendUint64(b, uint64(*f))
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Key)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.GenKey)))
	if part {
		b = binary.LittleEndian.AppendUint32(b, uint32(m.First))
		b = binary.LittleEndian.AppendUint32(b, uint32(m.Total))
	}
	if validated {
		b = binary.LittleEndian.AppendUint64(b, m.GenAddr)
		b = binary.LittleEndian.AppendUint64(b, m.Generation)
	}
	for _, id := range m.Blocks {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	b = append(b, m.Key...)
	return append(b, m.GenKey...), nil
}

// checkOfferPart checks a part's position fields (first and total zero in a whole offer).
func checkOfferPart(part bool, n, first, total int64) error {
	if !part {
		if first != 0 || total != 0 {
			return malformed(HeaderBytes, "a whole offer with a part's first %d and total %d", first, total)
		}
		return nil
	}
	if n < 1 || first < 0 || total > MaxBlocks || first > total-n {
		return malformed(HeaderBytes+4, "an offer part of blocks [%d, +%d) of %d (at most %d)", first, n, total, MaxBlocks)
	}
	return nil
}

// AppendBinary implements Message.
func (m *RMARelease) AppendBinary(b []byte) ([]byte, error) {
	return m.Header.append(b, KindRMARelease), nil
}

func decodeRMAOffer(h Header, b []byte) (Message, error) {
	if len(b) < OfferFixedBytes {
		return nil, malformed(len(b), "rma offer of %d bytes, shorter than %d", len(b), OfferFixedBytes)
	}
	m := &RMAOffer{Header: h, Flags: RMAOfferFlags(binary.LittleEndian.Uint32(b[HeaderBytes:]))}
	if m.Flags&^knownOfferFlags != 0 {
		return nil, malformed(HeaderBytes, "unknown offer flags %#x", uint32(m.Flags&^knownOfferFlags))
	}
	n := int64(binary.LittleEndian.Uint32(b[HeaderBytes+4:]))
	if m.Flags&RMADeclined != 0 {
		if m.Flags&(RMAOfferPart|RMAValidated) != 0 || n != 0 || len(b) < rmaDeclineFixedBytes {
			return nil, malformed(HeaderBytes+4, "a declined offer (flags %#x) with %d blocks in %d bytes", uint32(m.Flags), n, len(b))
		}
		r := int(binary.LittleEndian.Uint16(b[OfferFixedBytes:]))
		if r > MaxAbortReason || len(b) != rmaDeclineFixedBytes+r {
			return nil, malformed(OfferFixedBytes, "reason of %d bytes in a %d-byte message", r, len(b))
		}
		m.Reason = string(b[rmaDeclineFixedBytes:])
		return m, nil
	}
	if n > MaxBlocks || int64(len(b)) < int64(OfferFixedBytes+OfferBodyBytes)+4*n {
		return nil, malformed(HeaderBytes+4, "%d blocks in a %d-byte offer (at most %d)", n, len(b), MaxBlocks)
	}
	at := OfferFixedBytes
	m.Addr = binary.LittleEndian.Uint64(b[at:])
	m.PoolBytes = int64(binary.LittleEndian.Uint64(b[at+8:]))
	at += 16
	for _, f := range m.layoutFields() {
		*f = int64(binary.LittleEndian.Uint64(b[at:]))
		at += 8
	}
	k := int(binary.LittleEndian.Uint16(b[at:]))
	gk := int(binary.LittleEndian.Uint16(b[at+2:]))
	validated := m.Flags&RMAValidated != 0
	if validated != (gk > 0) || gk > MaxRMAKey {
		return nil, malformed(at+2, "a %d-byte generation key in an offer with flags %#x", gk, uint32(m.Flags))
	}
	at += 4
	if m.Flags&RMAOfferPart != 0 {
		if len(b) < at+OfferPartBytes {
			return nil, malformed(at, "an offer part of %d bytes has no first and total", len(b))
		}
		first, total := int64(binary.LittleEndian.Uint32(b[at:])), int64(binary.LittleEndian.Uint32(b[at+4:]))
		if err := checkOfferPart(true, n, first, total); err != nil {
			return nil, err
		}
		m.First, m.Total = int(first), int(total)
		at += OfferPartBytes
	}
	if validated {
		if len(b) < at+OfferGenBytes {
			return nil, malformed(at, "a validated offer of %d bytes has no generation", len(b))
		}
		m.GenAddr, m.Generation = binary.LittleEndian.Uint64(b[at:]), binary.LittleEndian.Uint64(b[at+8:])
		at += OfferGenBytes
	}
	if k == 0 || k > MaxRMAKey || int64(len(b)) != int64(at)+4*n+int64(k)+int64(gk) {
		return nil, malformed(at-4, "a %d-byte key and a %d-byte generation key after %d blocks in a %d-byte offer", k, gk, n, len(b))
	}
	m.Blocks = make([]int32, n)
	for i := range m.Blocks {
		m.Blocks[i] = int32(binary.LittleEndian.Uint32(b[at:]))
		at += 4
	}
	m.Key = append([]byte(nil), b[at:at+k]...)
	if validated {
		m.GenKey = append([]byte(nil), b[at+k:]...)
	}
	return m, nil
}
