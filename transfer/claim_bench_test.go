// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"crypto/hmac"
	"testing"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
)

// BenchmarkClaimPerRequest is the work a cluster key adds to one request on the engines'
// wire: the secret drawn, the receiver's claim proof, and the sender's check of it (claim.go).
// The hellos' seals are once per peer, not per request (docs/security.md, "What a cluster key
// costs").
//
//	go test -run '^$' -bench ClaimPerRequest ./transfer/
func BenchmarkClaimPerRequest(b *testing.B) {
	b.ReportAllocs()
	for i := range b.N {
		secret := NewClaimSecret()
		proof := wire.ClaimProof(secret, RequestID(i), 0, uint64(i), 42)
		want := wire.ClaimProof(secret, RequestID(i), 0, uint64(i), 42)
		if !hmac.Equal(proof[:], want[:]) {
			b.Fatal("the proofs differ")
		}
	}
}
