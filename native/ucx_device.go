// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include <stdlib.h>
#include "ucx.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unsafe"
)

// ErrMemoryType: UCX cannot reach memory of this kind here (device memory without a CUDA-enabled
// UCX); the error is a *MemoryTypeError naming the fix.
var ErrMemoryType = errors.New("kvxfer: memory type not supported by this UCX")

// UCXVersion is the version of the UCX library loaded at run time, such as "1.13.1" (Debian)
// or "1.22.0" (the libucx-cu12 wheel). It can differ from the headers kvxfer was built with.
func UCXVersion() string { return C.GoString(C.kvx_ucx_version()) }

// systemDevices is the number of system devices this process's UCX knows (ucs_topo_num_devices).
func systemDevices() int { return int(C.kvx_ucs_sys_devices()) }

// memoryTypeBit is the bit of ucp_context_attr_t.memory_types for a kind.
func memoryTypeBit(kind MemoryKind) (uint64, bool) {
	switch kind {
	case MemoryHost:
		return 1 << uint(C.UCS_MEMORY_TYPE_HOST), true
	case MemoryCUDA:
		return 1 << uint(C.UCS_MEMORY_TYPE_CUDA), true
	}
	return 0, false
}

// memoryTypes returns the context's memory_types mask, queried once: it is fixed when the
// context opens its transports.
func (c *Context) memoryTypes() (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	var types C.uint64_t
	if st := C.kvx_ucx_context_memory_types(c.ctx, &types); st != C.UCS_OK {
		return 0, statusErr("query memory types", st)
	}
	return uint64(types), nil
}

// Supports reports whether this context's UCX can send from, receive into and register
// memory of kind: always true for MemoryHost; for MemoryCUDA only with a CUDA-enabled UCX
// (its cuda transports loaded, which also needs the CUDA driver, libcuda.so.1). It never
// blocks for long and is false on a closed context.
func (c *Context) Supports(kind MemoryKind) bool {
	bit, ok := memoryTypeBit(kind)
	if !ok {
		return false
	}
	types, err := c.memoryTypes()
	return err == nil && types&bit != 0
}

// checkKind is what Register asks before it hands UCX an address: kind must be one kvxfer
// knows, and this UCX must reach it. Registering device memory with a UCX that has no CUDA
// support would "succeed" as host memory on some versions, and UCX would then read a device
// pointer from the CPU: a crash, not an error. It returns ucs_memory_type_t.
func (c *Context) checkKind(kind MemoryKind) (C.int, error) {
	switch kind {
	case MemoryHost:
		return C.UCS_MEMORY_TYPE_HOST, nil
	case MemoryCUDA:
		types, err := c.memoryTypes()
		if err != nil {
			return 0, err
		}
		if types&(1<<uint(C.UCS_MEMORY_TYPE_CUDA)) == 0 {
			return 0, &MemoryTypeError{Kind: kind, UCXVersion: UCXVersion()}
		}
		return C.UCS_MEMORY_TYPE_CUDA, nil
	}
	return 0, fmt.Errorf("%w: memory kind %d: kvxfer knows MemoryHost and MemoryCUDA", ErrInvalidArgument, int(kind))
}

// String names the kind as UCX does (ucs_memory_type_names).
func (k MemoryKind) String() string {
	switch k {
	case MemoryHost:
		return "host"
	case MemoryCUDA:
		return "cuda"
	}
	return fmt.Sprintf("memory kind %d", int(k))
}

// RegisterDevice registers size bytes of CUDA device memory at device address addr (from
// cudaMalloc: cuda.Buffer.Mem().Addr) once, for tagged sends and receives (TagSendDevice,
// TagRecvDevice) and RMA. The memory must stay allocated until the returned Memory is closed.
// Without CUDA support in this UCX it returns a *MemoryTypeError matching ErrMemoryType and
// ErrNotSupported, and UCX never sees the address.
//
// CUDA-aware UCX transports may expect the device's CUDA context to be current on the calling
// thread (UCX releases before 1.16 did); call it from Worker.RunOnThread after making the
// context current there.
func (c *Context) RegisterDevice(addr uint64, size int64) (*Memory, error) {
	if addr == 0 || size <= 0 {
		return nil, fmt.Errorf("%w: register device memory [%#x, +%d): need an address and a positive size", ErrInvalidArgument, addr, size)
	}
	mt, err := c.checkKind(MemoryCUDA)
	if err != nil {
		return nil, err
	}
	if err := c.acquire(0, 1); err != nil {
		return nil, err
	}
	m := &Memory{ctx: c, size: size, kind: MemoryCUDA}
	if st := C.kvx_ucx_mem_register_addr(c.ctx, C.uint64_t(addr), C.size_t(size), mt, &m.memh, &m.addr); st != C.UCS_OK {
		_ = c.acquire(0, -1)
		return nil, statusErr(fmt.Sprintf("register %d bytes of device memory", size), st)
	}
	return m, nil
}

// TagSendDevice sends mem[off, off+n) of a device region (RegisterDevice) as one tagged
// message, naming its memory type to UCX. A host region is refused: use TagSend.
func (ep *Endpoint) TagSendDevice(mem *Memory, off, n int64, tag uint64) *Request {
	if mem != nil && mem.kind != MemoryCUDA {
		return ep.w.failed(opTagSend, fmt.Errorf("%w: tag send device: a %v region (use TagSend)", ErrInvalidArgument, mem.kind))
	}
	r, p, err := ep.w.prepare(opTagSend, ep, mem, off, n)
	if err != nil {
		return ep.w.failed(opTagSend, err)
	}
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		st := C.kvx_ucx_tag_send_typed(ep.cep, C.uint64_t(tag), p, C.size_t(n), C.UCS_MEMORY_TYPE_CUDA,
			C.uint64_t(r.handle), &creq)
		return st, creq, 0
	})
}

// TagRecvDevice posts a receive bound to ep (see Endpoint.TagRecv) into mem[off, off+n) of a
// device region, naming its memory type to UCX. A host region is refused: use TagRecv.
func (ep *Endpoint) TagRecvDevice(mem *Memory, off, n int64, tag, mask uint64) *Request {
	w := ep.w
	if mem != nil && mem.kind != MemoryCUDA {
		return w.failed(opTagRecv, fmt.Errorf("%w: tag recv device: a %v region (use TagRecv)", ErrInvalidArgument, mem.kind))
	}
	r, p, err := w.prepare(opTagRecv, ep, mem, off, n)
	if err != nil {
		return w.failed(opTagRecv, err)
	}
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		var got C.size_t
		st := C.kvx_ucx_tag_recv_typed(w.cw, C.uint64_t(tag), C.uint64_t(mask), p, C.size_t(n),
			C.UCS_MEMORY_TYPE_CUDA, C.uint64_t(r.handle), &creq, &got)
		return st, creq, got
	})
}

// RunOnThread runs f on the worker's progress thread, the one OS thread every UCX call of
// this worker is made from, and waits for it, bounded by ctx. It is how a caller makes a CUDA
// context current where UCX's CUDA transports run. f must not block, and must not call the
// worker's own blocking methods (they would wait on the thread f holds).
func (w *Worker) RunOnThread(ctx context.Context, f func()) error {
	return w.call(ctx, f)
}

// memoryTypeFix is what a MemoryTypeError tells the reader to do.
const memoryTypeFix = "use a CUDA-enabled UCX build, such as the libucx-cu12 wheel (`make gpu-test` fetches it through scripts/ucx-cuda.sh), " +
	"on a host with the CUDA driver, with a transport list (UCX_TLS, TLS in the config) that names cuda_copy (and cuda_ipc, for GPU to GPU on one host) or is left to UCX"

// MemoryTypeError: UCX was asked to reach memory it has no transport for (device memory with
// a UCX built without CUDA, or with CUDA but no driver to load its cuda transports). It
// matches ErrMemoryType and ErrNotSupported.
type MemoryTypeError struct {
	Kind       MemoryKind
	UCXVersion string // the UCX loaded, as UCXVersion reports it
}

// Error implements error, naming the fix.
func (e *MemoryTypeError) Error() string {
	return fmt.Sprintf("%v: %v memory with UCX %s, which has no %s transport here: %s", ErrMemoryType, e.Kind,
		e.UCXVersion, strings.ToUpper(e.Kind.String()), memoryTypeFix)
}

// Is matches ErrMemoryType and ErrNotSupported.
func (e *MemoryTypeError) Is(target error) bool {
	return target == ErrMemoryType || target == ErrNotSupported
}
