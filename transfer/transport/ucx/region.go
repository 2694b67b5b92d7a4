// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

var _ transport.PoolHolder = (*ucxTransport)(nil)

// deviceRegionAlign is the alignment RegisterDevice asks of a device range: cudaMalloc's
// allocations start on 256-byte boundaries at least (CUDA VMM's on 2 MiB).
const deviceRegionAlign = 256

// ucxRegs holds the caller's registrations, under ucxTransport.mu (regMu serialises
// registering and unregistering, which call into UCX outside mu).
type ucxRegs struct {
	regMu  sync.Mutex
	host   []*ucxRegistration // also in ucxTransport.regions, so Direct and RMAKey find them
	device []*ucxRegistration
}

// ucxRegistration is one ucp_mem_map of caller memory: registered once, its remote key
// packed once, shared by every Region inside it.
type ucxRegistration struct {
	mem  *native.Memory
	refs int          // Regions not yet unregistered, under ucxTransport.mu
	uses atomic.Int64 // transfers holding it (HoldPool)
	gone bool         // unmapped (its last Region unregistered, or the transport closed)
}

func (g *ucxRegistration) start() uint64 { return g.mem.Addr() }
func (g *ucxRegistration) end() uint64   { return g.mem.Addr() + uint64(g.mem.Len()) }

// Region is memory the caller already owns (its KV cache), registered with a Transport:
// host memory it mapped itself (RegisterHost) or CUDA device memory (RegisterDevice). A
// host region's Pool is what the caller passes as transfer.Spec.Pool: the direct path and its RMA mode
// then move it in place, exactly as a pool from AllocatePool. Unregister it once no transfer
// uses it; the transport's Close unregisters what is left.
type Region struct {
	t    *ucxTransport
	reg  *ucxRegistration
	addr uint64
	size int64
	kind native.MemoryKind
	pool []byte
	done bool // Unregister succeeded, under t.mu
}

// Pool is the region as the caller's pool, for transfer.Spec.Pool (and slices of it); nil for device
// memory, which Go never addresses.
func (r *Region) Pool() []byte { return r.pool }

// Addr is the region's first byte (a device address for device memory).
func (r *Region) Addr() uint64 { return r.addr }

// Len is the region's size in bytes.
func (r *Region) Len() int64 { return r.size }

// remoteKey is the address of the region's first byte and the packed remote key of the
// registration holding it, for a peer's gets (packed once, at registration).
func (r *Region) remoteKey() (addr uint64, key []byte) {
	r.t.mu.Lock()
	defer r.t.mu.Unlock()
	return r.addr, r.t.rma.packed[r.reg.mem]
}

// RegisterHost registers pool, host memory the caller mapped outside Go (mmap, C malloc,
// huge pages), with UCX once (ucp_mem_map without ALLOCATE) and packs its remote key once.
// The memory must stay mapped until the Region is unregistered (or the transport closed).
//
// Refused with a *transport.RegionError: Go heap memory (transport.ErrGoMemory: cgo's pointer rules), an empty
// pool or one that does not start on a page boundary, or bounds that overlap a registration
// without lying inside it, or overlap memory the transport mapped itself (transport.ErrBadRegion). A
// pool equal to or inside an existing registration shares it: one registration, counted once
// per Region. Nothing is registered when it fails.
func (t *ucxTransport) RegisterHost(pool []byte) (*Region, error) {
	p := unsafe.Pointer(unsafe.SliceData(pool))
	addr, size := uint64(uintptr(p)), int64(len(pool))
	refuse := func(reason string, err error) error {
		return &transport.RegionError{Op: "register", Addr: addr, Len: size, Reason: reason, Err: err}
	}
	switch {
	case size == 0:
		return nil, refuse("zero length", transport.ErrBadRegion)
	case addr%uint64(os.Getpagesize()) != 0:
		return nil, refuse(fmt.Sprintf("start not on a %d-byte page boundary", os.Getpagesize()), transport.ErrBadRegion)
	case native.IsGoHeap(p, size):
		return nil, refuse("the range lies in the Go heap, which UCX must not keep (cgo pointer rules); map it with mmap or use AllocatePool", transport.ErrGoMemory)
	}
	r, err := t.register(addr, size, native.MemoryHost, refuse, func() (*native.Memory, error) {
		return t.uctx.Register(p, size, native.MemoryHost)
	})
	if err != nil {
		return nil, err
	}
	r.pool = pool[:size:size]
	return r, nil
}

// RegisterDevice registers size bytes of CUDA device memory at device address addr (from
// cudaMalloc or CUDA VMM: cuda.Buffer.Mem().Addr) with UCX once, its memory type named, and
// packs its remote key once. The memory must stay allocated until the Region is
// unregistered. Without a CUDA-enabled UCX it is refused before UCX sees the address (a
// *transport.RegionError wrapping ErrDeviceMemory and native.ErrMemoryType); so are
// a zero size, an address off a 256-byte boundary and overlapping bounds (transport.ErrBadRegion).
func (t *ucxTransport) RegisterDevice(addr uint64, size int64) (*Region, error) {
	refuse := func(reason string, err error) error {
		return &transport.RegionError{Op: "register", Addr: addr, Len: size, Reason: reason, Err: err}
	}
	switch {
	case size <= 0:
		return nil, refuse("zero length", transport.ErrBadRegion)
	case addr == 0 || addr%deviceRegionAlign != 0:
		return nil, refuse(fmt.Sprintf("device address not on a %d-byte boundary", deviceRegionAlign), transport.ErrBadRegion)
	case !t.uctx.Supports(native.MemoryCUDA):
		return nil, refuse("device memory", &deviceMemoryError{Reason: "this UCX cannot register CUDA memory",
			Err: &native.MemoryTypeError{Kind: native.MemoryCUDA, UCXVersion: native.UCXVersion()}})
	}
	return t.register(addr, size, native.MemoryCUDA, refuse, func() (*native.Memory, error) {
		return t.uctx.RegisterDevice(addr, size)
	})
}

// register finds the registration [addr, addr+size) lies in, or makes one with mapMem.
func (t *ucxTransport) register(addr uint64, size int64, kind native.MemoryKind, refuse func(string, error) error,
	mapMem func() (*native.Memory, error)) (*Region, error) {
	t.regs.regMu.Lock()
	defer t.regs.regMu.Unlock()
	end := addr + uint64(size)
	if end < addr {
		return nil, refuse("the range wraps around", transport.ErrBadRegion)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, refuse("transport closed", transport.ErrClosed)
	}
	list := t.regs.host
	if kind == native.MemoryCUDA {
		list = t.regs.device
	} else {
		for _, m := range t.regions {
			if t.callerMemLocked(m) == nil && addr < m.Addr()+uint64(m.Len()) && m.Addr() < end {
				t.mu.Unlock()
				return nil, refuse("overlaps memory the transport mapped itself (staging or AllocatePool)", transport.ErrBadRegion)
			}
		}
	}
	for _, g := range list {
		if addr >= g.start() && end <= g.end() {
			g.refs++ // inside an existing registration: share it
			t.mu.Unlock()
			return &Region{t: t, reg: g, addr: addr, size: size, kind: kind}, nil
		}
		if addr < g.end() && g.start() < end {
			t.mu.Unlock()
			return nil, refuse(fmt.Sprintf("overlaps the registration [%#x, +%d) without lying inside it", g.start(), g.mem.Len()), transport.ErrBadRegion)
		}
	}
	t.mu.Unlock()

	// UCX registers (and may pin) outside mu: a large region takes a while, and transfers go on.
	mem, err := mapMem()
	if err != nil {
		var mt *native.MemoryTypeError
		if errors.As(err, &mt) {
			err = &deviceMemoryError{Reason: "this UCX cannot register CUDA memory", Err: err}
		}
		return nil, refuse("ucx registration", err)
	}
	key, err := mem.PackRemoteKey()
	if err != nil {
		_ = mem.Close()
		return nil, refuse("packing the remote key", err)
	}
	g := &ucxRegistration{mem: mem, refs: 1}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = mem.Close()
		return nil, refuse("transport closed", transport.ErrClosed)
	}
	if t.rma.packed == nil {
		t.rma.packed = map[*native.Memory][]byte{}
	}
	t.rma.packed[mem] = key
	if kind == native.MemoryCUDA {
		t.regs.device = append(t.regs.device, g)
	} else {
		t.regs.host = append(t.regs.host, g)
		t.regions = append(t.regions, mem)
	}
	t.mu.Unlock()
	return &Region{t: t, reg: g, addr: addr, size: size, kind: kind}, nil
}

// callerMemLocked returns the caller registration of m, or nil for memory the transport
// mapped itself.
func (t *ucxTransport) callerMemLocked(m *native.Memory) *ucxRegistration {
	for _, g := range t.regs.host {
		if g.mem == m {
			return g
		}
	}
	return nil
}

// Unregister ends this Region. The last Region of a registration unmaps it from UCX
// (ucp_mem_unmap); the memory itself stays the caller's. It is refused with a *transport.RegionError
// matching transport.ErrRegionInUse while a transfer holds the registration (from its start until its
// Quiesced channel closes; for good once its blocks are poisoned) or UCX still holds an
// operation on it, and then changes nothing. Unregistering twice, or after the transport
// closed, does nothing.
func (r *Region) Unregister() error {
	t, g := r.t, r.reg
	t.regs.regMu.Lock()
	defer t.regs.regMu.Unlock()
	t.mu.Lock()
	if r.done || g.gone {
		t.mu.Unlock()
		return nil
	}
	if n := g.uses.Load(); n > 0 {
		t.mu.Unlock()
		return &transport.RegionError{Op: "unregister", Addr: r.addr, Len: r.size,
			Reason: fmt.Sprintf("%d transfers hold it until their blocks are quiescent", n), Err: transport.ErrRegionInUse}
	}
	if n := g.mem.InUse(); n > 0 && g.refs == 1 {
		t.mu.Unlock()
		return &transport.RegionError{Op: "unregister", Addr: r.addr, Len: r.size,
			Reason: fmt.Sprintf("UCX still holds %d operations on it", n), Err: transport.ErrRegionInUse}
	}
	r.done = true
	g.refs--
	if g.refs > 0 {
		t.mu.Unlock()
		return nil
	}
	t.dropRegistrationLocked(g)
	t.mu.Unlock()
	if err := g.mem.Close(); err != nil {
		return &transport.RegionError{Op: "unregister", Addr: r.addr, Len: r.size, Reason: "ucx unmap", Err: err}
	}
	return nil
}

// dropRegistrationLocked takes g out of every list, so nothing new can use it.
func (t *ucxTransport) dropRegistrationLocked(g *ucxRegistration) {
	g.gone = true
	delete(t.rma.packed, g.mem)
	t.regs.host = deleteReg(t.regs.host, g)
	t.regs.device = deleteReg(t.regs.device, g)
	for i, m := range t.regions {
		if m == g.mem {
			t.regions = append(t.regions[:i], t.regions[i+1:]...)
			break
		}
	}
}

func deleteReg(list []*ucxRegistration, g *ucxRegistration) []*ucxRegistration {
	for i, x := range list {
		if x == g {
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}

// HoldPool implements transport.PoolHolder: a pool inside a caller registration is held until release.
func (t *ucxTransport) HoldPool(pool []byte) func() {
	if len(pool) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	m, _, err := t.regionLocked(pool)
	if err != nil {
		return nil
	}
	g := t.callerMemLocked(m)
	if g == nil {
		return nil
	}
	g.uses.Add(1)
	var once sync.Once
	return func() { once.Do(func() { g.uses.Add(-1) }) }
}

// closeRegions unmaps every registration still live, once the worker is gone (Close).
func (t *ucxTransport) closeRegions() []error {
	t.mu.Lock()
	all := append(append([]*ucxRegistration(nil), t.regs.host...), t.regs.device...)
	for _, g := range all {
		t.dropRegistrationLocked(g)
	}
	t.mu.Unlock()
	var errs []error
	for _, g := range all {
		errs = append(errs, g.mem.Close())
	}
	return errs
}

// registrations is how many caller registrations are live (tests: nothing leaked).
func (t *ucxTransport) registrations() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.regs.host) + len(t.regs.device)
}
