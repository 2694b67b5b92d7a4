// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"encoding/binary"
	"fmt"

	"github.com/kvxfer/kvxfer/cuda/layout"
)

// The wire protocol, shared by every Transport: the engine encodes these messages and the
// transport carries the bytes (control messages through SendControl, data chunks as tagged
// sends into the receiver's staging slot). All integers are little-endian; every message
// starts with the same 16-byte header:
//
//	magic u16 = 0x4b58 ("KX") | version u8 = 1 | kind u8 | sub u16 | reserved u16 = 0 | request u64
//
// and each kind has a fixed body after it (a data chunk is followed by its payload, an abort by
// its reason text). Decoding checks every field, so bytes from a confused or hostile peer give
// a *DecodeError, never a panic or a half-filled message.

const (
	wireMagic   = 0x4b58
	wireVersion = 1
	// HeaderBytes is the size of the common header.
	HeaderBytes = 16
	// DataHeaderBytes is the size of a data chunk's header; the payload follows it in the
	// same slot, so a slot carries SlotBytes-DataHeaderBytes bytes of KV per chunk.
	DataHeaderBytes = HeaderBytes + 24
	// MaxAbortReason bounds an abort's reason text.
	MaxAbortReason = 256

	requestInfoBytes = HeaderBytes + 7*8 + 8 + 8
	doneBytes        = HeaderBytes + 8
	abortFixedBytes  = HeaderBytes + 4
	abortAckBytes    = HeaderBytes
)

// Kind is a wire message's type.
type Kind uint8

// The message kinds.
const (
	// KindRequestInfo: receiver to sender: "send me request R's stream for sub-transfer S,
	// in chunks of this size; this is the shape I expect".
	KindRequestInfo Kind = 1
	// KindData: sender to receiver: one chunk of the stream.
	KindData Kind = 2
	// KindDone: receiver to sender: every byte arrived.
	KindDone Kind = 3
	// KindAbort: either way: stop, with a code and a reason.
	KindAbort Kind = 4
	// KindAbortAck: answer to an abort: the aborted side has stopped touching the stream.
	KindAbortAck Kind = 5
)

// Message is any decoded wire message.
type Message interface {
	// Head returns the common header fields.
	Head() Header
	// AppendBinary appends the encoding to b.
	AppendBinary(b []byte) ([]byte, error)
}

// Header holds the fields every message carries.
type Header struct {
	Kind    Kind
	Sub     uint16
	Request RequestID
}

// RequestInfo asks the sender to start streaming.
type RequestInfo struct {
	Header
	Shape      layout.Shape
	ChunkBytes int64 // payload bytes per chunk, a multiple of Shape.ElemSize
	Depth      int64 // receives the receiver keeps posted (informational)
}

// DataHeader precedes one chunk's payload.
type DataHeader struct {
	Header
	Seq    uint32
	Offset int64 // stream offset of the payload
	Length int64 // payload bytes
}

// Done confirms that every byte arrived.
type Done struct {
	Header
	Bytes int64
}

// AbortCode says why a transfer was aborted.
type AbortCode uint16

// The abort codes.
const (
	AbortCancelled    AbortCode = 1
	AbortDeadline     AbortCode = 2
	AbortIncompatible AbortCode = 3
	AbortProtocol     AbortCode = 4
	AbortInternal     AbortCode = 5
	AbortClosed       AbortCode = 6
	maxAbortCode                = AbortClosed
)

// Abort stops a transfer.
type Abort struct {
	Header
	Code   AbortCode
	Reason string
}

// AbortAck answers an Abort.
type AbortAck struct {
	Header
}

// Head returns h; it lets every message type satisfy Message by embedding.
func (h Header) Head() Header { return h }

func (h Header) append(b []byte, k Kind) []byte {
	b = binary.LittleEndian.AppendUint16(b, wireMagic)
	b = append(b, wireVersion, byte(k))
	b = binary.LittleEndian.AppendUint16(b, h.Sub)
	b = binary.LittleEndian.AppendUint16(b, 0)
	return binary.LittleEndian.AppendUint64(b, uint64(h.Request))
}

// AppendBinary implements Message.
func (m *RequestInfo) AppendBinary(b []byte) ([]byte, error) {
	b = m.Header.append(b, KindRequestInfo)
	s := m.Shape
	for _, v := range []int64{s.Layers, s.KVFactor, s.Blocks, s.Heads, s.TokensPerBlock, s.HeadDim, s.ElemSize, m.ChunkBytes, m.Depth} {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	return b, nil
}

// AppendBinary implements Message. It appends the header only; the payload follows it.
func (m *DataHeader) AppendBinary(b []byte) ([]byte, error) {
	b = m.Header.append(b, KindData)
	b = binary.LittleEndian.AppendUint32(b, m.Seq)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.Offset))
	return binary.LittleEndian.AppendUint64(b, uint64(m.Length)), nil
}

// AppendBinary implements Message.
func (m *Done) AppendBinary(b []byte) ([]byte, error) {
	b = m.Header.append(b, KindDone)
	return binary.LittleEndian.AppendUint64(b, uint64(m.Bytes)), nil
}

// AppendBinary implements Message. A reason longer than MaxAbortReason is cut.
func (m *Abort) AppendBinary(b []byte) ([]byte, error) {
	r := m.Reason
	if len(r) > MaxAbortReason {
		r = r[:MaxAbortReason]
	}
	b = m.Header.append(b, KindAbort)
	b = binary.LittleEndian.AppendUint16(b, uint16(m.Code))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r)))
	return append(b, r...), nil
}

// AppendBinary implements Message.
func (m *AbortAck) AppendBinary(b []byte) ([]byte, error) {
	return m.Header.append(b, KindAbortAck), nil
}

func malformed(off int, format string, args ...any) error {
	return &DecodeError{Offset: off, Reason: fmt.Sprintf(format, args...)}
}

func decodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderBytes {
		return Header{}, malformed(len(b), "%d bytes, shorter than the %d-byte header", len(b), HeaderBytes)
	}
	if m := binary.LittleEndian.Uint16(b); m != wireMagic {
		return Header{}, malformed(0, "magic %#04x, want %#04x", m, wireMagic)
	}
	if b[2] != wireVersion {
		return Header{}, malformed(2, "version %d, this build speaks %d", b[2], wireVersion)
	}
	k := Kind(b[3])
	if k < KindRequestInfo || k > KindAbortAck {
		return Header{}, malformed(3, "unknown kind %d", k)
	}
	if r := binary.LittleEndian.Uint16(b[6:]); r != 0 {
		return Header{}, malformed(6, "reserved field is %d, must be 0", r)
	}
	return Header{Kind: k, Sub: binary.LittleEndian.Uint16(b[4:]), Request: RequestID(binary.LittleEndian.Uint64(b[8:]))}, nil
}

// Decode parses one control message (request-info, done, abort, abort-ack). A data chunk
// decodes with DecodeData. Any other input returns a *DecodeError matching ErrMalformed.
func Decode(b []byte) (Message, error) {
	h, err := decodeHeader(b)
	if err != nil {
		return nil, err
	}
	exact := func(n int) error {
		if len(b) != n {
			return malformed(min(len(b), n), "%d bytes, a %d-kind message has %d", len(b), h.Kind, n)
		}
		return nil
	}
	u64 := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[HeaderBytes+8*i:])) }
	switch h.Kind {
	case KindRequestInfo:
		if err := exact(requestInfoBytes); err != nil {
			return nil, err
		}
		m := &RequestInfo{Header: h, Shape: layout.Shape{Layers: u64(0), KVFactor: u64(1), Blocks: u64(2),
			Heads: u64(3), TokensPerBlock: u64(4), HeadDim: u64(5), ElemSize: u64(6)}, ChunkBytes: u64(7), Depth: u64(8)}
		for i, v := range []int64{m.Shape.Layers, m.Shape.KVFactor, m.Shape.Blocks, m.Shape.Heads,
			m.Shape.TokensPerBlock, m.Shape.HeadDim, m.Shape.ElemSize, m.ChunkBytes, m.Depth} {
			if v <= 0 || v > 1<<40 {
				return nil, malformed(HeaderBytes+8*i, "field %d is %d, must be in [1, 2^40]", i, v)
			}
		}
		if m.ChunkBytes%m.Shape.ElemSize != 0 {
			return nil, malformed(HeaderBytes+56, "chunk of %d bytes is not a whole number of %d-byte elements", m.ChunkBytes, m.Shape.ElemSize)
		}
		return m, nil
	case KindDone:
		if err := exact(doneBytes); err != nil {
			return nil, err
		}
		if v := u64(0); v < 0 {
			return nil, malformed(HeaderBytes, "negative byte count %d", v)
		}
		return &Done{Header: h, Bytes: u64(0)}, nil
	case KindAbort:
		if len(b) < abortFixedBytes {
			return nil, malformed(len(b), "abort of %d bytes, shorter than %d", len(b), abortFixedBytes)
		}
		code := AbortCode(binary.LittleEndian.Uint16(b[HeaderBytes:]))
		n := int(binary.LittleEndian.Uint16(b[HeaderBytes+2:]))
		if code == 0 || code > maxAbortCode {
			return nil, malformed(HeaderBytes, "unknown abort code %d", code)
		}
		if n > MaxAbortReason || len(b) != abortFixedBytes+n {
			return nil, malformed(HeaderBytes+2, "reason of %d bytes in a %d-byte message", n, len(b))
		}
		return &Abort{Header: h, Code: code, Reason: string(b[abortFixedBytes:])}, nil
	case KindAbortAck:
		if err := exact(abortAckBytes); err != nil {
			return nil, err
		}
		return &AbortAck{Header: h}, nil
	}
	return nil, malformed(3, "kind %d is not a control message", h.Kind)
}

// DecodeData parses a data chunk: its header and the payload after it. The payload aliases b.
func DecodeData(b []byte) (DataHeader, []byte, error) {
	h, err := decodeHeader(b)
	if err != nil {
		return DataHeader{}, nil, err
	}
	if h.Kind != KindData {
		return DataHeader{}, nil, malformed(3, "kind %d where a data chunk was expected", h.Kind)
	}
	if len(b) < DataHeaderBytes {
		return DataHeader{}, nil, malformed(len(b), "data chunk of %d bytes, shorter than its %d-byte header", len(b), DataHeaderBytes)
	}
	if r := binary.LittleEndian.Uint32(b[HeaderBytes+4:]); r != 0 {
		return DataHeader{}, nil, malformed(HeaderBytes+4, "reserved field is %d, must be 0", r)
	}
	d := DataHeader{Header: h, Seq: binary.LittleEndian.Uint32(b[HeaderBytes:]),
		Offset: int64(binary.LittleEndian.Uint64(b[HeaderBytes+8:])), Length: int64(binary.LittleEndian.Uint64(b[HeaderBytes+16:]))}
	payload := b[DataHeaderBytes:]
	if d.Offset < 0 {
		return DataHeader{}, nil, malformed(HeaderBytes+8, "negative offset %d", d.Offset)
	}
	if d.Length != int64(len(payload)) {
		return DataHeader{}, nil, malformed(HeaderBytes+16, "length says %d, payload has %d bytes", d.Length, len(payload))
	}
	return d, payload, nil
}

// encode appends m's encoding to a fresh buffer; the encoders cannot fail on valid messages.
func encode(m Message) []byte {
	b, _ := m.AppendBinary(make([]byte, 0, 64))
	return b
}
