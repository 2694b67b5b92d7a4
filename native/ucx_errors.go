// SPDX-License-Identifier: Apache-2.0

package native

import (
	"errors"
	"fmt"
)

// Errors of the UCX transport (ErrNotSupported, in errors.go, is shared with the host path). A
// failure reported by UCX is a *StatusError carrying the ucs_status_t, which matches one of
// these through errors.Is; test for the sentinel, never for the code.
var (
	// ErrPeerUnreachable: the peer is gone or cannot be reached (connection reset, endpoint
	// timeout, unreachable address). Retrying on the same endpoint is pointless.
	ErrPeerUnreachable = errors.New("kvxfer: peer unreachable")
	// ErrCancelled: the operation was cancelled, by Cancel or by closing its endpoint. (The
	// UCX transport reports it to the engine as transport.ErrCancelled, wrapping it.)
	ErrCancelled = errors.New("kvxfer: ucx operation cancelled")
	// ErrTimeout: a bounded wait ran out before the operation finished.
	ErrTimeout = errors.New("kvxfer: timed out")
	// ErrTruncated: a message was larger than the receive buffer posted for it.
	ErrTruncated = errors.New("kvxfer: message truncated")
	// ErrClosed: the context, worker, endpoint or memory was closed. It is not the engine's
	// ErrClosed (the engine or its transport closed): the UCX transport reports a closed
	// endpoint to the engine as a lost peer.
	ErrClosed = errors.New("kvxfer: ucx object closed")
	// ErrBusy: memory cannot be released while operations still use it.
	ErrBusy = errors.New("kvxfer: in use")
	// ErrInvalidArgument: a range, size or address given to the transport is wrong.
	ErrInvalidArgument = errors.New("kvxfer: invalid argument")
	// ErrBadAddress: a peer's worker address is not one this UCX can read (garbage, another
	// UCX version's, cut short); the error is an *AddressError. UCX itself would abort the
	// process on some of these, so Connect checks before UCX sees the bytes.
	ErrBadAddress = errors.New("kvxfer: malformed worker address")
	// ErrBadRemoteKey: a peer's packed remote key is not one this UCX packs (garbage, cut
	// short, a field changed); the error is a *RemoteKeyError.
	ErrBadRemoteKey = errors.New("kvxfer: malformed remote key")
	// ErrOutOfBounds: a range through a peer's key lies outside the memory the key names;
	// the error is a *BoundsError.
	ErrOutOfBounds = errors.New("kvxfer: range outside the peer's memory")
	// ErrUCX: any other UCX failure.
	ErrUCX = errors.New("kvxfer: ucx error")
)

// UCX status codes (ucs_status_t) that the transport tells apart. They are fixed by UCX's
// ABI; a test checks them against the header.
const (
	statusOK                 = 0
	statusInProgress         = 1
	statusIOError            = -3
	statusNoMemory           = -4
	statusInvalidParam       = -5
	statusUnreachable        = -6
	statusNotImplemented     = -8
	statusMessageTruncated   = -9
	statusCanceled           = -16
	statusTimedOut           = -20
	statusUnsupported        = -22
	statusRejected           = -23
	statusNotConnected       = -24
	statusConnectionReset    = -25
	statusFirstLinkFailure   = -40
	statusLastEndpointFailed = -89
)

// StatusError is a failure reported by UCX: the operation that failed and its ucs_status_t.
type StatusError struct {
	Op     string // what kvxfer was doing, e.g. "tag send"
	Status int    // the ucs_status_t, negative
	Text   string // ucs_status_string(Status)
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("kvxfer: ucx %s: %s (status %d)", e.Op, e.Text, e.Status)
}

// Is maps the status onto the sentinels above, so callers test errors.Is(err, ErrCancelled).
func (e *StatusError) Is(target error) bool { return target == sentinelFor(e.Status) }

func sentinelFor(status int) error {
	switch {
	case status == statusCanceled:
		return ErrCancelled
	case status == statusTimedOut:
		return ErrTimeout
	case status == statusUnsupported || status == statusNotImplemented:
		return ErrNotSupported
	case status == statusMessageTruncated:
		return ErrTruncated
	case status == statusInvalidParam:
		return ErrInvalidArgument
	case status == statusUnreachable || status == statusRejected || status == statusNotConnected ||
		status == statusConnectionReset || status == statusIOError ||
		(status <= statusFirstLinkFailure && status >= statusLastEndpointFailed):
		// Link and endpoint failures (-40..-89) include UCS_ERR_ENDPOINT_TIMEOUT, what
		// keepalive reports for a peer that died without closing its connection.
		return ErrPeerUnreachable
	}
	return ErrUCX
}

// BoundsError is a range [Addr, Addr+Len) refused because it does not lie inside the peer's
// memory [Base, Base+Size) that its key names. It matches ErrOutOfBounds.
type BoundsError struct {
	Addr, Len  uint64
	Base, Size uint64
}

func (e *BoundsError) Error() string {
	return fmt.Sprintf("%v: [%#x, +%d) is not inside [%#x, +%d)", ErrOutOfBounds, e.Addr, e.Len, e.Base, e.Size)
}

// Unwrap returns ErrOutOfBounds.
func (e *BoundsError) Unwrap() error { return ErrOutOfBounds }
