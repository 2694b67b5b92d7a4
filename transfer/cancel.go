// SPDX-License-Identifier: Apache-2.0

package transfer

import "fmt"

// CancelOutcome is what Engine.Cancel did. Exactly one is returned, and it tells the caller
// what it may do with the request's KV blocks.
type CancelOutcome int

// The six outcomes, then their count. Only NotFound, AlreadyComplete and CancelledBeforeAdvertise let the caller
// free the request's KV blocks at once; after the others it stops scheduling the request and
// frees the blocks when the handle's Quiesced channel closes.
const (
	// NotFound: no live handle has that id. Nothing of the engine's touches the blocks.
	NotFound CancelOutcome = iota
	// AlreadyComplete: the handle had already reached a terminal state (completed, failed or
	// cancelled) and its memory is quiescent.
	AlreadyComplete
	// CancelledBeforeAdvertise: the transfer was still queued; nothing was posted, and it is
	// now cancelled and quiescent.
	CancelledBeforeAdvertise
	// CancelRequestedInFlight: the cancel was handed to the transfer's goroutine, which stops
	// its operations; wait for Quiesced.
	CancelRequestedInFlight
	// BackendUnhealthy: as CancelRequestedInFlight, but the engine is unhealthy, so
	// confirmation may take until the quarantine timeout poisons the slots; wait for Quiesced.
	BackendUnhealthy
	// NotCancellable: the transfer is quarantined: its outcome is decided and its memory
	// is pinned until the transport lets go; wait for Quiesced.
	NotCancellable

	// CancelOutcomeCount is the number of outcomes, not one: every outcome is below it. A
	// new outcome goes just before it, with its name in outcomeNames; a test holds each
	// outcome below the count to a distinct name, and the metrics (package observe) make a
	// series for each, labelled with it.
	CancelOutcomeCount
)

var outcomeNames = []string{"not-found", "already-complete", "cancelled-before-advertise",
	"cancel-requested-in-flight", "backend-unhealthy", "not-cancellable"}

// String names the outcome.
func (o CancelOutcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("cancel-outcome(%d)", int(o))
}

// FreeNow reports whether the caller may free the request's KV blocks as soon as Cancel
// returns, without waiting for Quiesced. When Cancel returns such an outcome for a handle,
// that handle's Done and Quiesced are already closed, whatever the Observer is doing.
func (o CancelOutcome) FreeNow() bool {
	return o == NotFound || o == AlreadyComplete || o == CancelledBeforeAdvertise
}
