// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"github.com/kvxfer/kvxfer/internal/cmastats"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// ucxImpl is the implementation behind a *ucx.Transport, as New drives it
// (internal/transportimpl): every capability the engine asks for, and what the tests read of
// it. The tests' wrappers embed it, so an engine over a wrapper still finds every capability.
type ucxImpl interface {
	transport.DeviceRMATransport
	transport.RMAEmulation
	transportimpl.RMAServing
	transport.RMAKeyPreparer
	transport.RMAMapper
	transport.RMALanes
	transport.RMAGenerations
	transport.GenerationWords
	transport.PoolHolder
	transport.TagReserver
	transport.TransportHealth
	transport.ControlBound
	transport.LargeSegmentSender
	transport.PeerCloser
	transport.ParamsIssuer
	CMAStats() cmastats.Stats
	WorkersReplaced() int
	DeviceMemory() bool
	Self() Peer
	StagingMemory() []byte
}

// ucxOf is the implementation behind tr.
func ucxOf(tr *ucx.Transport) ucxImpl { return transportimpl.Of(tr).(ucxImpl) }

// ucxContract is the transport contract behind tr, which the engine's tests drive by hand.
func ucxContract(tr *ucx.Transport) transport.Transport {
	return transportimpl.Of(tr).(transport.Transport)
}
