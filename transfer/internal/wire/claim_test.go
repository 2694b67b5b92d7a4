// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// claimProofHMAC is ClaimProof as its doc states it, through crypto/hmac.
func claimProofHMAC(secret []byte, request transport.RequestID, sub uint16, nonce, incarnation uint64) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(claimLabel))
	h.Write(binary.LittleEndian.AppendUint64(nil, uint64(request)))
	h.Write(binary.LittleEndian.AppendUint16(nil, sub))
	h.Write(binary.LittleEndian.AppendUint64(nil, nonce))
	h.Write(binary.LittleEndian.AppendUint64(nil, incarnation))
	return h.Sum(nil)[:ClaimProofBytes]
}

// TestClaimProof_IsTheHMAC: the proof is crypto/hmac's HMAC-SHA256, truncated, for secrets of
// every length around SHA-256's 64-byte block (a longer key is hashed first) and any fields.
func TestClaimProof_IsTheHMAC(t *testing.T) {
	for _, n := range []int{0, 1, 16, 32, 63, 64, 65, 100, 200} {
		secret := bytes.Repeat([]byte{byte(n), 0x5c, 0x36}, n)[:n]
		for _, f := range []struct {
			request    transport.RequestID
			sub        uint16
			nonce, inc uint64
		}{
			{0, 0, 0, 0},
			{1, 2, 3, 4},
			{0xfeedface_cafef00d, 0xffff, ^uint64(0), 1 << 63},
		} {
			got := ClaimProof(secret, f.request, f.sub, f.nonce, f.inc)
			require.Equal(t, claimProofHMAC(secret, f.request, f.sub, f.nonce, f.inc), got[:], "%d-byte secret, %+v", n, f)
		}
	}
}

// TestClaimProof_Allocates: both engines compute a proof for every claimed request (the
// receiver to claim, the sender to check): it allocates nothing.
func TestClaimProof_Allocates(t *testing.T) {
	secret := bytes.Repeat([]byte{0xa5}, ParamsSecretBytes)
	got := testing.AllocsPerRun(100, func() { _ = ClaimProof(secret, 7, 1, 9, 3) })
	require.Zero(t, got, "heap allocations per proof")
}
