// SPDX-License-Identifier: Apache-2.0

//go:build cgo

// Package ucxhooks lets package transfer's tests (and the hostile peer they start), which run
// engines over the UCX transport, look inside it (how many keys it unpacked, its lanes'
// workers) and stall it at chosen points, without package ucx exporting any of that. Package
// ucx fills Hooks when it is linked in; nothing else sets it. Every function takes the
// *ucx.Transport as tr.
package ucxhooks

import (
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Hooks is filled by package ucx's init.
var Hooks struct {
	// InjectPeerLost queues a peer-lost report as if UCX had raised it (a false alarm).
	InjectPeerLost func(tr any, peer transport.Peer, err error)
	// RemotePools counts the peer pools whose keys are unpacked, on any lane; RemoteKeys
	// counts the unpacked keys (one per pool and lane).
	RemotePools, RemoteKeys func(tr any) int
	// Worker is the transport's own UCX worker (the one its lanes are beside).
	Worker func(tr any) *native.Worker
	// LaneWorkers lists the extra workers the gets are striped over (not the main one).
	LaneWorkers func(tr any) []*native.Worker
	// SetBeforeConnect and SetBeforeUnpack install a function run as an endpoint is about
	// to be made, or a peer's key unpacked (outside the transport's lock).
	SetBeforeConnect, SetBeforeUnpack func(tr any, f func())
	// ProbeSeen reports whether the receive probe runs and the highest sequence it saw.
	ProbeSeen func(tr any) (running bool, seen uint64)
	// Ops counts the operations the transport tracks; Registrations its memory registrations.
	Ops, Registrations func(tr any) int
	// ReplacesWedgedWorker reports Config.ReplaceWedgedWorker.
	ReplacesWedgedWorker func(tr any) bool
	// AllowSameProcessCMA lets a peer in this very process prove itself for the
	// process_vm_readv route, which every other process refuses: for tests whose two engines
	// share a process. Call it before the first get.
	AllowSameProcessCMA func(tr any)
	// WrapCMAReadv has the transport's process_vm_readv gets and probes call wrap(readv)
	// where they called readv (unix.ProcessVMReadv): a test holds a read there, mid-get, to
	// close an engine under it. Call it before the first get.
	WrapCMAReadv func(tr any, wrap func(readv CMAReadv) CMAReadv)
	// CMAReadsStuck counts the process_vm_readv calls declared blocked that have not
	// returned yet (each holds a thread).
	CMAReadsStuck func(tr any) int
	// SendControlAs sends msg to peer to in a control frame that names as (another worker's
	// address) for its sender: what a peer that lies about its address puts on the wire.
	SendControlAs func(tr any, to, as transport.Peer, msg []byte) error
	// Endpoints counts the transport's endpoints to peer, its own and its lanes'.
	Endpoints func(tr any, peer transport.Peer) int
	// RegionKey is the address of a *ucx.Region's first byte and the packed remote key of the
	// registration holding it: what a peer's gets of the region name.
	RegionKey func(region any) (addr uint64, key []byte)
}

// CMAReadv is unix.ProcessVMReadv's signature: one process_vm_readv call.
type CMAReadv = func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error)
