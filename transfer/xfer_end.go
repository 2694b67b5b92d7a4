// SPDX-License-Identifier: Apache-2.0

package transfer

// How a sub-transfer ends when it does not complete: abort (tell the peer, cancel what is
// outstanding), quarantine while the transport may still touch its memory, poison what never
// proved quiescent (L9, L10), and resolve to the terminal state once nothing can. xfer.go has
// the loop that drives them.

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"go.uber.org/zap"
)

// moverFailed settles the slot of a Gather or Scatter that failed. A copy the mover cannot
// say has ended (ErrQuiescenceUnknown: a GPU kernel past its timeout) may still touch the slot
// and the caller's blocks, so both are poisoned, never released (L9): the transfer stays
// quarantined for good and the engine reports the mover wedged. Any other failure ended the
// copy, and the slot goes back.
func (x *xfer) moverFailed(slot *buffer.Slot, seq int, err error) {
	if !errors.Is(err, ErrQuiescenceUnknown) {
		releaseSlot(slot)
		return
	}
	reason := fmt.Sprintf("the mover cannot say whether its copy of seq %d ended: %v", seq, err)
	rec := &opRec{seq: seq, slot: slot}
	if slot != nil {
		x.poison(rec, reason)
	}
	x.poisonBlocks(rec, reason)
	x.eng.moverWedged.CompareAndSwap(nil, &err)
}

func (x *xfer) poison(rec *opRec, reason string) {
	if rec.slot == nil {
		x.poisonBlocks(rec, reason)
		return
	}
	x.slotPoisoned = true
	if err := rec.slot.Poison(reason); err == nil {
		x.eng.obs.OnPoison(x.h.id, rec.slot.Index(), reason)
	}
}

// poisonBlocks is L9 for the direct path: the transport may still touch the caller's own KV
// blocks, and there is no slot to take out of circulation in their place. The transfer stays
// quarantined for good (its Quiesced channel never closes, so the caller never frees or
// reuses those blocks, and the engine refuses new transfers over them), Status says
// BlocksPoisoned, and Health counts its blocks against Config.Tuning.PoisonedBlockBudget.
func (x *xfer) poisonBlocks(rec *opRec, reason string) {
	if !x.blocksUnknown {
		x.blocksUnknown = true
		x.h.blocksPoisoned.Store(true)
		x.eng.obs.OnPoison(x.h.id, -1, reason)
		x.log().Error("caller's KV blocks poisoned: the transport may still touch them; the handle never quiesces",
			zap.Int("seq", rec.seq), zap.String("reason", reason))
	}
}

// abort stops the transfer for cause: it tells the peer (code != 0), asks the transport to
// cancel every outstanding operation, and ends at once if none is left; otherwise it waits
// grace for them, then quarantines. A deadline passes no grace: the transfer is already late,
// so it is quarantined at once. Other causes get Config.Tuning.CancelGrace, because cancelling an
// unmatched receive takes the transport microseconds and is no reason to quarantine.
func (x *xfer) abort(cause error, code wire.AbortCode, grace time.Duration) {
	if x.aborting || x.ended {
		return
	}
	if x.farewell.Load() && errors.Is(cause, ErrPeerLost) {
		// The peer's goodbye named this transfer and then closed the connection: an operation
		// or a key that failed on that connection before the goodbye's own event was taken
		// fails by the goodbye, which says what happened (the peer ended it, its operations
		// quiescent), not as a lost peer (rehearsal ci13: a slot key unpacked on the closed
		// endpoint). peerLeft aborts with the goodbye's cause.
		x.peerLeft()
		return
	}
	x.aborting, x.cause = true, peerLost(x.peer, cause) // a failed operation's loss names the peer too
	if errors.Is(cause, ErrProtocol) {                  // the peer's input, refused (docs/security.md)
		x.eng.refused.Add(1)
	}
	if code == wire.AbortCancelled && x.receive && x.outstanding+x.movingPeer > 0 && grace > 0 {
		// A receiver's cancel tells the sender only once its own operations have ended
		// (maybeResolve) or its grace has (quarantine): then the abort proves it reads the
		// sender's slots or pool no more, its release follows at once, and the sender ends a
		// clean cancel instead of waiting out its own grace into quarantine.
		x.heldAbort = code
	} else if code != 0 {
		x.sendAbort(code, cause)
	}
	// Any abort may meet chunks a declining sender already sent, but those of a lost peer
	// and of a closing engine: a lost peer sends nothing more, and the force close that
	// follows Close ends the peer's operations with this side. Before releaseIdle: the pull
	// wire's receives go into its idle slots.
	if a, ok := x.path.(awaitsAnswer); ok && !errors.Is(cause, ErrPeerLost) && !errors.Is(cause, ErrClosed) {
		a.takeDeclined()
	}
	x.releaseIdle()
	for _, op := range x.ops {
		if !op.final {
			x.eng.tr.Cancel(op.id)
		}
	}
	switch {
	case x.outstanding == 0:
		x.maybeResolve()
	case grace > 0:
		x.timers.grace = time.Now().Add(grace)
	default:
		x.quarantine()
	}
}

func (x *xfer) sendAbort(code wire.AbortCode, cause error) {
	x.toldPeer = true
	_ = x.eng.tr.SendControl(x.peer, wire.Encode(&wire.Abort{Header: x.head(), Code: code, Reason: cause.Error()}))
}

// sendHeldAbort sends the abort that a cancelling receiver held while its operations ended.
func (x *xfer) sendHeldAbort() {
	if x.heldAbort != 0 {
		code := x.heldAbort
		x.heldAbort = 0
		x.sendAbort(code, x.cause)
	}
}

// quarantine reports the transfer failed while operations may still touch its slots, and
// starts the clock after which they are poisoned.
func (x *xfer) quarantine() {
	if x.quarantined || x.ended {
		return
	}
	x.quarantined = true
	x.timers.grace = time.Time{}
	x.sendHeldAbort() // the operations did not end in the grace: the sender must know anyway
	x.apply(evQuarantine, x.cause)
	x.eng.obs.OnQuarantine(x.h.id, x.sub, x.cause)
	x.log().Warn("transfer quarantined", zap.Error(x.cause), zap.Int("outstanding", x.outstanding))
	x.timers.quarantine = time.Now().Add(x.eng.cfg.Tuning.QuarantineTimeout)
}

// poisonOutstanding gives up on operations that never reported: their slots leave
// circulation for good (L9), and a late completion finds nothing to release.
func (x *xfer) poisonOutstanding(reason string) {
	for _, op := range x.ops {
		if !op.final {
			op.final = true
			x.outstanding--
			x.poison(op, reason)
		}
	}
	x.maybeResolve()
}

// maybeResolve ends an aborting transfer once no operation can touch its slots, and no copy of
// the mover its slots or the caller's blocks.
func (x *xfer) maybeResolve() {
	if x.outstanding == 0 && x.movingPeer == 0 {
		x.sendHeldAbort() // nothing reads the sender's memory any more: the abort says so
	}
	if x.outstanding > 0 || x.moving > 0 || x.ended {
		return
	}
	if x.blocksUnknown {
		// The caller's blocks may still be touched: stay quarantined for good, never tell
		// the caller they are quiescent (L9, L10), and let the goroutine end.
		x.quarantine()
		x.timers.quarantine = time.Time{}
		if x.h.settledPoisoned.CompareAndSwap(false, true) {
			n := x.eng.holds.poison(x.h)
			if len(x.h.spans) == 0 { // a pool behind a Mover: no ids to refuse, but the blocks count
				n = x.h.nBlocks
			}
			// Blocks first: a Health that counts this transfer counts its blocks too.
			x.eng.blocksPoisoned.Add(n)
			x.h.mu.Lock()
			x.h.countPoisonedLocked() // now, or when its last sibling has an outcome
			x.h.mu.Unlock()
		}
		x.ended = true
		x.setAwaiting(false)
		x.releaseIdle()
		return
	}
	cancelled := errors.Is(x.cause, ErrCancelled)
	switch {
	case x.quarantined && cancelled:
		x.finish(evResolveCancelled, nil)
	case x.quarantined:
		x.finish(evResolveFailed, nil)
	case cancelled:
		x.finish(evCancelQuiescent, x.cause)
	default:
		x.finish(evFail, x.cause)
	}
}

func (x *xfer) finish(ev Event, cause error) {
	x.ended = true
	x.setAwaiting(false) // before the terminal event: a caller woken by it sees the count settled
	x.releaseIdle()
	x.apply(ev, cause)
	x.stamp("finished")
}

func transportErr(err error) error {
	if err == nil {
		err = errors.New("transport reported failure without an error")
	}
	return fmt.Errorf("kvxfer: transport: %w", err)
}

// peerAbortErr is the error of a transfer whose peer aborted it. On the sending side, a
// receiver's cancel is a cancel here too (ErrCancelled): it withdrew its request, and nothing
// failed. A receiver whose sender cancelled did not get its blocks: that stays a failure.
// abortCode is the abort code that tells the peer why this side ended for cause: its engine
// closed, the caller cancelled, a deadline passed, else an internal reason.
func abortCode(cause error) wire.AbortCode {
	switch {
	case errors.Is(cause, ErrClosed):
		return wire.AbortClosed
	case errors.Is(cause, ErrCancelled):
		return wire.AbortCancelled
	case errors.Is(cause, ErrDeadline):
		return wire.AbortDeadline
	}
	return wire.AbortInternal
}

func peerAbortErr(id RequestID, m *wire.Abort, sender bool) error {
	err := fmt.Errorf("%w (code %d): %s", ErrPeerAborted, m.Code, m.Reason)
	switch m.Code { // the peer's reason, where it means the same here
	case wire.AbortIncompatible:
		err = fmt.Errorf("%w: %w", ErrIncompatible, err)
	case wire.AbortDeadline:
		err = fmt.Errorf("%w: %w", ErrDeadline, err)
	case wire.AbortCancelled:
		if sender {
			err = fmt.Errorf("%w: %w", ErrCancelled, err)
		}
	case wire.AbortUnauthenticated:
		err = fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	case wire.AbortClaimed:
		err = fmt.Errorf("%w: %w", ErrAlreadyClaimed, err)
	}
	return &requestError{ID: id, Err: err}
}
