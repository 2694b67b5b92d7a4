// SPDX-License-Identifier: Apache-2.0

package transport

import (
	"errors"
	"fmt"
)

// ErrUnauthenticated: with cluster keys set, a peer's hello, hello challenge or proof, or a
// ContextParams blob, was not sealed by a key this engine holds; the error is an *AuthError.
// What it came with is dropped and counted; nothing it names is used. The transfer package
// re-exports it (transfer.ErrUnauthenticated).
var ErrUnauthenticated = errors.New("kvxfer: peer message not authenticated")

// AuthRefusal says why a peer's message did not authenticate.
type AuthRefusal int

// The reasons.
const (
	// AuthUnsealed: the message carries no seal (its sender holds no key, or speaks wire 3).
	AuthUnsealed AuthRefusal = iota
	// AuthUnknownKey: sealed with a key this engine does not hold (another fleet's, or one
	// rotated out).
	AuthUnknownKey
	// AuthBadMAC: sealed under a key this engine holds, but the bytes are not what was sealed:
	// changed on the way, or forged.
	AuthBadMAC
	// AuthClaimed: a claim that proved the secret of an exposure another receiver had
	// claimed first (docs/protocol.md, "Exposure without a named receiver"); the receiver
	// fails with ErrAlreadyClaimed.
	AuthClaimed
	// AuthRefusalCount is the number of reasons, for tables indexed by them.
	AuthRefusalCount
)

var authRefusalNames = [AuthRefusalCount]string{"unsealed", "unknown-key", "bad-mac", "claimed"}

// String names the reason as metrics label it.
func (r AuthRefusal) String() string {
	if r >= 0 && r < AuthRefusalCount {
		return authRefusalNames[r]
	}
	return "unknown"
}

// AuthMessages names what a cluster key seals, as AuthError.What and metrics label them: the
// hello handshake's three messages, ContextParams blobs ("params"), and a request's claim of
// its secret ("claim": AuthUnsealed when it carries no proof, AuthBadMAC when the proof is
// not of the secret).
var AuthMessages = []string{"hello", "challenge", "proof", "params", "claim"}

// AuthError is a peer's message refused for want of authentication. It matches
// ErrUnauthenticated.
type AuthError struct {
	// Peer is the address the message claimed to come from (not proven); for params, the
	// sender the blob names.
	Peer Peer
	// What is one of AuthMessages.
	What   string
	Reason AuthRefusal
}

// Error implements error.
func (e *AuthError) Error() string {
	return fmt.Sprintf("%v: a %s from %s: %v", ErrUnauthenticated, e.What, e.Peer.Short(), e.Reason)
}

// Unwrap returns ErrUnauthenticated.
func (e *AuthError) Unwrap() error { return ErrUnauthenticated }
