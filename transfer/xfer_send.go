// SPDX-License-Identifier: Apache-2.0

package transfer

// The sending side of a sub-transfer: wait for the receiver's request, check it, and start the
// path it names (path_staging.go, path_direct.go, path_rma.go); and what every sending path
// shares: the layers a streaming Send has ready, a sent chunk's count, the end. xfer.go has what
// both sides share: the loop, timers, abort, quarantine.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
)

func (x *xfer) runSend() {
	var ri *wire.RequestInfo
	var unclaimed <-chan time.Time // an exposure's wait for its claim (expose.go)
	if x.exposed {
		t := time.NewTimer(x.eng.cfg.ExposureTimeout)
		defer t.Stop()
		unclaimed = t.C
	}
	for ri == nil {
		select {
		case <-x.box.Ready():
			evs := x.box.Take(nil)
			for i, ev := range evs {
				switch m := ev.msg.(type) {
				case *wire.RequestInfo:
					if x.exposed {
						x.takeClaim() // expose.go: the engine checked the claim before it routed it here
					} else if x.claimRefused(m) { // claim.go: a forged claim is answered, and the Send waits on
						break
					}
					ri, x.backlog = m, evs[i+1:]
				case *wire.Abort:
					// Only an abort the engine held with its request (an early one) is known
					// to be this transfer's; any other names a request this Send never saw.
					if ev.early {
						x.queuedExit(peerAbortErr(x.h.id, m, true))
						return
					}
					x.ours(m.Header)
				}
				if ev.lost != nil {
					x.queuedExit(ev.lost)
					x.eng.rememberUnanswered(routeKey{x.peer, x.h.id}, wire.AbortInternal, ev.lost)
					return
				}
				if ri != nil {
					break
				}
			}
		case <-unclaimed:
			x.endQueued(&requestError{ID: x.h.id, Err: fmt.Errorf("%w: the exposure was not claimed within %v (Config.ExposureTimeout)",
				ErrDeadline, x.eng.cfg.ExposureTimeout)})
			return
		case <-x.qctx.Done():
			x.endQueued(x.queueErr(context.Cause(x.qctx)))
			return
		}
	}
	x.wireSub, x.nonce = ri.Sub, ri.Nonce
	x.publishIdent()
	// The receiver's abort of this request may have come with it, or since: from here on the
	// inbound handler ends the queued waits on one (abortQueued); one before is in the mailbox.
	x.backlog = append(x.backlog, x.box.Take(nil)...)
	for _, ev := range x.backlog {
		if m, ok := ev.msg.(*wire.Abort); ok && m.Nonce == ri.Nonce && m.Sub == ri.Sub {
			x.queuedExit(peerAbortErr(x.h.id, m, true))
			return
		}
	}
	if ri.Flags&wire.FlagDirect == 0 || ri.Flags&wire.FlagRMA == 0 {
		x.endOneHop() // onehop.go: the claim takes another path, so no read of the params may complete
	}
	if !x.know() { // negotiate.go: what the receiver proved it speaks
		return
	}
	err := x.refuseUnspoken(ri)
	if err == nil {
		err = x.refuseSmallReceiver()
	}
	if err == nil {
		err = x.applyHeld(ri)
	}
	if err == nil {
		err = kvplan.CompatibleShapes(kvplan.ShapeOf(x.plan), ri.Shape)
	}
	direct := ri.Flags&wire.FlagDirect != 0 // the receiver picked the path: direct or staging
	if err == nil && x.dev.set() {
		err = x.deviceSendRefusal(direct, ri.Flags&wire.FlagRMA != 0) // device.go
	} else if err == nil && direct && !x.directCapable() {
		err = fmt.Errorf("the receiver asked for the direct (one-copy) path and this sender's pool cannot take it " +
			"(allocate or register it with the transport, drop the Mover, or set Config.Tuning.DisableDirect on the receiver)")
	}
	if err != nil || (!direct && ri.ChunkBytes > x.payloadCap()) {
		if err == nil {
			err = fmt.Errorf("receiver's %d-byte chunks do not fit this engine's %d-byte slots", ri.ChunkBytes, x.eng.cfg.SlotBytes)
		}
		cause := &requestError{ID: x.h.id, Err: fmt.Errorf("%w: %w", ErrIncompatible, err)}
		x.sendAbort(wire.AbortIncompatible, cause)
		x.queuedExit(cause)
		return
	}
	x.setChunks(ri.ChunkBytes, ri.Flags&wire.FlagLayerCut != 0)
	if !x.stream {
		x.readyBytes = x.plan.Bytes()
	}
	var started bool
	if direct {
		started = x.startDirectSend(ri) // path_direct.go, path_rma.go
	} else {
		started = x.startStagingSend(ri) // path_staging.go, path_pull.go
	}
	if !started {
		return
	}
	x.loop()
	switch p := x.path.(type) { // the generation word goes back, an exposure poisoned for good's too
	case *pullSend:
		p.end() // path_pull.go
	case *rmaSend:
		// rma_gen.go. Not once Close has begun: the transport is closing, its words no longer
		// matter, and it may have unmapped them.
		if !x.eng.isClosed() {
			p.endGeneration()
		}
	}
}

// endQueued ends a Send that never got its request, or could not start on it, for cause. A
// request that arrived as it gave up still gets an answer, so the receiver does not wait for
// its deadline, and one that arrives later is answered by the engine.
func (x *xfer) endQueued(cause error) {
	if x.exposed {
		x.eng.mu.Lock()
		x.unexposeLocked() // no claim from here on; one made before is in the mailbox
		x.eng.mu.Unlock()
	}
	x.queuedExit(cause)
	code := abortCode(cause)
	// Not a lost peer's now: it sends nothing more, and an abort to it would only have the
	// transport try to reach it (a false alarm's next request is answered by the engine).
	lost := errors.Is(cause, ErrPeerLost)
	answered := false
	for _, ev := range x.box.Take(nil) {
		if m, ok := ev.msg.(*wire.RequestInfo); ok && !answered && !lost {
			if x.exposed {
				x.takeClaim()
			}
			x.wireSub, x.nonce, answered = m.Sub, m.Nonce, true
			x.sendAbort(code, cause)
		}
	}
	if x.exposed { // any later claim of it (expose.go)
		x.eng.rememberEnded(routeKey{"", x.h.id}, unanswered{code: code, reason: cause.Error(), secret: x.secret, claimed: x.peer != ""})
	} else if !answered {
		x.eng.rememberUnanswered(routeKey{x.peer, x.h.id}, code, cause)
	}
}

// stoppedBeforeStart tells the receiver, whose request this sender took, that it ended while it
// waited for its path (the receiver's hello, one of MaxConcurrent, a staging slot), so the
// receiver, which advertised and waits, does not wait for its deadline: an abort with the
// request's nonce, its code from why the Send ended (AbortClosed for Close). Not to a peer that
// is lost or aborted itself, and not twice (an incompatible request was answered already).
// rememberEnded names such a Send in the goodbye too, for when the abort is lost.
func (x *xfer) stoppedBeforeStart(what string) {
	cause := x.queuedCause
	if x.toldPeer || errors.Is(cause, ErrPeerLost) || errors.Is(cause, ErrPeerAborted) {
		return
	}
	reason := "the sender stopped before it " + what
	code := abortCode(cause)
	switch {
	case cause != nil:
		reason += ": " + cause.Error()
	case x.m.load() == Cancelled: // cancelled as it left Queued
		code = wire.AbortCancelled
	}
	x.sendAbort(code, errors.New(reason))
}

// applyHeld trims the plan by the receiver's held positions (a partial transfer), so both
// sides drop the same blocks before the shapes are compared.
func (x *xfer) applyHeld(ri *wire.RequestInfo) error {
	if len(ri.Held) == 0 {
		return nil
	}
	if n := len(x.plan.Blocks()); ri.HeldOf != n {
		return fmt.Errorf("%w: the receiver's request has %d blocks, this sender's %d", layout.ErrIncompatible, ri.HeldOf, n)
	}
	trimmed, err := kvplan.WithoutPositions(x.plan, ri.Held)
	if err != nil {
		return fmt.Errorf("receiver's held positions: %w", err)
	}
	x.h.total.Add(trimmed.Bytes() - x.plan.Bytes())
	x.plan = trimmed
	return nil
}

// refreshReady raises readyBytes from the caller's MarkLayersReady and any fired signals. It
// never blocks: each signal is queried once, in order, and the first one not done stops it.
func (x *xfer) refreshReady() error {
	if !x.stream {
		return nil
	}
	layers := x.h.readyLayers.Load()
	for x.nextSignal < len(x.signals) {
		s := x.signals[x.nextSignal]
		done, err := s.Signal.Query()
		if err != nil {
			return &requestError{ID: x.h.id, Err: fmt.Errorf("%w: layers [0, %d): %w", errReadySignal, s.End, err)}
		}
		if !done {
			break
		}
		x.nextSignal++
	}
	if x.nextSignal > 0 {
		layers = max(layers, int64(x.signals[x.nextSignal-1].End))
		for i := 0; i < 64; i++ { // publish for LayersReady; bounded, each lost race raised it
			cur := x.h.readyLayers.Load()
			if layers <= cur || x.h.readyLayers.CompareAndSwap(cur, layers) {
				break
			}
		}
	}
	if ready := layers * x.perLayer; ready > x.readyBytes {
		x.readyBytes = ready
		x.eng.touch() // the time spent waiting on the model was no stall of the wire
	}
	return nil
}

// onReady sends what newly ready layers allow through the slots that waited for them.
func (x *xfer) onReady() {
	if x.receive || x.aborting || x.ended {
		return
	}
	if err := x.refreshReady(); err != nil {
		x.abort(err, wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		return
	}
	for len(x.idle) > 0 && !x.aborting {
		if x.nextSeq < x.nChunks {
			if off, n := x.chunkRange(x.nextSeq); off+n > x.readyBytes {
				return
			}
		}
		s := x.idle[len(x.idle)-1]
		x.idle = x.idle[:len(x.idle)-1]
		if !x.path.post(s) {
			return
		}
	}
}

// sentChunk handles a sent chunk on either sending path that sends chunks (staging, direct):
// the chunk counts, and its pipeline place (its slot, or nil) takes the next one.
func (x *xfer) sentChunk(rec *opRec) {
	_, n := x.chunkRange(rec.seq)
	x.progress(n)
	if x.path.post(rec.slot) {
		x.maybeSent()
	}
}

// maybeSent completes the sending side once every chunk left and the receiver confirmed.
func (x *xfer) maybeSent() {
	if x.moved == x.nChunks && x.doneMsg && !x.ended {
		x.finish(evComplete, nil)
	}
}
