// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include "ucx.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// GetDevice reads n bytes at remoteAddr of the peer's registered memory (host or device)
// into mem[off, off+n) of a device region (Context.RegisterDevice), naming the region's memory
// type and handle to UCX: with CUDA transports loaded the get goes GPU to GPU (cuda_ipc on
// one node, GPUDirect RDMA across nodes where the fabric has it), with no host copy. A host
// region is refused: use Get.
func (ep *Endpoint) GetDevice(mem *Memory, off, n int64, remoteAddr uint64, rkey *RemoteKey) *Request {
	if mem != nil && mem.kind != MemoryCUDA {
		return ep.w.failed(opGet, fmt.Errorf("%w: get device: a %v region (use Get)", ErrInvalidArgument, mem.kind))
	}
	if err := ep.w.ctx.rmaRefused(opGet); err != nil {
		return ep.w.failed(opGet, err)
	}
	if rkey == nil || rkey.ep != ep {
		return ep.w.failed(opGet, fmt.Errorf("%w: get device: the remote key must be unpacked on this endpoint", ErrInvalidArgument))
	}
	if err := rkey.checkRange(remoteAddr, n); err != nil {
		return ep.w.failed(opGet, fmt.Errorf("get device: %w", err))
	}
	r, p, err := ep.w.prepare(opGet, ep, mem, off, n)
	if err != nil {
		return ep.w.failed(opGet, err)
	}
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		if rkey.rkey == nil {
			return C.UCS_ERR_INVALID_PARAM, nil, 0
		}
		var creq unsafe.Pointer
		st := C.kvx_ucx_get_typed(ep.cep, p, C.size_t(n), C.uint64_t(remoteAddr), rkey.rkey,
			C.UCS_MEMORY_TYPE_CUDA, mem.memh, C.uint64_t(r.handle), &creq)
		return st, creq, 0
	})
}
