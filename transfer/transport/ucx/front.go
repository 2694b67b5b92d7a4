// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"fmt"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Transport is kvxfer's UCX transport as a program holds it: one UCX context and worker, made
// by New (or NewDevice for GPU staging). Register the KV pool once (RegisterHost,
// AllocatePool, RegisterDevice), pass the Transport to transfer.New with StagingMemory as the
// engine's staging, and Close it after the engine. It is what transfer.New takes (transfer.Transport);
// the engine reaches the transport contract (transport.Transport: posting sends and receives,
// control messages; and the direct path, RMA gets, tag reservation, the receive probe, ...)
// through internal/transportimpl, not through methods here. See docs/ucx.md.
//
// Peers are named by worker address in hex (PeerFromAddress, Self); a peer that restarts has
// a new address, so nothing meant for its old life reaches the new one.
type Transport struct {
	u    *ucxTransport // the UCX transport
	impl frontImpl     // u, or the device transport over it (NewDevice)
}

// frontImpl is what Transport delegates the transport contract to.
type frontImpl interface {
	transport.Transport
	StagingMemory() []byte
}

// The engine resolves a *Transport to its implementation (transfer.New).
func init() {
	transportimpl.Register(func(tr any) (any, bool) {
		if f, ok := tr.(*Transport); ok {
			if f == nil {
				return nil, true
			}
			return f.impl, true
		}
		return nil, false
	})
}

// New opens UCX with cfg (its zero value works), allocates the staging region and starts the
// transport's dispatch goroutine.
func New(cfg Config) (*Transport, error) {
	t, err := newTransport(cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{u: t, impl: t}, nil
}

// NewDevice opens a transport whose staging slots live in GPU memory (cfg.Runtime's device):
// a request's chunks are gathered and scattered by CUDA kernels (NewMover) and sent from
// device memory. It fails with an error matching ErrDeviceMemory where UCX cannot reach CUDA
// memory. See docs/cuda.md.
func NewDevice(cfg DeviceConfig) (*Transport, error) {
	d, err := newDevice(cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{u: d.ucxTransport, impl: d}, nil
}

// NewMover makes the Mover for request id's device pool (a transfer.Spec's Mover on a
// transport from NewDevice), whose gathers and scatters run on the transport's CUDA stream.
// Close it once the request's transfer is done. On a host transport (New) it fails with an
// error matching ErrDeviceMemory.
func (f *Transport) NewMover(id transport.RequestID, pool cuda.Mem) (*DeviceMover, error) {
	d, ok := f.impl.(*deviceTransport)
	if !ok {
		return nil, fmt.Errorf("%w: request %d: a Mover needs a transport from NewDevice", ErrDeviceMemory, id)
	}
	return d.NewMover(id, pool)
}

// RegisterHost registers a host KV pool the caller mapped (mmap, huge pages) with UCX once, so
// its blocks move without a copy into staging. The memory must stay mapped until the Region is
// unregistered (or the transport closed). Refused with a *transport.RegionError: Go heap
// memory (transport.ErrGoMemory), an empty pool or one off a page boundary, or bounds that
// overlap a registration without lying inside it (transport.ErrBadRegion). A pool inside an
// existing registration shares it. Nothing is registered when it fails.
func (f *Transport) RegisterHost(pool []byte) (*Region, error) { return f.u.RegisterHost(pool) }

// RegisterDevice registers size bytes of CUDA device memory at addr (cuda.Buffer.Mem().Addr)
// with UCX once, for device pools that RMA reads in place. Without a CUDA-enabled UCX it
// fails with an error matching ErrDeviceMemory.
func (f *Transport) RegisterDevice(addr uint64, size int64) (*Region, error) {
	return f.u.RegisterDevice(addr, size)
}

// AllocatePool maps bytes of host memory through UCX for a KV pool: memory UCX allocated
// itself, valid until Close, which unmaps it.
func (f *Transport) AllocatePool(bytes int64) ([]byte, error) { return f.u.AllocatePool(bytes) }

// StagingMemory is the UCX-mapped region to pass as transfer.Config.StagingMemory (on a
// device transport, the host twin that holds the chunk headers). It is valid until Close.
func (f *Transport) StagingMemory() []byte { return f.impl.StagingMemory() }

// Self is this transport's peer name, what the other side passes as transfer.Spec.Peer. It
// changes when the transport replaces a wedged worker (Config.ReplaceWedgedWorker): read it
// per request.
func (f *Transport) Self() transport.Peer { return f.u.Self() }

// WorkerAddress is this transport's UCX worker address, what discovery publishes.
func (f *Transport) WorkerAddress() []byte { return f.u.WorkerAddress() }

// Incarnation is this transport's current life, what its ContextParams carry: it changes with
// the worker address when a wedged worker is replaced. Publish it beside WorkerAddress.
func (f *Transport) Incarnation() uint64 { return f.u.Incarnation() }

// ContextParams describes request id over plan (this side's blocks) for the peer that will
// receive it: what a prefill hands to decode when it names its receiver (Engine.Expose hands
// out params of its own).
func (f *Transport) ContextParams(id transport.RequestID, plan *layout.Plan) *ContextParams {
	return f.u.ContextParams(id, plan)
}

// CheckParams is the sender's check that cp, params it handed out, still name this
// transport's current life; params of a life that is over fail with an error matching
// ErrStaleIncarnation.
func (f *Transport) CheckParams(cp *ContextParams) error { return f.u.CheckParams(cp) }

// Close stops the transport (after the engine over it is closed). With force, operations in
// flight are torn down; otherwise endpoints are flushed within Config.CloseTimeout. Every
// registration and AllocatePool region is released; after Close every method fails.
func (f *Transport) Close(force bool) error { return f.impl.Close(force) }
