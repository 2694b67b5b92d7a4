// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strings"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The wire protocol, shared by every Transport: the engine encodes these messages and the
// transport carries the bytes (control messages through SendControl, data chunks as tagged
// sends into the receiver's staging slot). All integers are little-endian; every message
// starts with the same 24-byte header:
//
//	magic u16 = 0x4b58 ("KX") | version u8 (3, or 4: below) | kind u8 | sub u16 | reserved u16 = 0 | request u64 | nonce u64
//
// and each kind has a fixed body after it (a data chunk is followed by its payload, an abort by
// its reason text). Decoding checks every field, so bytes from a confused or hostile peer give
// a *DecodeError, never a panic or a half-filled message.
//
// The nonce tells apart two transfers that share a request id and sub-transfer (the serving
// stack may reuse ids): the receiver draws a random, non-zero nonce for each sub-transfer,
// sends it in its request-info, and both sides stamp it on every later message of that
// transfer and on every data tag (transport.Tag.Nonce). A message whose nonce is not the transfer's is
// dropped, so a late message of an old transfer is never taken for a new one.
//
// Version 3 adds the hello (KindHello), by which two engines tell each other, when they first
// meet, which wire versions and features they speak (package transfer's negotiate.go; docs/ucx.md, "Versions and
// features"). Its layout is the same in every version from 3 on, so an engine reads the hello
// of a newer one and the pair speaks the highest version both know. Versions 1 and 2 had no
// hello: an engine of this version refuses their messages as malformed, and they refuse ours.
//
// Version 4 binds a hello to the worker that owns its sender address, which a hello alone
// cannot prove (the address is whatever the sender wrote): the engine that gets a hello answers
// it as before and sends a challenge (KindHelloChallenge, 16 random bytes) to the address the
// hello named; the peer's features count only from a proof (KindHelloProof) that echoes it and
// restates the peer's versions and features (docs/protocol.md, "The hello handshake"). Version 4
// changes no layout of version 3, so every message is stamped with the first version that has
// its layout: 3 for the kinds of version 3 (a wire-3 peer reads them), 4 for the challenge and
// the proof (which go only to a peer whose hello says 4), and the hello with its sender's
// highest. With cluster keys, a hello, challenge or proof is followed by a seal, its MAC
// (seal.go). Version 4 also adds the goodbye (KindGoodbye, goodbye.go), sent only to a peer
// whose hello says it takes it. docs/ucx.md says how UCX tags carry the nonce.

const (
	wireMagic = 0x4b58
	// Version is the highest wire version this build speaks, MinVersion the lowest.
	Version    = 4
	MinVersion = 3
	// helloVersion is the first version with a hello; a hello of it or any later version has
	// the same layout. Every kind of version 3 keeps its layout in version 4 and is stamped 3.
	helloVersion = 3
	// ProofVersion is the first version with the hello challenge and proof, which a message of
	// those kinds is stamped with.
	ProofVersion = 4
	// HeaderBytes is the size of the common header.
	HeaderBytes = 24
	// DataHeaderBytes is the size of a data chunk's header; the payload follows it in the
	// same slot, so a slot carries SlotBytes-DataHeaderBytes bytes of KV per chunk.
	DataHeaderBytes = HeaderBytes + 24
	// MaxAbortReason bounds an abort's reason text.
	MaxAbortReason = 256

	RequestInfoBytes = HeaderBytes + 7*8 + 8 + 8
	requestExtBytes  = 8 // flags u32, held count u32; the positions follow
	doneBytes        = HeaderBytes + 8
	abortFixedBytes  = HeaderBytes + 4
	abortAckBytes    = HeaderBytes
	// HelloBytes is the size of a hello, in every version from 3 on.
	HelloBytes = HeaderBytes + 16
	// ChallengeBytes is the size of a hello challenge's random bytes.
	ChallengeBytes = 16
	// HelloChallengeBytes and HelloProofBytes are the sizes of a challenge and a proof.
	HelloChallengeBytes = HeaderBytes + ChallengeBytes
	HelloProofBytes     = HeaderBytes + ChallengeBytes + 16
)

// Kind is a wire message's type (transport.Kind: transports see it too).
type Kind = transport.Kind

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
	// KindRMAOffer: sender to receiver, answering a request with FlagRMA: where the sender's
	// pool is and how its blocks lie in it, so the receiver can read them with RMA gets; or
	// a decline, after which the sender sends direct chunks as usual (see rma.go).
	KindRMAOffer Kind = 6
	// KindRMARelease: receiver to sender: the receiver will not read the offered pool again
	// for this request (it stopped without completing; Done says the same on success).
	KindRMARelease Kind = 7
	// KindHello: either way, once per pair of engines: the wire versions and features the
	// sender speaks. A hello that is not a reply is answered with one.
	KindHello Kind = 8
	// KindSlots, KindSlotReady, KindSlotTaken: the staging path's pull wire (pull.go).
	KindSlots     Kind = 9
	KindSlotReady Kind = 10
	KindSlotTaken Kind = 11
	// KindHelloChallenge: either way, from version 4, to the address a hello named: prove that
	// hello by echoing these bytes.
	KindHelloChallenge Kind = 12
	// KindHelloProof: the answer to a challenge: its bytes and the sender's versions and
	// features, which the challenger takes from this message only.
	KindHelloProof Kind = 13
	// KindGoodbye (wire 4, FeatureGoodbye): a departing engine's list of the transfers it
	// ended with their operations quiescent (goodbye.go).
	KindGoodbye Kind = 14
	maxKind          = KindGoodbye
)

// Message is any decoded wire message.
type Message interface {
	// Head returns the common header fields.
	Head() Header
	// AppendBinary appends the encoding to b.
	AppendBinary(b []byte) ([]byte, error)
}

// Hello tells a peer which wire versions and features an engine speaks. Its body is
//
//	min version u8 | max version u8 | flags u16 | reserved u32 = 0 | features u64
//
// (then a seal, with cluster keys) and its header carries version Max, request 0, sub 0 and
// nonce 0. Features this build does not know (a newer peer's) are kept, not refused: they are
// features this engine lacks.
type Hello struct {
	Header
	// Min and Max bound the wire versions the sender speaks.
	Min, Max uint8
	// Reply: this hello answers one (and is not answered in turn).
	Reply bool
	// Features are what the sender speaks beyond the staging path every version has.
	Features Feature
	// Seal signs the hello under a cluster key (seal.go); a wire-3 peer never sends one.
	Seal Seal
}

// Feature is one part of the wire protocol that a peer may lack. A hello carries a set of
// them; the staging path (request-info, data chunks, done, abort) is in every version and is
// not one.
type Feature uint64

// The features. Their bits are fixed for every wire version; a later version adds new ones.
const (
	// FeatureStreaming: layer-aligned chunks (FlagLayerCut), which a streaming Receive asks for.
	FeatureStreaming Feature = 1 << 0
	// FeaturePartial: a request naming the blocks its receiver already holds.
	FeaturePartial Feature = 1 << 1
	// FeatureDirect: the one-copy path (FlagDirect).
	FeatureDirect Feature = 1 << 2
	// FeatureRMA: the direct path's RMA mode (FlagRMA, KindRMAOffer, KindRMARelease).
	FeatureRMA Feature = 1 << 3
	// FeatureMultiPart: more than one control message of blocks for one request (an RMA
	// offer in parts, RMAOfferPart).
	FeatureMultiPart Feature = 1 << 4
	// FeatureLargeSegments: the engine's transport receives the pieces a transport that says
	// so sends above the usual size (UCX's TCP segments of up to 1 MiB, where UCX's default
	// receive buffer takes 64 KiB).
	FeatureLargeSegments Feature = 1 << 5
	// FeatureSlotPull: the staging path's pull wire (FlagPull, KindSlots, KindSlotReady,
	// KindSlotTaken; pull.go).
	FeatureSlotPull Feature = 1 << 6
	// FeatureGoodbye: the goodbye (wire 4, KindGoodbye; goodbye.go). An engine sends one only
	// to a peer whose hello says it takes it, and whose pair speaks wire 4.
	FeatureGoodbye Feature = 1 << 7
	// FeatureClaimProof: a request's claim (FlagClaim: the receiver's incarnation and its
	// proof of the request's secret) and the abort codes AbortUnauthenticated and
	// AbortClaimed.
	FeatureClaimProof Feature = 1 << 8

	// KnownFeatures are the features this build speaks.
	KnownFeatures = FeatureStreaming | FeaturePartial | FeatureDirect | FeatureRMA | FeatureMultiPart | FeatureLargeSegments | FeatureSlotPull |
		FeatureGoodbye | FeatureClaimProof
)

var featureNames = []string{"streaming", "partial", "direct", "rma", "multi-part", "large-segments", "slot-pull", "goodbye", "claim-proof"}

// String names the features, joined with "+"; a bit this build does not know is named by its
// number.
func (f Feature) String() string {
	if f == 0 {
		return "none"
	}
	var names []string
	for f != 0 {
		i := bits.TrailingZeros64(uint64(f))
		if i < len(featureNames) {
			names = append(names, featureNames[i])
		} else {
			names = append(names, fmt.Sprintf("feature%d", i))
		}
		f &^= 1 << i
	}
	return strings.Join(names, "+")
}

// Header holds the fields every message carries.
type Header struct {
	Kind    Kind
	Sub     uint16
	Request transport.RequestID
	// Nonce is the receiver's random number for this transfer (never 0 in a message an
	// engine sends): the request id's generation.
	Nonce uint64
}

// RequestInfo asks the sender to start streaming.
//
// Its body is 72 bytes (shape, chunk size, depth). A receiver that needs layer-aligned chunks
// or moves only part of the request appends an extension: flags u32 | block count u32 | a
// bitmap of that many bits, one per position of the request's block list, set where the
// receiver already holds the block (a bitmap keeps a 128k-token request's message near 1 KiB).
// A request with neither is encoded without the extension, so an engine that predates it
// still decodes every request a plain transfer sends.
type RequestInfo struct {
	Header
	Shape      kvplan.Shape // the stream the receiver expects, held blocks already dropped
	ChunkBytes int64        // payload bytes per chunk, a multiple of Shape.ElemSize
	Depth      int64        // receives the receiver keeps posted (informational)
	Flags      RequestFlags
	// Held lists, in ascending order, the positions of the request's block list that the
	// receiver already holds; the sender drops them from its plan
	// (kvplan.WithoutPositions) before comparing shapes. HeldOf is the length of that
	// full block list (0 when Held is empty), so the sender can check it names the same
	// request.
	Held   []int
	HeldOf int
	// Claim, with FlagClaim: the receiver's proof that it holds the request's secret
	// (ClaimProof), after the held-block bitmap.
	Claim Claim
}

// Claim is a request's proof of its secret: the receiver's incarnation (one life of its
// engine) and ClaimProof over this request, sub-transfer, nonce and incarnation.
type Claim struct {
	Incarnation uint64
	Proof       [ClaimProofBytes]byte
}

// Sizes of a claim.
const (
	ClaimProofBytes = 16
	claimBytes      = 8 + ClaimProofBytes
	claimLabel      = "kvxfer claim"
)

// RequestFlags are options of a request-info message.
type RequestFlags uint32

// The request flags.
const (
	// FlagLayerCut: chunks end at every layer boundary as well as every ChunkBytes, so a
	// streaming sender can send each layer as soon as it is ready.
	FlagLayerCut RequestFlags = 1 << 0
	// FlagDirect: the one-copy path. The receiver has posted its receives straight into its
	// own pool (Transport.Direct said it may), so each chunk is ChunkBytes of bare stream
	// bytes, without a data header, and no slot bounds ChunkBytes. The sender sends straight
	// from its pool too, or refuses with AbortIncompatible. An engine that predates the flag
	// refuses it as unknown, which fails the request instead of misreading its chunks.
	FlagDirect RequestFlags = 1 << 1
	// FlagRMA, with FlagDirect: the receiver can read the sender's pool with RMA gets
	// (RMATransport) and posts nothing until the sender answers with a KindRMAOffer: the
	// offer, or a decline, after which the direct path runs as without the flag. A later
	// request without FlagRMA from the same receiver declines an offer it cannot use.
	FlagRMA RequestFlags = 1 << 2
	// FlagPull, without FlagDirect: the receiver can read the sender's staging slots with RMA
	// gets and posts nothing until the sender answers with a KindSlots message: its slots'
	// key, after which each chunk is announced (KindSlotReady) instead of sent, or a decline,
	// after which the chunks come as tagged messages as without the flag (pull.go).
	FlagPull RequestFlags = 1 << 3
	// FlagClaim: the request carries a Claim after its bitmap; sent only to a sender whose
	// proven hello has FeatureClaimProof.
	FlagClaim RequestFlags = 1 << 4
	// FlagOneHop, with FlagDirect and FlagRMA: the receiver reads the pool the request's
	// params exposed (their Exposure section) and has posted its gets already: the sender
	// sends no offer and keeps the exposure it made for the params until Done or a release
	// (docs/protocol.md, "One-hop reads"). Only a sender that made such params sees it.
	FlagOneHop RequestFlags = 1 << 5
	knownFlags              = FlagLayerCut | FlagDirect | FlagRMA | FlagPull | FlagClaim | FlagOneHop
)

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
	// AbortUnauthenticated: the request's claim did not prove the request's secret; sent only
	// to a peer with FeatureClaimProof (an older one gets AbortIncompatible).
	AbortUnauthenticated AbortCode = 7
	// AbortClaimed: the request claimed an exposure (a Send that named no receiver) that
	// another receiver had claimed first; sent only to a peer with FeatureClaimProof.
	AbortClaimed AbortCode = 8
	maxAbortCode           = AbortClaimed
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
	b = append(b, kindVersion(k), byte(k))
	b = binary.LittleEndian.AppendUint16(b, h.Sub)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Request))
	return binary.LittleEndian.AppendUint64(b, h.Nonce)
}

// AppendBinary implements Message.
func (m *RequestInfo) AppendBinary(b []byte) ([]byte, error) {
	b = m.Header.append(b, KindRequestInfo)
	s := m.Shape
	for _, v := range []int64{s.Layers, s.KVFactor, s.Blocks, s.Heads, s.TokensPerBlock, s.HeadDim, s.ElemSize, m.ChunkBytes, m.Depth} {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	if m.Flags == 0 && len(m.Held) == 0 {
		return b, nil
	}
	if m.HeldOf < 0 || m.HeldOf > MaxBlocks || (len(m.Held) > 0) != (m.HeldOf > 0) {
		return nil, fmt.Errorf("held positions of a %d-block request: at most %d blocks, and positions only with a count", m.HeldOf, MaxBlocks)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Flags))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.HeldOf))
	at := len(b)
	b = append(b, make([]byte, (m.HeldOf+7)/8)...)
	prev := -1
	for _, p := range m.Held {
		if p <= prev || p >= m.HeldOf {
			return nil, fmt.Errorf("held position %d: positions must rise and lie in [0, %d)", p, m.HeldOf)
		}
		b[at+p/8] |= 1 << (p % 8)
		prev = p
	}
	if m.Flags&FlagClaim != 0 {
		b = binary.LittleEndian.AppendUint64(b, m.Claim.Incarnation)
		b = append(b, m.Claim.Proof[:]...)
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

// AppendBinary implements Message. The header is stamped with the highest version the sender
// speaks.
func (m *Hello) AppendBinary(b []byte) ([]byte, error) {
	if m.Min < 1 || m.Min > m.Max || m.Max < helloVersion {
		return nil, fmt.Errorf("hello of versions %d to %d: want 1 <= min <= max, max at least %d", m.Min, m.Max, helloVersion)
	}
	if m.Sub != 0 || m.Request != 0 || m.Nonce != 0 {
		return nil, fmt.Errorf("a hello names no request")
	}
	at := len(b)
	b = m.Header.append(b, KindHello)
	b[at+2] = m.Max
	var flags uint16
	if m.Reply {
		flags = helloReply
	}
	b = append(b, m.Min, m.Max)
	b = binary.LittleEndian.AppendUint16(b, flags)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.Features))
	return m.Seal.append(b), nil
}

const helloReply = 1 << 0

// kindVersion is the version a message of kind k is stamped with: the first whose layout it
// has (a hello overwrites it with its sender's highest).
func kindVersion(k Kind) uint8 {
	if k == KindHelloChallenge || k == KindHelloProof || k == KindGoodbye {
		return ProofVersion
	}
	return helloVersion
}

// HelloChallenge asks the engine at the address a hello named to prove that hello. Its body is
// the challenge's random bytes; its header carries version 4, request 0, sub 0 and nonce 0.
type HelloChallenge struct {
	Header
	Challenge [ChallengeBytes]byte
	// Seal signs the challenge under a cluster key (seal.go).
	Seal Seal
}

// HelloProof answers a HelloChallenge. Its body is
//
//	echo [16] | min version u8 | max version u8 | flags u16 = 0 | reserved u32 = 0 | features u64
//
// (the challenge's bytes, then a hello's body); its header carries version 4, request 0, sub 0
// and nonce 0. Max is at least 4: only an engine of version 4 or later proves.
type HelloProof struct {
	Header
	Echo [ChallengeBytes]byte
	// Min, Max and Features are the sender's speech, as in its Hello.
	Min, Max uint8
	Features Feature
	// Seal signs the proof under a cluster key (seal.go).
	Seal Seal
}

// AppendBinary implements Message.
func (m *HelloChallenge) AppendBinary(b []byte) ([]byte, error) {
	if m.Sub != 0 || m.Request != 0 || m.Nonce != 0 {
		return nil, fmt.Errorf("a hello challenge names no request")
	}
	b = m.Header.append(b, KindHelloChallenge)
	return m.Seal.append(append(b, m.Challenge[:]...)), nil
}

// AppendBinary implements Message.
func (m *HelloProof) AppendBinary(b []byte) ([]byte, error) {
	if m.Min < 1 || m.Min > m.Max || m.Max < ProofVersion {
		return nil, fmt.Errorf("hello proof of versions %d to %d: want 1 <= min <= max, max at least %d", m.Min, m.Max, ProofVersion)
	}
	if m.Sub != 0 || m.Request != 0 || m.Nonce != 0 {
		return nil, fmt.Errorf("a hello proof names no request")
	}
	b = m.Header.append(b, KindHelloProof)
	b = append(b, m.Echo[:]...)
	b = append(b, m.Min, m.Max)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.Features))
	return m.Seal.append(b), nil
}

// decodeHelloChallenge and decodeHelloProof parse the two kinds of version 4.
func decodeHelloChallenge(h Header, b []byte) (*HelloChallenge, error) {
	seal, b, err := openSeal(b, HelloChallengeBytes, "hello challenge")
	if err != nil {
		return nil, err
	}
	if h.Sub != 0 || h.Request != 0 || h.Nonce != 0 {
		return nil, malformed(4, "a hello challenge names no request, sub-transfer or nonce")
	}
	m := &HelloChallenge{Header: h, Seal: seal}
	copy(m.Challenge[:], b[HeaderBytes:])
	return m, nil
}

func decodeHelloProof(h Header, b []byte) (*HelloProof, error) {
	seal, b, err := openSeal(b, HelloProofBytes, "hello proof")
	if err != nil {
		return nil, err
	}
	if h.Sub != 0 || h.Request != 0 || h.Nonce != 0 {
		return nil, malformed(4, "a hello proof names no request, sub-transfer or nonce")
	}
	at := HeaderBytes + ChallengeBytes
	m := &HelloProof{Header: h, Min: b[at], Max: b[at+1], Features: Feature(binary.LittleEndian.Uint64(b[at+8:])), Seal: seal}
	copy(m.Echo[:], b[HeaderBytes:])
	switch flags, r := binary.LittleEndian.Uint16(b[at+2:]), binary.LittleEndian.Uint32(b[at+4:]); {
	case m.Min < 1 || m.Min > m.Max || m.Max < ProofVersion:
		return nil, malformed(at, "versions %d to %d in a proof, which only an engine of version %d or later sends", m.Min, m.Max, ProofVersion)
	case flags != 0:
		return nil, malformed(at+2, "unknown hello proof flags %#x", flags)
	case r != 0:
		return nil, malformed(at+4, "reserved field is %d, must be 0", r)
	}
	return m, nil
}

func decodeHello(h Header, version uint8, b []byte) (*Hello, error) {
	seal, b, err := openSeal(b, HelloBytes, "hello")
	if err != nil {
		return nil, err
	}
	if h.Sub != 0 || h.Request != 0 || h.Nonce != 0 {
		return nil, malformed(4, "a hello names no request, sub-transfer or nonce")
	}
	m := &Hello{Header: h, Min: b[HeaderBytes], Max: b[HeaderBytes+1], Features: Feature(binary.LittleEndian.Uint64(b[HeaderBytes+8:])), Seal: seal}
	switch flags, r := binary.LittleEndian.Uint16(b[HeaderBytes+2:]), binary.LittleEndian.Uint32(b[HeaderBytes+4:]); {
	case m.Min < 1 || m.Min > m.Max:
		return nil, malformed(HeaderBytes, "versions %d to %d", m.Min, m.Max)
	case m.Max != version:
		return nil, malformed(2, "header says version %d, the hello's highest is %d", version, m.Max)
	case flags&^helloReply != 0:
		return nil, malformed(HeaderBytes+2, "unknown hello flags %#x", flags)
	case r != 0:
		return nil, malformed(HeaderBytes+4, "reserved field is %d, must be 0", r)
	default:
		m.Reply = flags&helloReply != 0
	}
	return m, nil
}

func malformed(off int, format string, args ...any) error {
	return &DecodeError{Offset: off, Reason: fmt.Sprintf(format, args...)}
}

func decodeHeader(b []byte) (Header, error) {
	h, _, err := decodeHeaderVersion(b)
	return h, err
}

// decodeHeaderVersion checks the common header and returns it with its version: one this
// build speaks, or, for a hello, any from helloVersion on.
func decodeHeaderVersion(b []byte) (Header, uint8, error) {
	if len(b) < HeaderBytes {
		return Header{}, 0, malformed(len(b), "%d bytes, shorter than the %d-byte header", len(b), HeaderBytes)
	}
	if m := binary.LittleEndian.Uint16(b); m != wireMagic {
		return Header{}, 0, malformed(0, "magic %#04x, want %#04x", m, wireMagic)
	}
	v, k := b[2], Kind(b[3])
	if k == KindHello && v < helloVersion || k != KindHello && (v < MinVersion || v > Version) {
		return Header{}, 0, malformed(2, "version %d, this build speaks %d to %d", v, MinVersion, Version)
	}
	if k != KindHello && v != kindVersion(k) { // one message, one encoding
		return Header{}, 0, malformed(2, "a kind-%d message of version %d: it is stamped %d", k, v, kindVersion(k))
	}
	if k < KindRequestInfo || k > maxKind {
		return Header{}, 0, malformed(3, "unknown kind %d", k)
	}
	if r := binary.LittleEndian.Uint16(b[6:]); r != 0 {
		return Header{}, 0, malformed(6, "reserved field is %d, must be 0", r)
	}
	return Header{Kind: k, Sub: binary.LittleEndian.Uint16(b[4:]), Request: transport.RequestID(binary.LittleEndian.Uint64(b[8:])),
		Nonce: binary.LittleEndian.Uint64(b[16:])}, v, nil
}

// Decode parses one control message (request-info, done, abort, abort-ack, rma offer, rma
// release, hello, hello challenge and proof, the pull wire's). A data chunk decodes with DecodeData. Any other input returns a
// *DecodeError matching ErrMalformed.
func Decode(b []byte) (Message, error) {
	h, v, err := decodeHeaderVersion(b)
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
		if len(b) != RequestInfoBytes && len(b) < RequestInfoBytes+requestExtBytes {
			return nil, malformed(len(b), "request-info of %d bytes: %d, or at least %d with the extension", len(b), RequestInfoBytes, RequestInfoBytes+requestExtBytes)
		}
		m := &RequestInfo{Header: h, Shape: kvplan.Shape{Layers: u64(0), KVFactor: u64(1), Blocks: u64(2),
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
		if len(b) > RequestInfoBytes {
			if err := decodeRequestExt(m, b); err != nil {
				return nil, err
			}
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
	case KindRMAOffer:
		return decodeRMAOffer(h, b)
	case KindRMARelease:
		if err := exact(abortAckBytes); err != nil {
			return nil, err
		}
		return &RMARelease{Header: h}, nil
	case KindHello:
		return decodeHello(h, v, b)
	case KindHelloChallenge:
		return decodeHelloChallenge(h, b)
	case KindHelloProof:
		return decodeHelloProof(h, b)
	case KindSlots, KindSlotReady, KindSlotTaken:
		return decodePull(h, b)
	case KindGoodbye:
		return decodeGoodbye(h, b)
	}
	return nil, malformed(3, "kind %d is not a control message", h.Kind)
}

// MaxBlocks bounds the block list of a partial transfer, so its bitmap stays under 128 KiB
// (a transport may bound control messages further: UCX's default is 4 KiB, about 32k blocks).
const MaxBlocks = 1 << 20

// What a ContextParams blob (package ucx; docs/protocol.md) carries, bounded here so that the
// engine, discovery and the tests agree with its encoder without package ucx exporting them.
const (
	// ParamsSecretBytes is the size of a per-request secret.
	ParamsSecretBytes = 16
	// ParamsMaxAddress bounds the worker address.
	ParamsMaxAddress = 1 << 16
)

// decodeRequestExt parses request-info's extension: flags, then the held-block bitmap.
func decodeRequestExt(m *RequestInfo, b []byte) error {
	at := RequestInfoBytes
	m.Flags = RequestFlags(binary.LittleEndian.Uint32(b[at:]))
	if m.Flags&^knownFlags != 0 {
		return malformed(at, "unknown request flags %#x", uint32(m.Flags&^knownFlags))
	}
	if m.Flags&FlagPull != 0 && m.Flags&FlagDirect != 0 {
		return malformed(at, "FlagPull is a staging request's, not a direct one's")
	}
	n := int(binary.LittleEndian.Uint32(b[at+4:]))
	if m.Flags == 0 && n == 0 { // never encoded: one message, one encoding
		return malformed(at, "an empty request-info extension")
	}
	claim := 0
	if m.Flags&FlagClaim != 0 {
		claim = claimBytes
	}
	if n > MaxBlocks || len(b) != at+requestExtBytes+(n+7)/8+claim {
		return malformed(at+4, "bitmap of %d blocks in a %d-byte request-info (at most %d blocks)", n, len(b), MaxBlocks)
	}
	if claim != 0 {
		c := b[len(b)-claimBytes:]
		m.Claim.Incarnation = binary.LittleEndian.Uint64(c)
		copy(m.Claim.Proof[:], c[8:])
		b = b[:len(b)-claimBytes]
	}
	bits := b[at+requestExtBytes:]
	if n%8 != 0 && bits[len(bits)-1]>>(n%8) != 0 {
		return malformed(len(b)-1, "bits set past the %d-block bitmap", n)
	}
	for p := range n {
		if bits[p/8]&(1<<(p%8)) != 0 {
			m.Held = append(m.Held, p)
		}
	}
	if len(m.Held) > 0 {
		m.HeldOf = n
	} else if n != 0 {
		return malformed(at+4, "a %d-block bitmap with no block held", n)
	}
	return nil
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

// NewNonce draws a transfer's nonce: random, never 0.
func NewNonce() uint64 {
	for {
		if n := rand.Uint64(); n != 0 {
			return n
		}
	}
}

// Encode appends m's encoding to a fresh buffer; the encoders cannot fail on valid messages.
func Encode(m Message) []byte {
	b, _ := m.AppendBinary(make([]byte, 0, 64))
	return b
}
