// SPDX-License-Identifier: Apache-2.0

package transport

import (
	"errors"
	"fmt"
)

// Errors that transports report and the engine passes on. Package transfer re-exports each
// one under the same name (transfer.ErrClosed is transport.ErrClosed), so a caller's
// errors.Is matches whichever layer the error came from: there is one sentinel per meaning.
var (
	// ErrClosed: the engine or the transport is closed.
	ErrClosed = errors.New("kvxfer: closed")
	// ErrCancelled: the operation or transfer was cancelled.
	ErrCancelled = errors.New("kvxfer: transfer cancelled")
	// ErrPeerLost: the transport lost the peer.
	ErrPeerLost = errors.New("kvxfer: peer lost")
	// ErrEndpointRetired: OnPeerLost's error matches it when this side ended its own
	// endpoint to the peer (the UCX transport replacing a wedged worker): the transfers on it
	// fail, but the peer may well be alive, so the engine does not remember it lost.
	ErrEndpointRetired = errors.New("kvxfer: this side retired its endpoint to the peer")
	// ErrProtocol: a peer sent a message that breaks the wire protocol.
	ErrProtocol = errors.New("kvxfer: protocol violation")
	// ErrInvalidSpec: a transfer's spec, or an argument a transport call got from it (a peer
	// name the transport cannot parse, an empty IOV), is malformed.
	ErrInvalidSpec = errors.New("kvxfer: invalid transfer spec")
	// ErrInvalidConfig: a configuration field cannot work; the error is a *ConfigError
	// naming it.
	ErrInvalidConfig = errors.New("kvxfer: invalid configuration")
	// ErrControlTooLarge: a control message does not fit the transport's bound (ControlBound);
	// the error is a *ControlSizeError. Nothing was sent.
	ErrControlTooLarge = errors.New("kvxfer: control message too large")
	// ErrQuiescenceUnknown: a copy's end cannot be told (a GPU kernel that overran its
	// timeout may still write). The engine then never releases the memory: it poisons it.
	ErrQuiescenceUnknown = errors.New("kvxfer: the mover cannot say whether its copy ended")
	// ErrTagCollision: a transport's data tags for a transfer would match another live
	// transfer's (TagReserver); the engine draws another nonce and tries again.
	ErrTagCollision = errors.New("kvxfer: data tags collide with another transfer's")
	// ErrTransportWedged: the transport can tell that nothing will reach this engine any more
	// (the UCX transport's receive probe); the engine's Health reports it until the process
	// restarts.
	ErrTransportWedged = errors.New("kvxfer: transport wedged")
	// ErrNoGenerationWord: every generation word of the transport is held by an exposure
	// (RMAGenerations.ExposeGeneration); the offer that needed one is declined.
	ErrNoGenerationWord = errors.New("kvxfer: every generation word is held")
)

// Errors of caller-memory registration (the UCX transport's RegisterHost, RegisterDevice).
// The error is a *RegionError naming the range and the reason.
var (
	// ErrBadRegion: the range cannot be registered as given: zero length, a start off the
	// required alignment, or bounds that overlap another registration without lying inside it.
	ErrBadRegion = errors.New("kvxfer: bad memory region")
	// ErrGoMemory: the range lies in the Go heap. cgo's pointer rules forbid C code (so UCX)
	// to keep Go memory past a call: the collector may free or reuse it once Go drops its last
	// reference, while a registration and a peer's gets outlive every call. Map the pool
	// outside Go (mmap, C malloc, cudaMalloc) or let the transport allocate it (AllocatePool).
	ErrGoMemory = errors.New("kvxfer: Go memory cannot be registered")
	// ErrRegionInUse: the region cannot be unregistered while a transfer holds it (from its
	// start until its Quiesced channel closes, never for a transfer whose blocks are poisoned
	// for good) or while UCX still holds an operation on it.
	ErrRegionInUse = errors.New("kvxfer: registered region in use")
)

// ConfigError names the configuration field that is wrong, its value, and the fix. It is the
// one type of configuration error of kvxfer's engine, its transports, package observe and the
// soak (package buffer, below them, has its own, which a ConfigError carries as its Cause).
type ConfigError struct {
	Field  string
	Value  any
	Reason string
	// Cause is the lower layer's error when one found the fault (a *buffer.ConfigError
	// matching buffer.ErrUndersized when the staging pool is below the concurrency), or nil.
	Cause error
}

// Error implements error. It leaves out a nil Value (a field that is missing).
func (e *ConfigError) Error() string {
	field := e.Field
	if e.Value != nil {
		field = fmt.Sprintf("%s = %v", e.Field, e.Value)
	}
	if e.Cause != nil {
		return fmt.Sprintf("%v: %s: %s: %v", ErrInvalidConfig, field, e.Reason, e.Cause)
	}
	return fmt.Sprintf("%v: %s: %s", ErrInvalidConfig, field, e.Reason)
}

// Unwrap returns ErrInvalidConfig and the cause, if any.
func (e *ConfigError) Unwrap() []error {
	if e.Cause != nil {
		return []error{ErrInvalidConfig, e.Cause}
	}
	return []error{ErrInvalidConfig}
}

// ControlSizeError says that a control message of Bytes does not fit the Room the transport
// takes now. It matches ErrControlTooLarge.
type ControlSizeError struct {
	Bytes, Room int
	Reason      string // what bounds the room ("with the sender address", say), or empty
}

// Error implements error.
func (e *ControlSizeError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%v: %d bytes, at most %d %s", ErrControlTooLarge, e.Bytes, e.Room, e.Reason)
	}
	return fmt.Sprintf("%v: %d bytes, at most %d", ErrControlTooLarge, e.Bytes, e.Room)
}

// Unwrap returns ErrControlTooLarge.
func (e *ControlSizeError) Unwrap() error { return ErrControlTooLarge }

// RegionError says why a registration or an unregistration was refused. It unwraps to
// ErrBadRegion, ErrGoMemory, ErrRegionInUse or ErrClosed, or, for device memory that this UCX
// cannot reach, the UCX transport's device-memory error.
type RegionError struct {
	Op     string // "register" or "unregister"
	Addr   uint64
	Len    int64
	Reason string
	Err    error
}

// Error implements error.
func (e *RegionError) Error() string {
	return fmt.Sprintf("kvxfer: %s [%#x, +%d): %s: %v", e.Op, e.Addr, e.Len, e.Reason, e.Err)
}

// Unwrap returns the sentinel or cause.
func (e *RegionError) Unwrap() error { return e.Err }
