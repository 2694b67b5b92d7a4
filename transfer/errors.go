// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Errors of the engine. Typed errors below map onto them through errors.Is; errors reported in
// a handle's Status wrap one of them with %w. Those a transport reports too are package
// transport's, re-exported here: the same value, so errors.Is matches either name.
var (
	// ErrInvalidConfig: a Config field cannot work; the error is a *ConfigError naming it
	// (also when the staging pool found the fault: its *buffer.ConfigError is the cause).
	ErrInvalidConfig = transport.ErrInvalidConfig
	// ErrInvalidSpec: a Send or Receive spec is malformed; the error names the field
	// and why.
	ErrInvalidSpec = transport.ErrInvalidSpec
	// ErrDuplicate: a Send or Receive names a request id that is still live in this engine:
	// held by a caller reference, or not quiescent (the engine remembers such a handle
	// whatever its caller released, and one whose blocks are poisoned for good for ever).
	ErrDuplicate = errors.New("kvxfer: duplicate request id")
	// ErrBlocksBusy: a Send or Receive names KV blocks of its pool that an earlier transfer
	// may still touch: one whose outcome is decided but which is not quiescent (quarantined),
	// or one whose blocks are poisoned for good. The error names the block and
	// the request that holds it.
	ErrBlocksBusy = errors.New("kvxfer: KV blocks not quiescent")
	// ErrClosed: the engine (or transport) is closed.
	ErrClosed = transport.ErrClosed
	// ErrQueueTimeout: the transfer never started: no slot freed or no peer request arrived
	// before the Send/Receive context or Config.QueueTimeout ended.
	ErrQueueTimeout = errors.New("kvxfer: transfer did not start in time")
	// ErrDeadline: the transfer passed its deadline, counted from the moment it started.
	ErrDeadline = errors.New("kvxfer: transfer deadline exceeded")
	// ErrCancelled: the caller cancelled the transfer.
	ErrCancelled = transport.ErrCancelled
	// ErrQuarantined: the transfer failed while the transport could still touch its memory;
	// the handle's Quiesced channel closes once that is ruled out.
	ErrQuarantined = errors.New("kvxfer: transfer quarantined")
	// ErrPeerAborted: the peer aborted the transfer; the error says why.
	ErrPeerAborted = errors.New("kvxfer: peer aborted the transfer")
	// ErrPeerLost: the transport lost the peer.
	ErrPeerLost = transport.ErrPeerLost
	// ErrIncompatible: the receiver's layout cannot be produced from the sender's.
	ErrIncompatible = errors.New("kvxfer: incompatible layouts")
	// ErrProtocol: a peer sent a message that breaks the wire protocol.
	ErrProtocol = transport.ErrProtocol
	// ErrQuiescenceUnknown: a Mover cannot say whether its copy has ended (a GPU kernel that
	// overran its timeout may still write). The engine then never releases the staging slot
	// nor the caller's blocks: it poisons both, keeps the handle quarantined for good, and
	// Health reports the mover wedged.
	ErrQuiescenceUnknown = transport.ErrQuiescenceUnknown
	// ErrUnauthenticated: with Config.ClusterKeys set, a peer's hello, hello challenge or proof,
	// or a ContextParams blob (Engine.VerifyParams), was not sealed by a key this engine holds;
	// the error is an *AuthError. The engine drops the message and counts it; nothing it knows
	// of the peer changes.
	ErrUnauthenticated = transport.ErrUnauthenticated
	// ErrAlreadyClaimed: the Receive claimed an exposure (Engine.Expose) that another
	// receiver had claimed first; the sender refused it and counted it, and its transfer to
	// the first receiver goes on.
	ErrAlreadyClaimed = errors.New("kvxfer: the exposure was claimed by another receiver")
	// ErrSiblingFailed: another sub-transfer of the same multi-peer request failed, so this
	// one was stopped.
	ErrSiblingFailed = errors.New("kvxfer: a sibling sub-transfer failed")
	// ErrNothingToMove: a partial Receive holds every block of the request already. It is
	// refused rather than completed at once, because the sender would still wait for a
	// request that never comes: the caller should not start the transfer at all.
	ErrNothingToMove = errors.New("kvxfer: the receiver already holds every block")
)

// Errors the engine returns with a message that says all a caller needs, and no caller has a
// reason to match: misuse of a handle, a failed readiness signal (the error wraps the
// signal's own), and the transport's reports the engine handles itself.
var (
	// errOverReleased: Handle.Release called more times than Retain (plus the first
	// reference), or Retain on a handle whose references are all gone.
	errOverReleased = errors.New("kvxfer: handle released more often than retained")
	// errTagCollision: a transport's data tags for a transfer would match another live
	// transfer's (transport.TagReserver); the engine draws another nonce and tries again.
	errTagCollision = transport.ErrTagCollision
	// errNotStreaming: a streaming call (MarkLayersReady) on a handle whose Spec did not set
	// Stream.
	errNotStreaming = errors.New("kvxfer: not a streaming send")
	// errReadySignal: a readiness signal (a CUDA event, say) reported an error, so the layers
	// it guards will never be ready.
	errReadySignal = errors.New("kvxfer: readiness signal failed")
	// errTransportWedged: the transport can tell that nothing will reach this engine any more
	// (ucx.Transport's receive probe); Health reports it until the process restarts.
	errTransportWedged = transport.ErrTransportWedged
)

// ConfigError names the Config field that is wrong, its value, and the fix. It is the one type
// of configuration error the engine and its transports return (transport.ConfigError).
type ConfigError = transport.ConfigError

// specError names the Spec field that is wrong and why; Err is ErrInvalidSpec, or a layout
// error when the plan or pool is at fault.
type specError struct {
	ID     RequestID
	Field  string
	Reason string
	Err    error
}

// Error implements error.
func (e *specError) Error() string {
	return fmt.Sprintf("%v: request %d: %s: %s", ErrInvalidSpec, e.ID, e.Field, e.Reason)
}

// Is matches ErrInvalidSpec as well as the wrapped cause.
func (e *specError) Is(target error) bool { return target == ErrInvalidSpec }

// Unwrap returns the underlying cause, if any.
func (e *specError) Unwrap() error { return e.Err }

// blocksBusyError names a block of a refused Send or Receive that an earlier request still
// holds, and that request. It matches ErrBlocksBusy.
type blocksBusyError struct {
	ID     RequestID // the refused request
	Block  int32     // a block id it shares with Holder, in the same pool
	Holder RequestID // the request not quiescent over that block
	// Poisoned: Holder's blocks are poisoned for good (L9); they are never to be used again.
	// Otherwise Holder is quarantined and its Quiesced channel will close.
	Poisoned bool
}

// Error implements error.
func (e *blocksBusyError) Error() string {
	why := "quarantined: wait for its Quiesced"
	if e.Poisoned {
		why = "poisoned for good: never use them again"
	}
	return fmt.Sprintf("%v: request %d: block %d is held by request %d, %s", ErrBlocksBusy, e.ID, e.Block, e.Holder, why)
}

// Unwrap returns ErrBlocksBusy.
func (e *blocksBusyError) Unwrap() error { return ErrBlocksBusy }

// requestError ties an engine error to a request id.
type requestError struct {
	ID  RequestID
	Err error
}

// Error implements error.
func (e *requestError) Error() string { return fmt.Sprintf("request %d: %v", e.ID, e.Err) }

// Unwrap returns the sentinel.
func (e *requestError) Unwrap() error { return e.Err }

// ClusterKeyBytes is the size of each of Config.ClusterKeys.
const ClusterKeyBytes = wire.ClusterKeyBytes

// AuthError is a peer's message or a ContextParams blob refused for want of authentication
// (transport.AuthError). It matches ErrUnauthenticated.
type AuthError = transport.AuthError

// PeerLostError says that the transport reported Peer lost, when, and why. A Send or Receive
// with a peer the engine remembers lost (Config.Tuning.LostPeerTTL) fails at once with it, and so does
// every transfer the loss ends (however the transport reported it: a failed operation, or the
// loss itself); it matches ErrPeerLost.
type PeerLostError struct {
	Peer  Peer
	since time.Time // when the transport reported it
	err   error     // the transport's report
}

func (e *PeerLostError) Error() string {
	return fmt.Sprintf("kvxfer: peer %s was lost %v ago: %v", e.Peer.Short(), time.Since(e.since).Round(time.Millisecond), e.err)
}

// Unwrap matches ErrPeerLost and the transport's report.
func (e *PeerLostError) Unwrap() []error { return []error{ErrPeerLost, e.err} }

// peerLost returns cause as a *PeerLostError naming peer when it says the transport lost the
// peer and is not one yet, so a caller's errors.As names the peer whichever way the loss came.
func peerLost(peer Peer, cause error) error {
	var pl *PeerLostError
	if peer == "" || !errors.Is(cause, ErrPeerLost) || errors.As(cause, &pl) {
		return cause
	}
	return &PeerLostError{Peer: peer, since: time.Now(), err: cause}
}
