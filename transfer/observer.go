// SPDX-License-Identifier: Apache-2.0

package transfer

import "time"

// Observer hears about everything the engine does to transfers, so a metrics package can be
// added without touching the state machine. The engine calls it from a goroutine of its own,
// one event at a time, in the order the events happened, and never under a lock that Cancel,
// Status or a transfer needs: a slow observer delays no transfer and no Cancel. It does delay
// what is queued behind it, a handle's Done and Quiesced included (they close only once the
// observer has heard every move of that handle before them), and Close waits for it within its
// share of CloseTimeout (at least a quarter, which Close's earlier steps cannot eat). One
// exception: when Cancel answers an outcome that lets the caller free the blocks at once
// (CancelOutcome.FreeNow), Done and Quiesced are closed by the time it returns, and the
// observer hears those moves afterwards, still in order. So implementations should be fast;
// they may call Status and Cancel, not Close.
//
// An Observer may also have any of these methods, which the engine then calls under the same
// rules (package observe's observers have them all):
//
//	OnStart(info StartInfo)                        // a request accepted, before its first transition
//	OnPeerConnected(peer Peer)                     // the transport reached peer
//	OnPeerLost(peer Peer, err error)               // the transport lost peer: once per loss
//	OnHelloRefused(peer Peer, reason string)       // a hello proof that answered no challenge of ours:
//	                                               // "unsolicited", "mismatch" or "replayed"
//	OnAuthRefused(err *AuthError)                  // a message or ContextParams no cluster key sealed
type Observer interface {
	// OnTransition reports a handle's (sub == -1) or a sub-transfer's state change.
	OnTransition(id RequestID, sub int, from, to State, ev Event)
	// OnCancel reports the outcome of Engine.Cancel.
	OnCancel(id RequestID, outcome CancelOutcome)
	// OnQuarantine reports a sub-transfer entering quarantine, and why.
	OnQuarantine(id RequestID, sub int, cause error)
	// OnPoison reports a staging slot taken out of circulation for good, or (slot -1) a
	// direct transfer's KV blocks that the transport may still touch (Status.BlocksPoisoned).
	OnPoison(id RequestID, slot int, reason string)
	// OnProgress reports a chunk moved.
	OnProgress(id RequestID, bytes int64, at time.Time)
}

// nopObserver ignores everything; it stands for a Config without an Observer.
type nopObserver struct{}

// OnTransition implements Observer.
func (nopObserver) OnTransition(RequestID, int, State, State, Event) {}

// OnCancel implements Observer.
func (nopObserver) OnCancel(RequestID, CancelOutcome) {}

// OnQuarantine implements Observer.
func (nopObserver) OnQuarantine(RequestID, int, error) {}

// OnPoison implements Observer.
func (nopObserver) OnPoison(RequestID, int, string) {}

// OnProgress implements Observer.
func (nopObserver) OnProgress(RequestID, int64, time.Time) {}
