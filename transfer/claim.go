// SPDX-License-Identifier: Apache-2.0

package transfer

// Claims (docs/protocol.md, "ContextParams v3"): a Send with a per-request secret takes a
// request only when the request proves the secret. The receiver proves it without sending
// it: ClaimProof binds the secret to the request, its sub-transfer, the receiver's nonce
// and the receiver engine's incarnation. A refused claim ends nothing on the sender: the
// request is answered with an abort for its nonce, and the Send waits on (its queued phase
// bounds the wait) for a request that proves the secret.

import (
	"crypto/hmac"
	"crypto/rand"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// ClaimSecretBytes is the size of a per-request secret (Spec.Secret; ucx.ContextParams.Secret).
const ClaimSecretBytes = 16

// NewClaimSecret draws a per-request secret: put it in Spec.Secret of the Send and in the
// request's ContextParams (ucx.ContextParams.Secret) before they are signed and handed out.
func NewClaimSecret() []byte {
	b := make([]byte, ClaimSecretBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24)
	return b
}

// claim adds the receiver's claim to its request when it holds the request's secret and the
// sender proved it reads claims.
func (x *xfer) claim(ri *wire.RequestInfo) {
	if x.secret == nil || !x.peerHas(wire.FeatureClaimProof) {
		return
	}
	inc := x.eng.incarnation
	ri.Flags |= wire.FlagClaim
	ri.Claim = wire.Claim{Incarnation: inc, Proof: wire.ClaimProof(x.secret, ri.Request, ri.Sub, ri.Nonce, inc)}
}

// claimsChecked reports whether this Send takes only proven claims: it has a secret, and the
// engine has cluster keys or requires proofs.
func (x *xfer) claimsChecked() bool {
	return x.secret != nil && (x.eng.keys != nil || x.eng.cfg.RequireClaimProof)
}

// claimRefused (a Send waiting for its request) checks ri's claim. A request without one,
// or whose proof is not of this Send's secret, is refused: counted (what "claim"), answered
// with an abort for its nonce (AbortUnauthenticated to a peer that speaks claims, else
// AbortIncompatible, which every build knows), and otherwise ignored, so the Send keeps
// waiting and frees nothing.
func (x *xfer) claimRefused(ri *wire.RequestInfo) bool {
	if !x.claimsChecked() {
		return false
	}
	ae := &AuthError{Peer: x.peer, What: "claim", Reason: transport.AuthUnsealed}
	if ri.Flags&wire.FlagClaim != 0 {
		want := wire.ClaimProof(x.secret, ri.Request, ri.Sub, ri.Nonce, ri.Claim.Incarnation)
		if hmac.Equal(want[:], ri.Claim.Proof[:]) {
			return false
		}
		ae.Reason = transport.AuthBadMAC
	}
	e := x.eng
	e.log.Debug("refusing a request's claim", zap.Uint64("request", uint64(ri.Request)), zap.Uint64("nonce", ri.Nonce), zap.Error(ae))
	notifyAuthRefused(e.obs, ae)
	code := wire.AbortIncompatible
	e.mu.Lock()
	if ph := e.peers[x.peer]; ph != nil && chanClosed(ph.met) {
		if _, f, _ := e.agreed(ph.hello); f&wire.FeatureClaimProof != 0 {
			code = wire.AbortUnauthenticated
		}
	}
	e.mu.Unlock()
	_ = e.tr.SendControl(x.peer, wire.Encode(&wire.Abort{Header: wire.Header{Sub: ri.Sub, Request: ri.Request, Nonce: ri.Nonce},
		Code: code, Reason: ae.Error()}))
	return true
}
