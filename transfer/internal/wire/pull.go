// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"
	"fmt"
)

// The staging path's pull wire. Over a transport whose gets are one copy (shared memory, cma,
// RDMA) a chunk need not travel as a tagged message, which UCX 1.13 copies through the
// receiver's shared-memory FIFO twice; the receiver reads it out of the sender's slot instead:
//
//  1. The receiver's request carries FlagPull; it posts nothing yet.
//  2. The sender answers with Slots: the address and packed remote key of its staging
//     memory, or a decline (SlotsDeclined, with a reason), after which the chunks come as
//     tagged data messages as on the plain staging path.
//  3. For each chunk the sender gathers into a slot (data header, then payload), it sends
//     SlotReady: the chunk's sequence number and where its slot lies in that memory.
//  4. The receiver reads the slot with a get into a slot of its own, checks the data header,
//     sends SlotTaken and scatters. The sender reuses a slot only after its SlotTaken, or
//     after the receiver's Done or RMARelease, or the transport's word that the receiver is
//     lost: the receiver reads nothing after those.
//
// Every message names the transfer in its header (request, sub, nonce) as any other.

// SlotsFlags are a Slots message's flags.
type SlotsFlags uint32

// The Slots flags.
const (
	// SlotsDeclined: the sender will not expose its slots (Slots.Reason says why); the chunks
	// come as tagged data messages.
	SlotsDeclined SlotsFlags = 1 << 0
	// SlotsValidated: the message names the exposure's generation word (GenAddr, GenKey) and
	// the Generation it holds while the slots are exposed; the receiver reads it after its
	// last get, as on the RMA path (transport.RMAGenerations).
	SlotsValidated SlotsFlags = 1 << 1
	knownSlots                = SlotsDeclined | SlotsValidated
	slotsFixed                = HeaderBytes + 4 + 4 + 8 + 8 // flags, key or reason length, addr, bytes
	slotsGenFixed             = 8 + 8 + 4                   // generation address, generation, key length
	slotReadyBytes            = HeaderBytes + 4 + 4 + 8 + 8 // seq, reserved, offset, length
	slotTakenBytes            = HeaderBytes + 4 + 4         // seq, reserved
	// MaxSlotsKey bounds the packed key a Slots message carries.
	MaxSlotsKey = 2048
)

// Slots answers a request with FlagPull: the sender's staging memory as its transport names
// it for gets (Addr, the address of its first byte, Bytes its length, Key its packed remote
// key), or a decline.
type Slots struct {
	Header
	Flags  SlotsFlags
	Reason string // SlotsDeclined only
	Addr   uint64
	Bytes  int64
	Key    []byte
	// GenAddr, GenKey and Generation (SlotsValidated only): the exposure's generation word,
	// the packed key of the region holding it, and the value it holds while exposed.
	GenAddr    uint64
	GenKey     []byte
	Generation uint64
}

// SlotReady announces that chunk Seq lies in the sender's staging memory at [Offset,
// Offset+Length) from Slots.Addr: its data header, then its payload.
type SlotReady struct {
	Header
	Seq    uint32
	Offset int64
	Length int64
}

// SlotTaken tells the sender that the receiver has read chunk Seq and will not read its slot
// again.
type SlotTaken struct {
	Header
	Seq uint32
}

// AppendBinary implements Message. A reason longer than MaxAbortReason is cut.
func (m *Slots) AppendBinary(b []byte) ([]byte, error) {
	body := m.Key
	if m.Flags&SlotsDeclined != 0 {
		r := m.Reason
		if len(r) > MaxAbortReason {
			r = r[:MaxAbortReason]
		}
		body = []byte(r)
		if m.Flags != SlotsDeclined {
			return nil, fmt.Errorf("a decline of slots has no other flag")
		}
	} else if len(m.Key) == 0 || len(m.Key) > MaxSlotsKey || m.Bytes <= 0 {
		return nil, fmt.Errorf("slots of %d bytes with a %d-byte key: want bytes > 0 and a key of 1 to %d bytes", m.Bytes, len(m.Key), MaxSlotsKey)
	} else if v := m.Flags&SlotsValidated != 0; v && (len(m.GenKey) == 0 || len(m.GenKey) > MaxSlotsKey) || !v && (m.GenKey != nil || m.GenAddr != 0 || m.Generation != 0) {
		return nil, fmt.Errorf("a generation key of %d bytes: want 1 to %d with SlotsValidated, none without", len(m.GenKey), MaxSlotsKey)
	}
	b = m.Header.append(b, KindSlots)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Flags))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
	b = binary.LittleEndian.AppendUint64(b, m.Addr)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.Bytes))
	b = append(b, body...)
	if m.Flags&SlotsValidated != 0 {
		b = binary.LittleEndian.AppendUint64(b, m.GenAddr)
		b = binary.LittleEndian.AppendUint64(b, m.Generation)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m.GenKey)))
		b = append(b, m.GenKey...)
	}
	return b, nil
}

// AppendBinary implements Message.
func (m *SlotReady) AppendBinary(b []byte) ([]byte, error) {
	b = m.Header.append(b, KindSlotReady)
	b = binary.LittleEndian.AppendUint32(b, m.Seq)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.Offset))
	return binary.LittleEndian.AppendUint64(b, uint64(m.Length)), nil
}

// AppendBinary implements Message.
func (m *SlotTaken) AppendBinary(b []byte) ([]byte, error) {
	b = m.Header.append(b, KindSlotTaken)
	b = binary.LittleEndian.AppendUint32(b, m.Seq)
	return binary.LittleEndian.AppendUint32(b, 0), nil
}

// decodePull parses the pull wire's messages (h.Kind is one of them).
func decodePull(h Header, b []byte) (Message, error) {
	u32 := func(at int) uint32 { return binary.LittleEndian.Uint32(b[at:]) }
	u64 := func(at int) int64 { return int64(binary.LittleEndian.Uint64(b[at:])) }
	switch h.Kind {
	case KindSlots:
		if len(b) < slotsFixed {
			return nil, malformed(len(b), "slots of %d bytes, shorter than %d", len(b), slotsFixed)
		}
		m := &Slots{Header: h, Flags: SlotsFlags(u32(HeaderBytes)), Addr: uint64(u64(HeaderBytes + 8)), Bytes: u64(HeaderBytes + 16)}
		n := int(u32(HeaderBytes + 4))
		end := slotsFixed + n // where the generation part starts
		if m.Flags&SlotsValidated != 0 {
			if n > MaxSlotsKey || len(b) < end+slotsGenFixed {
				return nil, malformed(len(b), "a validated slots message of %d bytes has no generation word", len(b))
			}
			m.GenAddr, m.Generation = uint64(u64(end)), uint64(u64(end+8))
			g := int(u32(end + 16))
			if g == 0 || g > MaxSlotsKey || len(b) != end+slotsGenFixed+g {
				return nil, malformed(end+16, "generation key of %d bytes in a %d-byte slots message", g, len(b))
			}
			m.GenKey = append([]byte(nil), b[end+slotsGenFixed:]...)
			b = b[:end]
		}
		switch {
		case m.Flags&^knownSlots != 0:
			return nil, malformed(HeaderBytes, "unknown slots flags %#x", uint32(m.Flags&^knownSlots))
		case len(b) != slotsFixed+n:
			return nil, malformed(HeaderBytes+4, "a %d-byte body in a %d-byte slots message", n, len(b))
		case m.Flags&SlotsDeclined != 0:
			if n > MaxAbortReason || m.Addr != 0 || m.Bytes != 0 || m.Flags != SlotsDeclined {
				return nil, malformed(HeaderBytes+4, "a decline names no memory and gives at most %d bytes of reason", MaxAbortReason)
			}
			m.Reason = string(b[slotsFixed:])
		case n == 0 || n > MaxSlotsKey:
			return nil, malformed(HeaderBytes+4, "key of %d bytes, want 1 to %d", n, MaxSlotsKey)
		case m.Bytes <= 0 || m.Bytes > 1<<48:
			return nil, malformed(HeaderBytes+16, "slots of %d bytes", m.Bytes)
		default:
			m.Key = append([]byte(nil), b[slotsFixed:]...)
		}
		return m, nil
	case KindSlotReady:
		if len(b) != slotReadyBytes {
			return nil, malformed(min(len(b), slotReadyBytes), "slot-ready of %d bytes, want %d", len(b), slotReadyBytes)
		}
		if r := u32(HeaderBytes + 4); r != 0 {
			return nil, malformed(HeaderBytes+4, "reserved field is %d, must be 0", r)
		}
		m := &SlotReady{Header: h, Seq: u32(HeaderBytes), Offset: u64(HeaderBytes + 8), Length: u64(HeaderBytes + 16)}
		if m.Offset < 0 || m.Length <= DataHeaderBytes || m.Length > 1<<40 {
			return nil, malformed(HeaderBytes+8, "slot at %d of %d bytes", m.Offset, m.Length)
		}
		return m, nil
	default: // KindSlotTaken
		if len(b) != slotTakenBytes {
			return nil, malformed(min(len(b), slotTakenBytes), "slot-taken of %d bytes, want %d", len(b), slotTakenBytes)
		}
		if r := u32(HeaderBytes + 4); r != 0 {
			return nil, malformed(HeaderBytes+4, "reserved field is %d, must be 0", r)
		}
		return &SlotTaken{Header: h, Seq: u32(HeaderBytes)}, nil
	}
}
