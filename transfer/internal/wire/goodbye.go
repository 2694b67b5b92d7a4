// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"
	"fmt"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The goodbye (wire 4, FeatureGoodbye; docs/protocol.md, "Goodbye"). An engine that drains or
// closes tells each peer it had transfers with which of them ended on its side with every
// operation quiescent (MemoryDone, never MemoryUnknown): the departing side will not read or
// write the peer's memory for them any more. Its body is
//
//	flags u16 | count u16 | reserved u32 = 0 | count x (request u64 | nonce u64 | sub u16 | role u8 | reserved u8 = 0)
//
// and its header carries request 0, sub 0 and nonce 0: it names no one transfer. A goodbye
// with more transfers than one control message holds goes in parts (GoodbyeParts), the last
// with GoodbyeLast: after it the departing side closes its endpoints.

// GoodbyeFlags are a goodbye's flags.
type GoodbyeFlags uint16

// The goodbye flags.
const (
	// GoodbyeLast: the last part; the departing side closes its endpoints after it.
	GoodbyeLast  GoodbyeFlags = 1 << 0
	knownGoodbye              = GoodbyeLast
)

// Role is which side of a transfer the departing engine was.
type Role uint8

// The roles.
const (
	// RoleSender: the departing engine sent the transfer's blocks.
	RoleSender Role = 1
	// RoleReceiver: the departing engine received them.
	RoleReceiver Role = 2
)

const (
	goodbyeFixed = HeaderBytes + 2 + 2 + 4
	// GoodbyeEntryBytes is the size of one transfer in a goodbye.
	GoodbyeEntryBytes = 8 + 8 + 2 + 1 + 1
	// MaxGoodbyeEntries bounds the transfers of one goodbye message (its count field).
	MaxGoodbyeEntries = 1<<16 - 1
)

// Ended names one transfer a goodbye lists: its request, sub-transfer and nonce as on the
// wire, and the departing side's role in it.
type Ended struct {
	Request transport.RequestID
	Sub     uint16
	Nonce   uint64
	Role    Role
}

// Goodbye lists the transfers a departing engine ended with their operations quiescent.
type Goodbye struct {
	Header
	Flags GoodbyeFlags
	Ended []Ended
}

// AppendBinary implements Message.
func (m *Goodbye) AppendBinary(b []byte) ([]byte, error) {
	if m.Sub != 0 || m.Request != 0 || m.Nonce != 0 {
		return nil, malformed(4, "a goodbye names no request")
	}
	if m.Flags&^knownGoodbye != 0 {
		return nil, malformed(HeaderBytes, "unknown goodbye flags %#x", uint16(m.Flags))
	}
	if len(m.Ended) > MaxGoodbyeEntries {
		return nil, malformed(HeaderBytes+2, "%d transfers in one goodbye, at most %d", len(m.Ended), MaxGoodbyeEntries)
	}
	for i, e := range m.Ended {
		if err := e.check(goodbyeFixed + i*GoodbyeEntryBytes); err != nil {
			return nil, err
		}
	}
	b = m.Header.append(b, KindGoodbye)
	b = binary.LittleEndian.AppendUint16(b, uint16(m.Flags))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Ended)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	for _, e := range m.Ended {
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Request))
		b = binary.LittleEndian.AppendUint64(b, e.Nonce)
		b = binary.LittleEndian.AppendUint16(b, e.Sub)
		b = append(b, byte(e.Role), 0)
	}
	return b, nil
}

// check refuses an entry no engine sends: a nonce of 0 but from a sender (a Send that ended
// before its receiver's request reached it, which it names so) or an unknown role.
func (e Ended) check(at int) error {
	switch {
	case e.Nonce == 0 && e.Role != RoleSender:
		return malformed(at+8, "goodbye entry for request %d with nonce 0 and role %d", e.Request, e.Role)
	case e.Role != RoleSender && e.Role != RoleReceiver:
		return malformed(at+18, "goodbye entry for request %d with role %d", e.Request, e.Role)
	}
	return nil
}

func decodeGoodbye(h Header, b []byte) (*Goodbye, error) {
	if len(b) < goodbyeFixed {
		return nil, malformed(len(b), "goodbye of %d bytes, shorter than %d", len(b), goodbyeFixed)
	}
	if h.Sub != 0 || h.Request != 0 || h.Nonce != 0 {
		return nil, malformed(4, "a goodbye names no request, sub-transfer or nonce")
	}
	m := &Goodbye{Header: h, Flags: GoodbyeFlags(binary.LittleEndian.Uint16(b[HeaderBytes:]))}
	n := int(binary.LittleEndian.Uint16(b[HeaderBytes+2:]))
	switch r := binary.LittleEndian.Uint32(b[HeaderBytes+4:]); {
	case m.Flags&^knownGoodbye != 0:
		return nil, malformed(HeaderBytes, "unknown goodbye flags %#x", uint16(m.Flags))
	case r != 0:
		return nil, malformed(HeaderBytes+4, "reserved field is %d, must be 0", r)
	case len(b) != goodbyeFixed+n*GoodbyeEntryBytes:
		return nil, malformed(HeaderBytes+2, "goodbye of %d transfers in %d bytes, want %d", n, len(b), goodbyeFixed+n*GoodbyeEntryBytes)
	}
	if n > 0 {
		m.Ended = make([]Ended, n)
	}
	for i := range m.Ended {
		at := goodbyeFixed + i*GoodbyeEntryBytes
		e := Ended{Request: transport.RequestID(binary.LittleEndian.Uint64(b[at:])), Nonce: binary.LittleEndian.Uint64(b[at+8:]),
			Sub: binary.LittleEndian.Uint16(b[at+16:]), Role: Role(b[at+18])}
		if err := e.check(at); err != nil {
			return nil, err
		}
		if b[at+19] != 0 {
			return nil, malformed(at+19, "reserved byte is %d, must be 0", b[at+19])
		}
		m.Ended[i] = e
	}
	return m, nil
}

// GoodbyeParts splits ended into goodbye messages of at most room bytes each (a transport's
// ControlRoom), the last marked GoodbyeLast. No transfers is one empty part: it still says the
// sender is leaving.
func GoodbyeParts(ended []Ended, room int) ([]*Goodbye, error) {
	per := min((room-goodbyeFixed)/GoodbyeEntryBytes, MaxGoodbyeEntries)
	if per < 1 {
		return nil, fmt.Errorf("%w: a goodbye of one transfer takes %d bytes, the transport's control messages %d",
			ErrMalformed, goodbyeFixed+GoodbyeEntryBytes, room)
	}
	var parts []*Goodbye
	for len(ended) > per {
		parts = append(parts, &Goodbye{Ended: ended[:per:per]})
		ended = ended[per:]
	}
	parts = append(parts, &Goodbye{Flags: GoodbyeLast, Ended: ended})
	return parts, nil
}
