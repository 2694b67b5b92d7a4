// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// claimMessageBytes is what ClaimProof authenticates: the label and the four fields.
const claimMessageBytes = len(claimLabel) + 8 + 2 + 8 + 8

// ClaimProof is HMAC-SHA256(secret, "kvxfer claim" | request u64 | sub u16 | nonce u64 |
// incarnation u64), little-endian, truncated to ClaimProofBytes (docs/protocol.md,
// "ContextParams v3"). Bound to the nonce, a recorded claim proves nothing for another
// transfer; bound to the incarnation, nothing for another life of the receiver.
//
// Both engines compute one for every claimed request, so it is RFC 2104's construction written
// over sha256.Sum256 and arrays on the stack: crypto/hmac allocated 8 times a proof
// (TestClaimProof_IsTheHMAC holds it to crypto/hmac).
func ClaimProof(secret []byte, request transport.RequestID, sub uint16, nonce, incarnation uint64) [ClaimProofBytes]byte {
	var key [sha256.BlockSize]byte // the secret, zero-padded, or its hash when longer than a block
	if len(secret) > sha256.BlockSize {
		sum := sha256.Sum256(secret)
		copy(key[:], sum[:])
	} else {
		copy(key[:], secret)
	}
	var inner [sha256.BlockSize + claimMessageBytes]byte
	for i, k := range key {
		inner[i] = k ^ 0x36
	}
	m := inner[sha256.BlockSize:]
	at := copy(m, claimLabel)
	binary.LittleEndian.PutUint64(m[at:], uint64(request))
	binary.LittleEndian.PutUint16(m[at+8:], sub)
	binary.LittleEndian.PutUint64(m[at+10:], nonce)
	binary.LittleEndian.PutUint64(m[at+18:], incarnation)
	var outer [sha256.BlockSize + sha256.Size]byte
	for i, k := range key {
		outer[i] = k ^ 0x5c
	}
	sum := sha256.Sum256(inner[:])
	copy(outer[sha256.BlockSize:], sum[:])
	sum = sha256.Sum256(outer[:])
	var p [ClaimProofBytes]byte
	copy(p[:], sum[:])
	return p
}
