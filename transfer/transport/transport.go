// SPDX-License-Identifier: Apache-2.0

package transport

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/kvxfer/kvxfer/transfer/internal/peernames"
)

// RequestID names one request across the prefill and decode workers. The serving stack
// chooses it (it travels in ContextParams) and both sides use the same value.
type RequestID uint64

// Peer is a transport's name for a remote engine: an address or peer id that the Transport
// understands. The engine only compares peers and passes them back to the transport.
type Peer string

// Short is a short, stable name for p in logs and messages: "peer-" and the first 12 hex
// digits of SHA-256 of p, the same in every process that names the same peer (a UCX worker
// address is some 200 hex digits), after the peer's discovery name once this process found
// it through a registry ("prefill-0/peer-1a2b3c4d5e6f"). A peer id already shorter than the
// hash is itself.
func (p Peer) Short() string {
	if len(p) <= 17 {
		return string(p)
	}
	sum := sha256.Sum256([]byte(p))
	h := "peer-" + hex.EncodeToString(sum[:6])
	if name, ok := peernames.Name(string(p)); ok {
		return name + "/" + h
	}
	return h
}

// Tag names one data chunk on the wire. A receive matches a send only when the peer and all
// four fields are equal. The sub-transfer index keeps the chunks of a multi-peer request
// apart, and the nonce (the receiver's random number for the transfer, which the engine's wire format
// carries) keeps apart two transfers that reuse a request id. A transport with narrow tags
// (UCX has 64 bits) may pack Seq with a hash of the rest, as long as two live transfers never
// collide: it implements TagReserver, so the engine can draw another nonce on a collision.
type Tag struct {
	Request RequestID
	Sub     uint16
	Seq     uint32
	Nonce   uint64
}

// TagReserver is implemented by a transport whose data tags can collide (a hash of the
// transfer in a narrow tag). A receiving transfer reserves its tags before it posts anything:
// ReserveTags fails with an error matching ErrTagCollision when another live or draining
// transfer's tags would match the same messages, and the engine then draws another nonce. The
// returned release gives the tags back; the engine calls it once, when no operation of the
// transfer can match any more (never, for a transfer quarantined for good). It never blocks.
type TagReserver interface {
	ReserveTags(from Peer, tag Tag) (release func(), err error)
}

// Memory says whether a finished operation's buffer is quiescent: whether the transport can
// still read or write it.
type Memory int

// The quiescence verdicts a completion carries.
const (
	// MemoryDone: the transport will never touch the buffer again. The engine may release
	// its slot. Every successful completion says this.
	MemoryDone Memory = iota
	// MemoryBusy: the operation failed or was cancelled for the engine's purposes, but the
	// transport still holds the buffer (a send on the wire that cannot be stopped until the
	// endpoint is force-closed). The same operation will report again, later, exactly once,
	// with MemoryDone or MemoryUnknown.
	MemoryBusy
	// MemoryUnknown: the transport cannot say whether it will touch the buffer again (lost
	// track after a force close, say). The engine poisons the slot: unknown quiescence means
	// poison, never release (L9). This is a final report.
	MemoryUnknown
)

// String names the verdict.
func (m Memory) String() string {
	switch m {
	case MemoryDone:
		return "done"
	case MemoryBusy:
		return "busy"
	case MemoryUnknown:
		return "unknown"
	}
	return "memory(?)"
}

// Completion reports the end of a posted send or receive.
type Completion struct {
	// Err is nil on success. Otherwise it says why (wrapping ErrCancelled, ErrPeerLost,
	// ErrClosed or a transport error).
	Err error
	// Bytes is how many bytes landed in the buffer (receive) or left it (send).
	Bytes int
	// Memory is the quiescence verdict for the buffer.
	Memory Memory
}

// DataHeaderBytes is the size of the header that starts every data chunk the engine sends
// from a staging slot; the payload follows it in the same slot. A transport that moves the
// two apart (the UCX device transport sends the header from host memory and the payload
// from the GPU) splits a chunk here. The engine's wire format defines the header; a test of
// package transfer holds the two equal.
const DataHeaderBytes = 48

// Kind is the type byte of an engine message, at byte 3 of its header (the engine's wire
// format names the values). A transport never needs it to deliver; the in-memory one reads
// it so that a fault function can pick messages by kind.
type Kind uint8

// KindData is the kind of a data chunk: what every PostSend, PostRecv and PostGet moves.
const KindData Kind = 2

// OpID names a posted operation for Cancel. Transports choose the values; zero is never used.
type OpID uint64

// Inbound receives what arrives without a posted receive: control messages and peer failures.
// The engine implements it; a transport calls it from its own goroutine, never from inside a Transport method the engine is calling. Its methods do not block.
type Inbound interface {
	// OnControl delivers one control message from a peer. msg is valid only during the call.
	OnControl(from Peer, msg []byte)
	// OnPeerLost reports that the peer is unreachable; operations with it will fail.
	OnPeerLost(peer Peer, err error)
}

// TransportHealth is implemented by a transport that can tell on its own that it cannot
// deliver (the UCX transport's receive probe). The engine's Health reports its error. It never blocks.
type TransportHealth interface {
	TransportHealth() error
}

// ControlBound is implemented by a transport whose control messages are bounded.
// ControlRoom is the most bytes of one message SendControl takes now (it may change when
// the transport's own address does); the engine sizes messages that can grow with a request,
// such as an RMA offer's parts, to fit. It never blocks.
type ControlBound interface {
	ControlRoom() int
}

// Transport moves bytes between engines. It is small and asynchronous: every method returns
// without waiting on the network, and results come back through callbacks.
//
// Callback rules, which every implementation keeps:
//   - each posted operation (PostSend, PostRecv that returned a nil error) gets completion
//     callbacks until exactly one with Memory == MemoryDone or MemoryUnknown; before it there
//     may be MemoryBusy reports. An operation whose Post returned an error gets none, and its
//     buffer was never touched.
//   - callbacks run on a goroutine the transport owns, never inside the Post, Cancel or
//     SendControl call that caused them, so the engine may hold its own locks
//     around those calls. Callbacks must not block, and the engine's do not: they queue.
//   - Close(force=true) makes every outstanding operation report, within its bounded time,
//     with MemoryDone (provably stopped) or MemoryUnknown.
//
// A transport progresses its operations on its own goroutines: the engine never lends it
// one. Nothing in a Transport may wait without a bound: Close honours its own timeout.
type Transport interface {
	// Bind hands the transport the engine's Inbound. The engine calls it once, from New,
	// before any other method.
	Bind(in Inbound) error
	// SendControl sends a small control message. The transport copies msg before returning;
	// delivery is best-effort (the protocol retries what matters).
	SendControl(to Peer, msg []byte) error
	// PostSend sends buf as the message tagged tag. The transport may read buf until the
	// operation's final completion.
	PostSend(to Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error)
	// PostRecv receives the message tagged tag from peer into buf. The transport may write
	// buf until the operation's final completion. A message longer than buf fails the receive.
	PostRecv(from Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error)
	// Cancel asks the transport to stop op. It never blocks; the outcome comes through op's
	// completions (an unmatched receive typically reports ErrCancelled with MemoryDone; a send
	// already on the wire may report MemoryBusy first). Cancelling a finished op does nothing.
	Cancel(op OpID)
	// Close stops the transport. With force, operations in flight are torn down (UCX closes
	// its endpoints with UCP_EP_CLOSE_FLAG_FORCE) and report as described above. After Close
	// every method returns ErrClosed.
	Close(force bool) error
}
