// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Gets into and out of device memory the caller registered (RegisterDevice): the engine's
// RMA route for a transfer.Spec.Device pool. A device region is named by address and length,
// never by a slice; its remote key was packed at registration. The gets name the memory type
// and the registration's handle to UCX (native.Endpoint.GetDevice), so with its CUDA
// transports they go GPU to GPU: cuda_ipc on one node, GPUDirect RDMA across nodes where the
// fabric has it.

var _ transport.DeviceRMATransport = (*ucxTransport)(nil)

// DeviceGets implements transport.DeviceRMATransport: this UCX can register CUDA memory
// (DeviceMemory), and the transport opened it with RMA (ServesRMA).
func (t *ucxTransport) DeviceGets() bool { return !t.noRMA && t.DeviceMemory() }

// deviceRegLocked returns the live device registration holding [addr, addr+n), or a
// *transport.RegionError matching transport.ErrBadRegion that says what the range is instead.
func (t *ucxTransport) deviceRegLocked(addr uint64, n int64) (*ucxRegistration, error) {
	end := addr + uint64(n)
	if n > 0 && end > addr {
		for _, g := range t.regs.device {
			if addr >= g.start() && end <= g.end() {
				return g, nil
			}
		}
	}
	reason := "not inside a device registration (RegisterDevice)"
	for _, m := range t.regions {
		if addr < m.Addr()+uint64(m.Len()) && m.Addr() < end {
			reason = "host memory this transport registered or mapped: pass it as transfer.Spec.Pool"
		}
	}
	return nil, &transport.RegionError{Op: "device rma", Addr: addr, Len: n, Reason: reason, Err: transport.ErrBadRegion}
}

// CheckDevice implements transport.DeviceRMATransport.
func (t *ucxTransport) CheckDevice(addr uint64, n int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return transport.ErrClosed
	}
	_, err := t.deviceRegLocked(addr, n)
	return err
}

// HoldDevice implements transport.DeviceRMATransport: the registration's Unregister is refused
// (transport.ErrRegionInUse) until release.
func (t *ucxTransport) HoldDevice(addr uint64, n int64) func() {
	t.mu.Lock()
	defer t.mu.Unlock()
	g, err := t.deviceRegLocked(addr, n)
	if err != nil {
		return nil
	}
	g.uses.Add(1)
	var once sync.Once
	return func() { once.Do(func() { g.uses.Add(-1) }) }
}

// RMAKeyAt implements transport.DeviceRMATransport with the key packed at registration; a
// peer's gets name device addresses as they are in this process.
func (t *ucxTransport) RMAKeyAt(addr uint64, n int64) (uint64, []byte, error) {
	if err := t.rmaRefused("a remote key for device gets"); err != nil {
		return 0, nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, nil, transport.ErrClosed
	}
	g, err := t.deviceRegLocked(addr, n)
	if err != nil {
		return 0, nil, err
	}
	key := t.rma.packed[g.mem]
	if key == nil {
		return 0, nil, fmt.Errorf("%w: device registration [%#x, +%d) has no packed key", transport.ErrBadRegion, g.start(), g.mem.Len())
	}
	return addr, key, nil
}

// PostGetAt implements transport.DeviceRMATransport with one ucp_get_nbx into the device
// registration, memory type and handle named. Device gets go on the transport's own worker,
// never striped over lanes: it is the one thread the caller's CUDA context is known on. The
// rules of PostGet hold: UCX cannot cancel a get, so Cancel reports transport.MemoryBusy while it runs.
func (t *ucxTransport) PostGetAt(from transport.Peer, tag transport.Tag, key []byte, addr, dstAddr uint64, n int64, done func(transport.Completion)) (transport.OpID, error) {
	if err := t.rmaRefused("a device get"); err != nil {
		return 0, err
	}
	if err := t.ensureEndpoint(from); err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, transport.ErrClosed
	}
	g, err := t.deviceRegLocked(dstAddr, n)
	if err != nil {
		return 0, err
	}
	ep, err := t.laneEndpointLocked(0, from)
	if err != nil {
		return 0, err
	}
	rk, err := t.remoteKeyLocked(from, 0, ep, key)
	if err != nil {
		return 0, err
	}
	t.nextOp++
	op := &ucxOp{id: t.nextOp, send: true, peer: from, size: int(n)}
	rk.inflight++
	op.done = func(c transport.Completion) {
		if c.Memory != transport.MemoryBusy {
			t.keyUnused(rk)
		}
		done(c)
	}
	op.req = ep.GetDevice(g.mem, int64(dstAddr-g.start()), n, addr, rk.rk)
	t.ops[op.id] = op
	t.byReq[op.req] = op
	return op.id, nil
}
