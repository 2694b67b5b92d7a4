// SPDX-License-Identifier: Apache-2.0

// Package ucx is kvxfer's UCX transport: a transport.Transport over one UCX context and
// worker (package native holds every cgo call), with the engine's optional capabilities
// (the direct path's IOV messages and RMA gets over lanes, or by process_vm_readv where UCX
// would emulate the gets from a pool a peer on this host registered, validated reads, narrow tag
// reservation, a bounded control message, a receive probe that tells a wedged worker), and
// the device transport that stages chunks in GPU memory.
//
// Build an engine over it:
//
//	tr, err := ucx.New(ucx.Config{})
//	...
//	eng, err := transfer.New(tr, transfer.Config{StagingMemory: tr.StagingMemory()})
//
// A program starts with New (a Config, whose zero value works), Transport.RegisterHost (or
// AllocatePool) for its KV pool, Transport.StagingMemory for the engine's Config,
// Transport.ContextParams and UnmarshalContextParams for the request a prefill hands to decode
// by name, and Transport.Close; NewDevice and Transport.NewMover for GPU staging. A Transport
// is a transfer.Transport (what transfer.New takes); the transport contract (transport.Transport
// and the capabilities above) lives on the implementation that transfer.New resolves the
// Transport to (internal/transportimpl), not on the Transport a program holds.
//
// Peers are named by worker address (PeerFromAddress, Transport.Self). ContextParams is what
// a prefill engine hands to decode through the serving stack: the sender's worker address,
// its incarnation, and the request's plan. See docs/ucx.md.
//
// Everything here but ContextParams and the Config bounds needs cgo; a build without cgo
// has no UCX transport.
package ucx
