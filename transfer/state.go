// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"sync/atomic"
)

// This file is the lifecycle. The states, the events, the one table of allowed
// (state, event) -> state moves, and the one function that applies them live here; no other
// code writes a state. A handle and each of its sub-transfers run the same machine; the
// handle's also closes its channels, as the table says.

// State is where a transfer is in its lifecycle.
type State int32

// The lifecycle states. Completed, Failed and Cancelled are terminal. Quarantined is not: the
// caller has been told the transfer failed (Done is closed), but the transport may still touch
// the transfer's memory; it leaves Quarantined for Failed or Cancelled once that is ruled out,
// by the transport proving it is done or by the engine poisoning the staging slots.
const (
	// Queued: accepted, waiting for a staging slot (and, on the sending side, for the
	// receiver's request). Nothing has been posted; a cancel here frees everything at once.
	Queued State = iota
	// Advertised: a slot is leased and the first receive is posted or the request was sent.
	Advertised
	// InFlight: at least one chunk has moved.
	InFlight
	// Completed: every byte arrived (receiver) or was confirmed (sender).
	Completed
	// Failed: the transfer failed and its memory is quiescent.
	Failed
	// Cancelled: the caller cancelled it and its memory is quiescent.
	Cancelled
	// Quarantined: failed or cancelled for the caller, memory still pinned.
	Quarantined
	numStates
)

var stateNames = [numStates]string{"queued", "advertised", "in-flight", "completed", "failed", "cancelled", "quarantined"}

// String returns the state's name.
func (s State) String() string {
	if s >= 0 && s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", int32(s))
}

// Terminal reports whether s is final: Completed, Failed or Cancelled.
func (s State) Terminal() bool { return s == Completed || s == Failed || s == Cancelled }

// active reports whether a transfer in s holds (or is about to hold) transport resources.
func (s State) active() bool { return s == Advertised || s == InFlight }

// Event is what happened to a transfer; the table says where it moves it. An Observer hears
// it with each transition; String names it: advertise, progress, complete, cancel-queued,
// fail, cancel-quiescent, quarantine, resolve-failed or resolve-cancelled.
type Event int32

// The lifecycle events.
const (
	// evAdvertise: a slot was leased and the transfer is about to post or request.
	evAdvertise Event = iota
	// evProgress: a chunk moved.
	evProgress
	// evComplete: every byte moved and every operation is done with the memory.
	evComplete
	// evCancelQueued: the caller cancelled before anything was posted.
	evCancelQueued
	// evFail: the transfer failed and no operation can touch its memory any more.
	evFail
	// evCancelQuiescent: a cancel in flight took effect and the memory is quiescent.
	evCancelQuiescent
	// evQuarantine: the transfer failed or was cancelled while operations may still touch
	// its memory.
	evQuarantine
	// evResolveFailed: a quarantined failure's memory is quiescent now (operations done, or
	// their slots poisoned).
	evResolveFailed
	// evResolveCancelled: a quarantined cancel's memory is quiescent now.
	evResolveCancelled
	numEvents
)

var eventNames = [numEvents]string{"advertise", "progress", "complete", "cancel-queued", "fail",
	"cancel-quiescent", "quarantine", "resolve-failed", "resolve-cancelled"}

// String returns the event's name.
func (e Event) String() string {
	if e >= 0 && e < numEvents {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", int32(e))
}

// rule is one allowed move and what it means for the handle's channels.
type rule struct {
	ok         bool
	next       State
	closesDone bool // the caller's outcome is decided
	quiesces   bool // the caller may free or reuse its KV blocks
}

// transitions is the lifecycle: every (state, event) pair not listed is refused.
var transitions = func() (t [numStates][numEvents]rule) {
	allow := func(from State, ev Event, to State, done, quiet bool) {
		t[from][ev] = rule{ok: true, next: to, closesDone: done, quiesces: quiet}
	}
	allow(Queued, evAdvertise, Advertised, false, false)
	allow(Queued, evCancelQueued, Cancelled, true, true)
	allow(Queued, evFail, Failed, true, true)
	for _, s := range []State{Advertised, InFlight} {
		allow(s, evProgress, InFlight, false, false)
		allow(s, evComplete, Completed, true, true)
		allow(s, evFail, Failed, true, true)
		allow(s, evCancelQuiescent, Cancelled, true, true)
		allow(s, evQuarantine, Quarantined, true, false)
	}
	allow(Quarantined, evResolveFailed, Failed, false, true)
	allow(Quarantined, evResolveCancelled, Cancelled, false, true)
	return t
}()

// machine holds one state. Only apply writes it; Status reads it with one atomic load.
type machine struct {
	state atomic.Int32
}

func (m *machine) load() State { return State(m.state.Load()) }

// apply moves m by ev if the table allows it and returns the rule taken. The caller holds the
// lock of the handle m belongs to, so decisions based on the current state cannot race.
func (m *machine) apply(ev Event) (from State, r rule) {
	from = m.load()
	if from < 0 || from >= numStates || ev < 0 || ev >= numEvents {
		return from, rule{}
	}
	r = transitions[from][ev]
	if r.ok {
		m.state.Store(int32(r.next))
	}
	return from, r
}
