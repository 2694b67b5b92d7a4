// SPDX-License-Identifier: Apache-2.0

package transfer

// Exposure without a named receiver (docs/protocol.md): Expose starts a Send whose peer is
// empty. It has no route until a receiver's request claims it: the inbound handler finds it
// by request id (Engine.exposures), checks the claim's proof of the exposure's secret
// (claimLocked, claim.go), and only the first valid claim gets a route and reaches the Send's
// goroutine, which takes the claimer as its peer and runs on as any Send does. Until then the
// exposure is an ordinary queued Send of the one state table: Cancel, Close and its
// ExposureTimeout end it from Queued, its blocks quiescent at once.

import (
	"context"
	"fmt"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// exposedPeer stands for the receiver an exposure has not got yet while its spec is checked.
const exposedPeer Peer = "(exposed: no receiver yet)"

// Expose starts sending spec's blocks to whichever receiver first claims the request, and
// returns at once with its handle and the params to hand over (docs/protocol.md, "Exposure
// without a named receiver"). spec names no Peer (nor Subs); its Secret, if nil, is drawn
// here. The params (for the UCX transport a *ucx.ContextParams, Anonymous) carry the secret
// and, with Config.ClusterKeys, are signed; they are nil for a transport that describes no
// requests (the in-memory test transport), whose receivers take the secret from spec.
//
// The engine holds the blocks as for Send. A Receive whose request proves the secret (its
// Spec.Secret from the params) claims the exposure, and the transfer runs as a Send to that
// receiver would, on the path it would take; any later claim is refused (that Receive fails
// with ErrAlreadyClaimed), and so is one whose proof is wrong or missing (ErrUnauthenticated),
// each counted (an Observer's OnAuthRefused, what "claim", reasons "claimed", "bad-mac",
// "unsealed"). An exposure nobody claims within Config.ExposureTimeout, or before ctx is
// done, ends Failed (ErrDeadline; or ErrQueueTimeout with ctx's cause) with its blocks quiescent at once; Cancel
// of an unclaimed exposure returns CancelledBeforeAdvertise, and Close ends it as it ends a
// queued Send. After the claim, ctx and Config.QueueTimeout bound its queued phase as a Send's.
func (e *Engine) Expose(ctx context.Context, spec Spec) (*Handle, transport.Params, error) {
	return e.start(ctx, spec, false, true)
}

// exposable checks what only an exposure refuses: a named receiver.
func (s Spec) exposable() error {
	if s.Peer != "" || len(s.Subs) > 0 {
		return &specError{ID: s.ID, Field: "Peer", Reason: "an exposure names no receiver: leave Peer and Subs empty (use Send to name one)"}
	}
	return nil
}

// exposeParams asks the transport for the exposure's params and signs them with the cluster
// key; nil, nil for a transport that issues none.
func (e *Engine) exposeParams(spec Spec, plan *layout.Plan, exposure *transport.Exposure) (transport.Params, error) {
	pi, ok := e.tr.(transport.ParamsIssuer)
	if !ok {
		return nil, nil
	}
	p, err := pi.ExposeParams(spec.ID, plan, spec.Secret, exposure)
	if err == nil {
		err = e.SignParams(p)
	}
	if err != nil {
		return nil, &requestError{ID: spec.ID, Err: fmt.Errorf("the exposure's params: %w", err)}
	}
	return p, nil
}

// takeClaim makes the peer whose request claimed the exposure this Send's peer. Its
// goroutine calls it on the first request, the only message that reaches an unclaimed one.
func (x *xfer) takeClaim() {
	if x.peer != "" {
		return
	}
	x.eng.mu.Lock()
	x.peer = x.claimer
	x.eng.mu.Unlock()
}

// unexposeLocked ends the exposure's claims: it leaves the engine's exposures, and a claim
// whose request never reached its goroutine loses its route. e.mu is held.
func (x *xfer) unexposeLocked() {
	e := x.eng
	x.unexposed = true
	if e.exposures[x.h.id] == x {
		delete(e.exposures, x.h.id)
	}
	if x.claimer != "" && x.claimer != x.peer {
		if key := (routeKey{x.claimer, x.h.id}); e.routes[key] == x {
			delete(e.routes, key)
		}
	}
}
