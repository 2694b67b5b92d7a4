// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include "kvx_host.h"

// By-value wrappers: a Go local whose address goes to C escapes to the heap, so the structs
// cross by value and the chunk copy allocates nothing.
static int kvx_host_gather_v(kvx_layout_t l, kvx_selection_t s, const int32_t *blocks,
                             int64_t nblocks, const void *pool, int64_t pool_bytes, int64_t off,
                             int64_t len, void *dst) {
  return kvx_host_gather(&l, &s, blocks, nblocks, pool, pool_bytes, off, len, dst);
}
static int kvx_host_scatter_v(kvx_layout_t l, kvx_selection_t s, const int32_t *blocks,
                              int64_t nblocks, const void *src, int64_t off, int64_t len,
                              void *pool, int64_t pool_bytes) {
  return kvx_host_scatter(&l, &s, blocks, nblocks, src, off, len, pool, pool_bytes);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
)

// parallelMin is the smallest share of a copy worth a core of its own: below it the cost of
// starting a goroutine and a cgo call is a visible part of the copy.
const parallelMin = 4 << 20

// HostGather copies stream bytes [off, off+len(dst)) of the plan out of pool into dst. Large
// ranges are split across the available cores. On error nothing is read or written.
func HostGather(p *layout.Plan, pool []byte, off int64, dst []byte) error {
	if err := checkHost(p, pool, off, int64(len(dst))); err != nil {
		return err
	}
	return hostCopy(p, pool, off, dst, true)
}

// HostScatter copies src into stream bytes [off, off+len(src)) of the plan in pool. Large
// ranges are split across the available cores. On error nothing is read or written.
func HostScatter(p *layout.Plan, src []byte, off int64, pool []byte) error {
	if err := checkHost(p, pool, off, int64(len(src))); err != nil {
		return err
	}
	return hostCopy(p, pool, off, src, false)
}

// HostCopy is memcpy through the same call path and the same split across cores as
// HostGather: the baseline that gather and scatter are measured against.
func HostCopy(dst, src []byte) {
	n := min(len(dst), len(src))
	parallel(int64(n), func(o, k int64) error {
		C.kvx_host_copy(unsafe.Pointer(&dst[o]), unsafe.Pointer(&src[o]), C.int64_t(k))
		return nil
	})
}

// HostCopyStreaming is HostCopy with the non-temporal stores that gathers and scatters of
// large ranges use: the strictest baseline for them, since it differs from them only by the
// strided walk.
func HostCopyStreaming(dst, src []byte) {
	n := min(len(dst), len(src))
	parallel(int64(n), func(o, k int64) error {
		C.kvx_host_copy_streaming(unsafe.Pointer(&dst[o]), unsafe.Pointer(&src[o]), C.int64_t(k))
		return nil
	})
}

func checkHost(p *layout.Plan, pool []byte, off, n int64) error {
	if p == nil {
		return fmt.Errorf("%w: nil plan", layout.ErrInvalidLayout)
	}
	if span := kvplan.PoolSpan(p); int64(len(pool)) < span {
		return &layout.FieldError{Field: "pool", Value: int64(len(pool)),
			Reason: fmt.Sprintf("the layout spans %d bytes", span), Err: layout.ErrBufferTooSmall}
	}
	return kvplan.CheckRange(p, off, n)
}

func hostCopy(p *layout.Plan, pool []byte, off int64, stream []byte, gather bool) error {
	n := int64(len(stream))
	if n == 0 {
		return nil
	}
	if n < 2*parallelMin || runtime.GOMAXPROCS(0) < 2 {
		// The common case (a staging chunk): one call, no goroutine, no allocation.
		return copyRange(p, pool, off, stream, gather)
	}
	return parallel(n, func(o, k int64) error {
		return copyRange(p, pool, off+o, stream[o:o+k], gather)
	})
}

// copyRange is one C call over stream bytes [off, off+len(stream)). The slices stay reachable,
// and unmoved (Go's heap does not move), for the duration of the call.
func copyRange(p *layout.Plan, pool []byte, off int64, stream []byte, gather bool) error {
	cl, cs := cLayout(p.Layout()), cSelection(p.Selection())
	blocks := p.Blocks()
	bp := (*C.int32_t)(unsafe.Pointer(&blocks[0]))
	var rc C.int
	if gather {
		rc = C.kvx_host_gather_v(cl, cs, bp, C.int64_t(len(blocks)), unsafe.Pointer(&pool[0]),
			C.int64_t(len(pool)), C.int64_t(off), C.int64_t(len(stream)), unsafe.Pointer(&stream[0]))
	} else {
		rc = C.kvx_host_scatter_v(cl, cs, bp, C.int64_t(len(blocks)), unsafe.Pointer(&stream[0]),
			C.int64_t(off), C.int64_t(len(stream)), unsafe.Pointer(&pool[0]), C.int64_t(len(pool)))
	}
	return hostError(rc)
}

// parallel runs fn over [0, n) in at most GOMAXPROCS element-aligned shares of at least
// parallelMin bytes each, and returns the first error.
func parallel(n int64, fn func(off, n int64) error) error {
	workers := min(int64(runtime.GOMAXPROCS(0)), n/parallelMin)
	if workers <= 1 {
		return fn(0, n)
	}
	share := (n/workers + 63) &^ 63
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := int64(0); w < workers; w++ {
		o := w * share
		k := min(share, n-o)
		if k <= 0 {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = fn(o, k)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func hostError(rc C.int) error {
	switch rc {
	case C.KVX_OK:
		return nil
	case C.KVX_ERR_BLOCK_RANGE:
		return fmt.Errorf("%w: block id outside the pool (C check)", layout.ErrOutOfRange)
	case C.KVX_ERR_STREAM_RANGE:
		return fmt.Errorf("%w: range outside the stream (C check)", layout.ErrOutOfRange)
	case C.KVX_ERR_POOL_SMALL:
		return fmt.Errorf("%w: pool smaller than the layout's span (C check)", layout.ErrBufferTooSmall)
	}
	return fmt.Errorf("%w: host copy refused with code %d", layout.ErrInvalidLayout, int(rc))
}

func cLayout(l layout.Layout) C.kvx_layout_t {
	return C.kvx_layout_t{
		num_layers: C.int64_t(l.NumLayers), kv_factor: C.int64_t(l.KVFactor),
		num_heads: C.int64_t(l.NumHeads), head_dim: C.int64_t(l.HeadDim),
		elem_size: C.int64_t(l.ElemSize), tokens_per_block: C.int64_t(l.TokensPerBlock),
		num_blocks: C.int64_t(l.NumBlocks), stride_block: C.int64_t(l.StrideBlock),
		stride_layer: C.int64_t(l.StrideLayer), stride_kv: C.int64_t(l.StrideKV),
		stride_head: C.int64_t(l.StrideHead), stride_token: C.int64_t(l.StrideToken),
	}
}

func cSelection(s layout.Selection) C.kvx_selection_t {
	return C.kvx_selection_t{
		layer_begin: C.int64_t(s.LayerBegin), layer_end: C.int64_t(s.LayerEnd),
		head_begin: C.int64_t(s.HeadBegin), head_end: C.int64_t(s.HeadEnd),
	}
}

// LayoutABI reports sizeof(kvx_layout_t) and the offset of each field in declaration order, as
// the C compiler sees them, so a test can hold the Go mirror to the header.
func LayoutABI() (size int64, offsets []int64) {
	for i := C.int64_t(0); ; i++ {
		o := int64(C.kvx_layout_abi(i))
		if o < 0 {
			break
		}
		offsets = append(offsets, o)
	}
	return int64(C.kvx_layout_abi(-1)), offsets
}

// SelectionABI is LayoutABI for kvx_selection_t.
func SelectionABI() (size int64, offsets []int64) {
	for i := C.int64_t(0); ; i++ {
		o := int64(C.kvx_selection_abi(i))
		if o < 0 {
			break
		}
		offsets = append(offsets, o)
	}
	return int64(C.kvx_selection_abi(-1)), offsets
}
