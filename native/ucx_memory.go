// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include <stdlib.h>
#include "ucx.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Memory: regions UCX allocates or registers, their packed remote keys, and the pins that
// keep a region alive while requests use it.

// MemoryKind is where a memory region lives.
type MemoryKind int

// Memory kinds, as UCX's ucs_memory_type_t.
const (
	MemoryHost MemoryKind = iota // host memory
	MemoryCUDA                   // CUDA device memory (needs a CUDA-enabled UCX)
)

// Memory is a region UCX can send from, receive into and expose for RMA: allocated by UCX
// (Allocate) or the caller's memory registered once (Register). Close refuses while a request
// still uses it.
type Memory struct {
	ctx   *Context
	memh  C.ucp_mem_h
	addr  unsafe.Pointer
	size  int64
	kind  MemoryKind
	mu    sync.Mutex
	pins  int
	freed bool
}

// Allocate maps size bytes of host memory through UCX (ucp_mem_map with ALLOCATE): RMA
// into it is faster than into memory registered afterwards.
func (c *Context) Allocate(size int64) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: allocate %d bytes: size must be positive", ErrInvalidArgument, size)
	}
	if err := c.acquire(0, 1); err != nil {
		return nil, err
	}
	m := &Memory{ctx: c, size: size, kind: MemoryHost}
	if st := C.kvx_ucx_mem_alloc(c.ctx, C.size_t(size), &m.memh, &m.addr); st != C.UCS_OK {
		_ = c.acquire(0, -1)
		return nil, statusErr(fmt.Sprintf("allocate %d bytes", size), st)
	}
	return m, nil
}

// Register registers size bytes at addr, memory the caller allocated outside Go's heap (C
// memory, a CUDA allocation, an mmap). It must stay valid until Close. Register once per
// pool, never per block.
func (c *Context) Register(addr unsafe.Pointer, size int64, kind MemoryKind) (*Memory, error) {
	if addr == nil || size <= 0 {
		return nil, fmt.Errorf("%w: register [%p, +%d): need an address and a positive size", ErrInvalidArgument, addr, size)
	}
	mt, err := c.checkKind(kind) // device memory only with a UCX that reaches it (ucx_device.go)
	if err != nil {
		return nil, err
	}
	if err := c.acquire(0, 1); err != nil {
		return nil, err
	}
	m := &Memory{ctx: c, size: size, kind: kind, addr: addr}
	if st := C.kvx_ucx_mem_register(c.ctx, m.addr, C.size_t(size), mt, &m.memh); st != C.UCS_OK {
		_ = c.acquire(0, -1)
		return nil, statusErr("register memory", st)
	}
	return m, nil
}

// Len is the region's size in bytes.
func (m *Memory) Len() int64 { return m.size }

// Addr is the region's address, what a peer needs (with the packed key) for RMA.
func (m *Memory) Addr() uint64 { return uint64(uintptr(m.addr)) }

// Kind is where the region lives.
func (m *Memory) Kind() MemoryKind { return m.kind }

// Bytes is the region as a byte slice, for host memory; nil for device memory. It is only
// valid until Close, and must not be written while a request uses the range.
func (m *Memory) Bytes() []byte {
	if m.kind != MemoryHost {
		return nil
	}
	return unsafe.Slice((*byte)(m.addr), m.size)
}

// PackRemoteKey packs the region's remote key for a peer's UnpackRemoteKey.
func (m *Memory) PackRemoteKey() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return nil, ErrClosed
	}
	var buf unsafe.Pointer
	var n C.size_t
	if st := C.kvx_ucx_rkey_pack(m.ctx.ctx, m.memh, &buf, &n); st != C.UCS_OK {
		return nil, statusErr("pack remote key", st)
	}
	defer C.free(buf)
	return C.GoBytes(buf, C.int(n)), nil
}

func (m *Memory) pin() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return fmt.Errorf("%w: memory region", ErrClosed)
	}
	m.pins++
	return nil
}

func (m *Memory) unpin() {
	m.mu.Lock()
	m.pins--
	m.mu.Unlock()
}

// Hold keeps the region from Close, as a request on it does, while a copy outside UCX (a
// process_vm_readv into it) uses it: release once, when that copy has returned. It fails once
// the region is closed.
func (m *Memory) Hold() (release func(), err error) {
	if err := m.pin(); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(m.unpin) }, nil
}

// InUse is how many requests use the region now. It never blocks for long.
func (m *Memory) InUse() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pins
}

// Close unmaps the region (and frees it, if Allocate made it). It returns ErrBusy while a
// request still uses it: memory is never released under UCX (invariant L2).
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return nil
	}
	if m.pins > 0 {
		return fmt.Errorf("%w: %d requests still use the region", ErrBusy, m.pins)
	}
	m.freed = true
	st := C.kvx_ucx_mem_release(m.ctx.ctx, m.memh)
	_ = m.ctx.acquire(0, -1)
	return statusErr("release memory", st)
}

// FillPattern writes the test pattern of stream bytes [streamOff, streamOff+n) with seed into
// the region at off. Tests and the benchmark peer use it to check every byte moved.
func (m *Memory) FillPattern(off, n int64, streamOff uint64, seed uint64) error {
	if m.kind != MemoryHost || off < 0 || n < 0 || off > m.size || n > m.size-off {
		return fmt.Errorf("%w: fill [%d, +%d) of a %d-byte region", ErrInvalidArgument, off, n, m.size)
	}
	C.kvx_ucx_pattern_fill(unsafe.Add(m.addr, off), C.uint64_t(streamOff), C.size_t(n), C.uint64_t(seed))
	return nil
}

// CheckPattern returns the offset (relative to off) of the first byte in [off, off+n) that
// differs from the test pattern, or -1 when all match.
func (m *Memory) CheckPattern(off, n int64, streamOff uint64, seed uint64) (int64, error) {
	if m.kind != MemoryHost || off < 0 || n < 0 || off > m.size || n > m.size-off {
		return 0, fmt.Errorf("%w: check [%d, +%d) of a %d-byte region", ErrInvalidArgument, off, n, m.size)
	}
	return int64(C.kvx_ucx_pattern_check(unsafe.Add(m.addr, off), C.uint64_t(streamOff), C.size_t(n), C.uint64_t(seed))), nil
}
