// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"errors"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Sentinel errors of the soak.
var (
	// ErrInvalidConfig: a Config field cannot work; the ConfigError names it. It is the
	// engine's (transfer.ErrInvalidConfig).
	ErrInvalidConfig = transfer.ErrInvalidConfig
	// ErrBreach: the soak ran and at least one invariant was broken; the Report lists them.
	ErrBreach = errors.New("stress: invariant breached")
)

// ConfigError names the Config field that cannot work and why. It matches ErrInvalidConfig:
// it is transfer.ConfigError.
type ConfigError = transfer.ConfigError

// untypedError is errorClass's answer for an error that matches no sentinel.
const untypedError = "untyped"

// typedErrors are the sentinels a failed transfer's error may match, in the order errorClass
// tries them (the most specific first).
var typedErrors = []struct {
	name string
	err  error
}{
	{"quarantined", transfer.ErrQuarantined}, {"peer-lost", transfer.ErrPeerLost}, {"peer-aborted", transfer.ErrPeerAborted},
	{"deadline", transfer.ErrDeadline}, {"queue-timeout", transfer.ErrQueueTimeout}, {"cancelled", transfer.ErrCancelled},
	{"closed", transfer.ErrClosed}, {"sibling-failed", transfer.ErrSiblingFailed}, {"protocol", transfer.ErrProtocol},
	{"incompatible", transfer.ErrIncompatible}, {"quiescence-unknown", transfer.ErrQuiescenceUnknown},
	{"transport-wedged", transport.ErrTransportWedged}, {"tag-collision", transport.ErrTagCollision},
	{"stale-read", transfer.ErrStaleRead}, // a bad RMA offer is a "protocol" violation
	{"peer-lacks-feature", transfer.ErrPeerLacksFeature}, {"bad-region", transport.ErrBadRegion},
}

// errorClass names the kvxfer sentinel err matches: "-" for no error, untypedError for an
// error that matches none (a failure a caller cannot act on: a breach on the lossy link).
func errorClass(err error) string {
	if err == nil {
		return "-"
	}
	for _, t := range typedErrors {
		if errors.Is(err, t.err) {
			return t.name
		}
	}
	return untypedError
}
