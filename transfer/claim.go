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

// claimSecretBytes is the size of a per-request secret (Spec.Secret; ucx.ContextParams.Secret).
const claimSecretBytes = 16

// NewClaimSecret draws a per-request secret: put it in Spec.Secret of the Send and in the
// request's ContextParams (ucx.ContextParams.Secret) before they are signed and handed out.
func NewClaimSecret() []byte {
	b := make([]byte, claimSecretBytes)
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
		if proves(x.secret, ri) {
			return false
		}
		ae.Reason = transport.AuthBadMAC
	}
	e := x.eng
	e.mu.Lock()
	ab := e.claimAbortLocked(x.peer, ri, ae)
	e.mu.Unlock()
	e.refuseClaim(x.peer, ab, ae)
	return true
}

// proves reports whether ri carries a claim whose proof is of secret.
func proves(secret []byte, ri *wire.RequestInfo) bool {
	if ri.Flags&wire.FlagClaim == 0 {
		return false
	}
	want := wire.ClaimProof(secret, ri.Request, ri.Sub, ri.Nonce, ri.Claim.Incarnation)
	return hmac.Equal(want[:], ri.Claim.Proof[:])
}

// claimAbortLocked is the abort that answers ri's refused claim: AbortUnauthenticated, or for
// a proven claim of an exposure claimed before AbortClaimed, to a peer whose proven hello
// says it reads them (claim-proof), AbortIncompatible, which every build knows, to any
// other. e.mu is held.
func (e *Engine) claimAbortLocked(from Peer, ri *wire.RequestInfo, ae *AuthError) *wire.Abort {
	code := wire.AbortIncompatible
	if ph := e.peers[from]; ph != nil && chanClosed(ph.met) {
		if _, f, _ := e.agreed(ph.hello); f&wire.FeatureClaimProof != 0 {
			code = wire.AbortUnauthenticated
			if ae.Reason == transport.AuthClaimed {
				code = wire.AbortClaimed
			}
		}
	}
	return &wire.Abort{Header: wire.Header{Sub: ri.Sub, Request: ri.Request, Nonce: ri.Nonce}, Code: code, Reason: ae.Error()}
}

// refuseClaim counts a refused claim and answers it with ab. e.mu is not held.
func (e *Engine) refuseClaim(from Peer, ab *wire.Abort, ae *AuthError) {
	e.log.Debug("refusing a request's claim", zap.Uint64("request", uint64(ab.Request)), zap.Uint64("nonce", ab.Nonce), zap.Error(ae))
	notifyAuthRefused(e.obs, ae)
	_ = e.tr.SendControl(from, wire.Encode(ab))
}

// claimLocked decides request ri from a peer that has no route for it, to exposure x
// (expose.go): a claim whose proof is of x's secret, the first, claims x: the claimer gets
// x's route and ri goes to x's mailbox (under e.mu, so the exposure's end, which takes e.mu
// before it empties the mailbox, answers it). Anything else is refused (claimRefusal); it
// returns the abort to send and the refusal to count (refuseClaim), nil for a claim taken.
// e.mu is held.
func (e *Engine) claimLocked(from Peer, x *xfer, ri *wire.RequestInfo) (*wire.Abort, *AuthError) {
	if ae := claimRefusal(from, x.secret, x.claimer != "" || x.unexposed, ri); ae != nil {
		return e.claimAbortLocked(from, ri, ae), ae
	}
	if x.m.load() != Queued { // cancelled or closed, its goroutine not gone yet: nothing to claim
		return &wire.Abort{Header: wire.Header{Sub: ri.Sub, Request: ri.Request, Nonce: ri.Nonce}, Code: wire.AbortCancelled,
			Reason: "the exposure ended before it was claimed"}, nil
	}
	x.claimer = from
	x.h.unclaimed.Store(false)
	key := routeKey{from, ri.Request}
	e.routes[key] = x
	delete(e.unanswered, key)
	x.box.Push(event{msg: ri})
	return nil, nil
}

// claimRefusal is why a claim of an exposure with secret, claimed before or not, is refused,
// or nil for a claim that may take it: no proof or a wrong one is an unauthenticated claim, a
// proven one after the first is claimed. Only a holder of the secret learns that the exposure
// was claimed.
func claimRefusal(from Peer, secret []byte, claimed bool, ri *wire.RequestInfo) *AuthError {
	ae := &AuthError{Peer: from, What: "claim", Reason: transport.AuthUnsealed}
	switch {
	case ri.Flags&wire.FlagClaim == 0:
	case !proves(secret, ri):
		ae.Reason = transport.AuthBadMAC
	case claimed:
		ae.Reason = transport.AuthClaimed
	default:
		return nil
	}
	return ae
}

// endedClaimLocked answers a request for an exposure that has ended (u, remembered under the
// empty peer): a claim refused as a live exposure's would be, counted; a proven claim of one
// that ended unclaimed gets the abort it ended with, as a Send's late request does. e.mu is
// held.
func (e *Engine) endedClaimLocked(from Peer, ri *wire.RequestInfo, u unanswered) (*wire.Abort, *AuthError) {
	if ae := claimRefusal(from, u.secret, u.claimed, ri); ae != nil {
		return e.claimAbortLocked(from, ri, ae), ae
	}
	return &wire.Abort{Header: wire.Header{Sub: ri.Sub, Request: ri.Request, Nonce: ri.Nonce}, Code: u.code, Reason: u.reason}, nil
}
