// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
)

// Errors of caller-memory registration (UCXTransport.RegisterHost, RegisterDevice). The
// error is a *RegionError naming the range and the reason.
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

// RegionError says why a registration or an unregistration was refused. It unwraps to
// ErrBadRegion, ErrGoMemory, ErrRegionInUse or ErrClosed, or, for device memory that this UCX
// cannot reach, a *DeviceMemoryError (ErrDeviceMemory).
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

// PoolHolder is an optional extension of Transport for pools the caller registered with the
// transport and may unregister (UCXTransport's regions). The engine holds a Spec's pool from
// the start of the transfer until its Quiesced channel closes, so the transport can refuse to
// unregister memory a transfer, or a peer reading it, may still touch. A transfer whose
// blocks are poisoned for good never lets go.
type PoolHolder interface {
	// HoldPool marks pool as used by one transfer and returns the call that ends the use, or
	// nil when pool is not memory the caller can unregister. It never blocks for long.
	HoldPool(pool []byte) (release func())
}
