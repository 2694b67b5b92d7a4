// SPDX-License-Identifier: Apache-2.0

// Package forgery names the lies of the hostile peer harness, shared by the lying peer
// (transfer/internal/hostilepeer) and the victim that asks for them (internal/hostile): the
// forgeries, the request ids that carry them, the model both sides move and the memory
// patterns the canary checks look for (docs/security.md, "The hostile peer harness").
package forgery

import "math/rand/v2"

// Forgery names one lie the hostile peer tells. The offer forgeries answer a request of the
// victim's (its id names the forgery: RequestID); the others the victim asks for on the
// peer's stdin ("SEND <forgery>").
type Forgery uint8

// The forgeries, in the order a round runs them.
const (
	// Honest is no lie: the peer offers the pool it registered, as it is. It shows the
	// harness can complete a transfer, so a refusal below is the check's, not the setup's.
	Honest Forgery = iota + 1
	// OutsideRegistration offers a range that starts one block before the peer's
	// registration: its own secret, next to the pool, that it never registered.
	OutsideRegistration
	// PastSegment offers a 1 MiB segment the peer allocated as 2 MiB, reading its second half.
	PastSegment
	// HugeLength offers a pool of 64 TiB and blocks 128 GiB past its registration.
	HugeLength
	// WrappingRange offers a pool whose range wraps around the address space.
	WrappingRange
	// OverlappingParts offers the blocks in two parts whose positions overlap.
	OverlappingParts
	// GarbageKey offers the pool under random bytes for its remote key.
	GarbageKey
	// TruncatedKey offers the pool under the first half of its real key.
	TruncatedKey
	// PidOfThird answers from an address whose pid names the third process, whose canary
	// lies at the very address of the peer's pool.
	PidOfThird
	// PidOfVictim answers from an address whose pid names the victim itself.
	PidOfVictim
	// ReplayedNonce first sends the offer of an earlier transfer of the same request id (its
	// nonce), then the honest one.
	ReplayedNonce
	// HelloForOther: a hello sent in another peer's name claiming every feature, then a proof in
	// its name that answers no challenge.
	HelloForOther
	// UnsolicitedProof: a hello proof that answers no challenge.
	UnsolicitedProof
	// UnsealedHello: with cluster keys, a hello without a seal.
	UnsealedHello
	// ForeignKeyHello: with cluster keys, a hello sealed by a key of another fleet.
	ForeignKeyHello
	// UnsignedParams, ForeignParams and TamperedParams: with cluster keys, ContextParams
	// unsigned, signed by another fleet's key, and changed (the request id) after signing.
	UnsignedParams
	ForeignParams
	TamperedParams
	// ClaimWithoutProof and ClaimWrongProof: with cluster keys, a request for a Send of the
	// victim's that holds a secret, without a claim and with a claim that proves another secret.
	ClaimWithoutProof
	ClaimWrongProof
	forgeryEnd
)

var forgeryNames = [...]string{Honest: "honest", OutsideRegistration: "outside-registration", PastSegment: "past-segment",
	HugeLength: "huge-length", WrappingRange: "wrapping-range", OverlappingParts: "overlapping-parts",
	GarbageKey: "garbage-key", TruncatedKey: "truncated-key", PidOfThird: "pid-of-third", PidOfVictim: "pid-of-victim",
	ReplayedNonce: "replayed-nonce", HelloForOther: "hello-for-other", UnsolicitedProof: "unsolicited-proof",
	UnsealedHello: "unsealed-hello", ForeignKeyHello: "foreign-key-hello", UnsignedParams: "unsigned-params",
	ForeignParams: "foreign-params", TamperedParams: "tampered-params", ClaimWithoutProof: "claim-without-proof",
	ClaimWrongProof: "claim-wrong-proof"}

// String names the forgery as the report and the peer's stdin do.
func (f Forgery) String() string {
	if f > 0 && f < forgeryEnd {
		return forgeryNames[f]
	}
	return "forgery?"
}

// ParseForgery is String's inverse.
func ParseForgery(s string) (Forgery, bool) {
	for f := Honest; f < forgeryEnd; f++ {
		if f.String() == s {
			return f, true
		}
	}
	return 0, false
}

// All lists the forgeries in the order a round runs them.
func All() []Forgery {
	fs := make([]Forgery, 0, forgeryEnd-1)
	for f := Honest; f < forgeryEnd; f++ {
		fs = append(fs, f)
	}
	return fs
}

// Offered reports whether the forgery answers a request of the victim's (an RMA offer).
func (f Forgery) Offered() bool { return f >= Honest && f <= ReplayedNonce }

// RequestID is the id of the victim's n-th request that asks for forgery f: the peer reads f
// from its low byte.
func RequestID(n uint64, f Forgery) uint64 { return n<<8 | uint64(f) }

// ForgeryOf is the forgery a request id asks for.
func ForgeryOf(id uint64) Forgery { return Forgery(id & 0xff) }

// The model both sides move (layout.Dims): 4 layers, K and V, 8 heads of 64 BF16, 16-token
// blocks of 128 KiB, block-major.
const (
	NumLayers      = 4
	KVFactor       = 2
	NumHeads       = 8
	HeadDim        = 64
	ElemSize       = 2
	TokensPerBlock = 16
)

// Sizes of the pools: each side's pool holds PoolBlocks blocks and a request moves
// RequestBlocks of them; the victim's are blocks FirstBlock.. of its pool (the others are
// canaries), the peer's its first ones. SecretBytes of the peer's own memory lie right before
// and after its registration.
const (
	PoolBlocks    = 16
	RequestBlocks = 8
	FirstBlock    = 4
	BlockBytes    = NumLayers * KVFactor * NumHeads * HeadDim * ElemSize * TokensPerBlock
	SecretBytes   = BlockBytes
	// Secret fills the peer's unregistered memory; Canary the third process's memory and the
	// victim's guard pages and unused blocks. No run of 64 of either may reach a victim pool.
	Secret byte = 0x5e
	Canary byte = 0xc3
)

// Fill writes the peer's pattern for seed into b: what an honest transfer moves.
func Fill(b []byte, seed uint64) {
	var key [32]byte
	key[0], key[1], key[2] = byte(seed), byte(seed>>8), 0x48
	_, _ = rand.NewChaCha8(key).Read(b) // never fails
}
