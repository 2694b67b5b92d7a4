// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/layout"
)

// Status is a snapshot of a handle. Reading it never blocks (L4).
type Status struct {
	// State is the handle's lifecycle state.
	State State
	// Bytes is how many stream bytes have moved so far (over all sub-transfers).
	Bytes int64
	// Total is the stream size over all sub-transfers.
	Total int64
	// Err is why the transfer failed, was cancelled or was quarantined; nil otherwise.
	Err error
	// BlocksPoisoned: a direct (one-copy) operation ended without the transport proving it
	// is done with the caller's KV blocks. The handle stays Quarantined for good and Quiesced
	// never closes: those blocks must never be freed or reused (L9, L10), and the engine
	// refuses a new transfer over them (ErrBlocksBusy). Health counts them against
	// Config.Tuning.PoisonedBlockBudget.
	BlocksPoisoned bool
}

// Handle is one request's transfer, over one or several peers. The caller gets it with one
// reference; Retain adds one, Release drops one. The engine holds its own reference until the
// transfer is quiescent, so nothing it points to goes away while the transport can reach it
// (L2). When every reference is gone the id may be used again.
type Handle struct {
	id  RequestID
	eng *Engine
	// queuedAt is when Send or Receive made the handle (unix nanoseconds), for Health.
	queuedAt int64
	total    atomic.Int64 // a partial Send learns its size from the receiver's request
	// Streaming: layers is the plan's layer count; readyLayers the caller's latest
	// MarkLayersReady (Send only).
	receive     bool
	stream      bool
	layers      int64
	readyLayers atomic.Int64
	m           machine
	bytes       atomic.Int64
	err         atomic.Pointer[error]
	// blocksPoisoned: see Status.BlocksPoisoned.
	blocksPoisoned atomic.Bool
	// settledPoisoned: a sub-transfer ended with the caller's blocks poisoned for good (set
	// once, whatever number of its sub-transfers ended so; its blocks are counted then).
	settledPoisoned atomic.Bool
	// countedPoisoned: the handle is counted in Engine.poisonedForGood, which happens once it
	// is both settledPoisoned and Quarantined (countPoisonedLocked). h.mu.
	countedPoisoned bool
	// unclaimed: an exposure (Expose) no receiver has claimed yet (expose.go).
	unclaimed atomic.Bool

	done     chan struct{}
	quiesced chan struct{}
	// doneOnce and quiescedOnce close them: through the observer's queue (Engine.signal), or
	// at once when Cancel answers a FreeNow outcome (signalNowLocked), whichever comes first.
	doneOnce, quiescedOnce sync.Once
	// quiescent: the table said the handle quiesced (Quiesced closes then, or once the
	// observer has heard the moves before it). h.mu.
	quiescent bool

	mu              sync.Mutex // serialises every state change of the handle and its subs
	subs            []*xfer
	exited          int // subs whose goroutine has ended
	cancelRequested bool
	callerRefs      int
	engineRef       bool
	// releasePool ends the transport's hold on the caller's registered pool (transport.PoolHolder),
	// just before Quiesced closes; nil when there is none.
	releasePool func()
	// remembered: every caller reference went while the handle was not quiescent, so it is
	// counted in Engine.remembered until it is.
	remembered bool
	// spans are the blocks the handle names in its host pool (none with a Mover), held in
	// Engine.holds while it is quarantined; nBlocks counts its plans' blocks.
	spans   []blockSpan
	nBlocks int64
}

// ID returns the request id.
func (h *Handle) ID() RequestID { return h.id }

// Status returns the handle's state, progress and error with three atomic loads.
func (h *Handle) Status() Status {
	s := Status{State: h.m.load(), Bytes: h.bytes.Load(), Total: h.total.Load(), BlocksPoisoned: h.blocksPoisoned.Load()}
	if p := h.err.Load(); p != nil {
		s.Err = *p
	}
	return s
}

// Done is closed, once, when the caller's outcome is decided: a terminal state, or
// quarantined (failed for the caller, memory still pinned).
func (h *Handle) Done() <-chan struct{} { return h.done }

// Quiesced is closed, once, when the caller may free or reuse the request's KV blocks: no
// operation of the engine or the transport can touch them any more. It closes on every
// terminal state; for a quarantined transfer it closes when the transport proves it is done,
// or when the engine poisons the staging slots it could still write (in staging mode the
// transport only ever touches staging slots, never the caller's pool).
func (h *Handle) Quiesced() <-chan struct{} { return h.quiesced }

// Retain adds a caller reference. It fails (a caller's bug: the error says so) once the
// caller's references are all gone.
func (h *Handle) Retain() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.callerRefs <= 0 {
		return &requestError{ID: h.id, Err: errOverReleased}
	}
	h.callerRefs++
	return nil
}

// Release drops a caller reference. Releasing more often than retained returns an error
// and changes nothing. Releasing does not cancel the transfer.
func (h *Handle) Release() error {
	h.mu.Lock()
	if h.callerRefs <= 0 {
		h.mu.Unlock()
		return &requestError{ID: h.id, Err: errOverReleased}
	}
	h.callerRefs--
	gone := h.callerRefs == 0 && !h.engineRef
	if h.callerRefs == 0 && !h.quiescent {
		h.remembered = true
		h.eng.remembered.Add(1)
	}
	h.mu.Unlock()
	if gone {
		h.eng.forget(h)
	}
	return nil
}

// applyLocked moves the handle by ev and closes its channels as the table says. h.mu is held.
func (h *Handle) applyLocked(ev Event, cause error) bool {
	from, r := h.m.apply(ev)
	if !r.ok {
		return false
	}
	if cause != nil && (h.err.Load() == nil || ev == evQuarantine) {
		kept := cause // taking cause's own address put every call's cause on the heap, nil or not
		h.err.Store(&kept)
	}
	h.eng.account(from, r.next, h.queuedAt, h.unclaimed.Load())
	if r.next == Quarantined {
		h.eng.holds.hold(h) // its blocks are the transport's until it quiesces
		h.countPoisonedLocked()
	}
	h.eng.obs.OnTransition(h.id, -1, from, r.next, ev)
	if r.closesDone && !r.quiesces {
		h.eng.signal(h.closeDone)
	}
	if r.quiesces {
		if h.releasePool != nil {
			h.releasePool() // before Quiesced closes: a caller woken by it may unregister at once
			h.releasePool = nil
		}
		if from == Quarantined {
			h.eng.holds.release(h) // before the caller hears it may reuse them
		}
		if h.remembered {
			h.remembered = false
			h.eng.remembered.Add(-1)
		}
		h.quiescent = true
		if r.closesDone {
			// One signal for both: a caller woken by Done (FreeNow) finds Quiesced closed
			// too, where two signals left the observer queue's goroutine room to stop
			// between them (TestL10_UnclaimedExposureIsQueued saw Done without Quiesced
			// under CI load).
			h.eng.signal(h.closeDoneQuiesced)
		} else {
			h.eng.signal(h.closeQuiesced)
		}
	}
	return true
}

// countPoisonedLocked counts the handle in Engine.poisonedForGood once it is quarantined with
// a sub-transfer's blocks poisoned for good, in whichever order the two happen: a multi-peer
// handle is quarantined only when its last sibling has an outcome (L14), and counting it as
// settled before it counts as quarantined would hide another quarantined handle from the
// budget (Health subtracts the one from the other). h.mu is held.
func (h *Handle) countPoisonedLocked() {
	if h.countedPoisoned || !h.settledPoisoned.Load() || h.m.load() != Quarantined {
		return
	}
	h.countedPoisoned = true
	h.eng.poisonedForGood.Add(1)
}

func (h *Handle) closeDone()     { h.doneOnce.Do(func() { close(h.done) }) }
func (h *Handle) closeQuiesced() { h.quiescedOnce.Do(func() { close(h.quiesced) }) }

// closeDoneQuiesced closes both for a move that ends the transfer with its memory quiescent:
// Quiesced first, so that whoever sees Done closed sees Quiesced closed as well (a caller told
// FreeNow frees the blocks on Done alone).
func (h *Handle) closeDoneQuiesced() { h.closeQuiesced(); h.closeDone() }

// signalNowLocked closes Done and Quiesced at once, ahead of the observer's queue, for a
// handle the table has made terminal: Cancel is about to tell the caller it may free the
// blocks (FreeNow), and a caller that was told so finds both closed. The observer still hears
// every move, in order, later. h.mu is held.
func (h *Handle) signalNowLocked() {
	if h.m.load().Terminal() {
		h.closeDone()
		h.closeQuiesced()
	}
}

// subApplyLocked moves one sub-transfer by ev, then lets the handle follow. h.mu is held.
func (h *Handle) subApplyLocked(x *xfer, ev Event, cause error) bool {
	from, r := x.m.apply(ev)
	if !r.ok {
		return false
	}
	h.eng.obs.OnTransition(h.id, x.sub, from, r.next, ev)
	switch {
	case ev == evAdvertise:
		h.applyLocked(evAdvertise, nil)
	case ev == evProgress:
		h.applyLocked(evProgress, nil)
	case r.next == Quarantined || r.next.Terminal():
		if cause != nil && !errors.Is(cause, ErrSiblingFailed) {
			h.recordErrLocked(x, cause)
		}
		h.settleLocked()
	}
	return true
}

// recordErrLocked keeps the first real error and stops every sibling: a multi-peer request
// fails as a whole, but only once each sibling has stopped touching its memory (L14).
func (h *Handle) recordErrLocked(failed *xfer, cause error) {
	if h.err.Load() == nil {
		h.err.Store(&cause)
	}
	for _, x := range h.subs {
		if x != failed {
			x.stop(&requestError{ID: h.id, Err: ErrSiblingFailed})
		}
	}
}

// settleLocked derives the handle's state from its subs': it decides the outcome only when
// every sub has one, and resolves a quarantine only when every sub is terminal (L14).
func (h *Handle) settleLocked() {
	allOutcome, allTerminal, allCompleted, allCancelled, anyQuarantined := true, true, true, true, false
	for _, x := range h.subs {
		s := x.m.load()
		allOutcome = allOutcome && (s.Terminal() || s == Quarantined)
		allTerminal = allTerminal && s.Terminal()
		allCompleted = allCompleted && s == Completed
		allCancelled = allCancelled && s == Cancelled
		anyQuarantined = anyQuarantined || s == Quarantined
	}
	// Cancelled by the caller, or every sub cancelled on its own account (a Send whose
	// receiver withdrew its request: peerAbortErr).
	cancelled := h.cancelRequested || allCancelled
	var cause error
	if p := h.err.Load(); p != nil {
		cause = *p
	}
	switch st := h.m.load(); {
	case !allOutcome:
	case st == Quarantined:
		if allTerminal && cancelled {
			h.applyLocked(evResolveCancelled, nil)
		} else if allTerminal {
			h.applyLocked(evResolveFailed, nil)
		}
	case st.Terminal():
	case allCompleted:
		h.applyLocked(evComplete, nil)
	case st == Queued && cancelled:
		h.applyLocked(evCancelQueued, &requestError{ID: h.id, Err: ErrCancelled})
	case st == Queued:
		h.applyLocked(evFail, cause)
	case anyQuarantined:
		h.applyLocked(evQuarantine, &requestError{ID: h.id, Err: errors.Join(ErrQuarantined, cause)})
		if allTerminal { // cannot happen with a quarantined sub; kept for the table's sake
			h.settleLocked()
		}
	case cancelled:
		h.applyLocked(evCancelQuiescent, &requestError{ID: h.id, Err: ErrCancelled})
	default:
		h.applyLocked(evFail, cause)
	}
}

// MarkLayersReady tells a streaming Send (Spec.Stream) that layers [0, end) of its plan's
// selection hold their final KV: chunks that lie wholly in them may go. It never blocks, and
// a smaller end than already marked changes nothing. It fails on any other handle (not a
// streaming Send) and with layout.ErrOutOfRange for an end outside [0, layers].
func (h *Handle) MarkLayersReady(end int) error {
	if h.receive || !h.stream {
		return &requestError{ID: h.id, Err: errNotStreaming}
	}
	if end < 0 || int64(end) > h.layers {
		return &requestError{ID: h.id, Err: fmt.Errorf("%w: layer end %d outside [0, %d]", layout.ErrOutOfRange, end, h.layers)}
	}
	for i := 0; i < 64; i++ { // bounded: each lost race means another caller raised it
		cur := h.readyLayers.Load()
		if int64(end) <= cur {
			return nil
		}
		if h.readyLayers.CompareAndSwap(cur, int64(end)) {
			break
		}
	}
	for _, x := range h.subs {
		x.box.Push(event{ready: true})
	}
	return nil
}

// LayersReady reports, without blocking, how many leading layers of the plan's selection
// hold their final bytes: on a streaming Receive, the layers scattered so far (for a
// multi-peer Receive, the fewest over its sub-transfers, each counted in its own plan); on
// another Receive, all layers once completed, else 0; on a Send, the layers declared ready
// by MarkLayersReady or by fired Spec.Ready signals.
func (h *Handle) LayersReady() int {
	if !h.receive {
		return int(h.readyLayers.Load())
	}
	n := h.layers
	for _, x := range h.subs {
		n = min(n, x.layersReady.Load())
	}
	return int(n)
}

// unhold ends the pool hold of a handle that never started.
func (h *Handle) unhold() {
	for _, x := range h.subs { // onehop.go: a start that failed after its exposure took a word
		x.endOneHop()
	}
	if h.releasePool != nil {
		h.releasePool()
		h.releasePool = nil
	}
}
