// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The Transport contract lives in package transport, so that a transport (package ucx, package
// mem, or a new one) is written against it without importing the engine. These aliases name
// the same types here, for callers that hand the engine a transport and read its results.
type (
	// RequestID names one request across the prefill and decode workers (transport.RequestID).
	RequestID = transport.RequestID
	// Peer is a transport's name for a remote engine (transport.Peer).
	Peer = transport.Peer
	// Tag names one data chunk on the wire (transport.Tag).
	Tag = transport.Tag
	// OpID names a posted operation (transport.OpID).
	OpID = transport.OpID
	// Memory is a completion's quiescence verdict (transport.Memory).
	Memory = transport.Memory
	// Completion reports the end of a posted operation (transport.Completion).
	Completion = transport.Completion
	// Inbound receives what arrives without a posted receive (transport.Inbound).
	Inbound = transport.Inbound
	// Transport moves bytes between engines (transport.Transport).
	Transport = transport.Transport
	// DirectTransport is the one-copy path's capability (transport.DirectTransport).
	DirectTransport = transport.DirectTransport
	// RMATransport is the direct path's RMA capability (transport.RMATransport).
	RMATransport = transport.RMATransport
	// RMAEmulation tells emulated gets apart (transport.RMAEmulation).
	RMAEmulation = transport.RMAEmulation
	// RMAKeyPreparer unpacks a peer's key ahead of the first get (transport.RMAKeyPreparer).
	RMAKeyPreparer = transport.RMAKeyPreparer
	// RMAMapper shows a peer's memory in this process (transport.RMAMapper).
	RMAMapper = transport.RMAMapper
	// RMALanes spreads gets over lanes (transport.RMALanes).
	RMALanes = transport.RMALanes
	// RMAGenerations validates RMA reads (transport.RMAGenerations).
	RMAGenerations = transport.RMAGenerations
	// GenerationWords counts a transport's generation words (transport.GenerationWords).
	GenerationWords = transport.GenerationWords
	// DeviceRMATransport gets into and out of registered device memory (transport.DeviceRMATransport).
	DeviceRMATransport = transport.DeviceRMATransport
	// TagReserver reserves narrow data tags (transport.TagReserver).
	TagReserver = transport.TagReserver
	// ControlBound bounds control messages (transport.ControlBound).
	ControlBound = transport.ControlBound
	// TransportHealth reports a transport that cannot deliver (transport.TransportHealth).
	TransportHealth = transport.TransportHealth
	// PoolHolder holds registered pools while a transfer may touch them
	// (transport.PoolHolder).
	PoolHolder = transport.PoolHolder
	// PeerConnectReporter is the engine Inbound's report of a reached peer
	// (transport.PeerConnectReporter).
	PeerConnectReporter = transport.PeerConnectReporter
	// PeerCloser is transport.PeerCloser.
	PeerCloser = transport.PeerCloser
	// RegionError says why a registration was refused (transport.RegionError).
	RegionError = transport.RegionError
	// ControlSizeError refuses a control message over the transport's bound
	// (transport.ControlSizeError).
	ControlSizeError = transport.ControlSizeError
)

// DataHeaderBytes is the size of a data chunk's header; the payload follows it in the same
// staging slot, so a slot carries Config.SlotBytes-DataHeaderBytes bytes of KV per chunk.
const DataHeaderBytes = transport.DataHeaderBytes

// The quiescence verdicts a completion carries (see transport.Memory).
const (
	MemoryDone    = transport.MemoryDone
	MemoryBusy    = transport.MemoryBusy
	MemoryUnknown = transport.MemoryUnknown
)

// Errors of caller-memory registration (transport.ErrBadRegion and the others); the error is
// a *RegionError.
var (
	ErrBadRegion   = transport.ErrBadRegion
	ErrGoMemory    = transport.ErrGoMemory
	ErrRegionInUse = transport.ErrRegionInUse
	// ErrControlTooLarge: a control message over the transport's bound; the error is a
	// *ControlSizeError.
	ErrControlTooLarge = transport.ErrControlTooLarge
)
