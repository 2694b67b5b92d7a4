// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"fmt"
	"unsafe"

	"github.com/kvxfer/kvxfer/layout"
)

// abiVersion is KVX_CUDA_ABI_VERSION in kvx_cuda.h; Open refuses a library of another version.
const abiVersion = 1

// copyArgs mirrors kvx_cuda_copy_t field for field (176 bytes, no padding). It holds no Go
// pointers, so passing its address to C for the duration of a call is allowed; the launcher
// copies it into the kernel's parameters before returning.
type copyArgs struct {
	Layout  layout.Layout    // kvx_layout_t layout
	Sel     layout.Selection // kvx_selection_t sel
	Blocks  uint64           // device address of the int32 block ids
	NBlocks int64
	Pool    uint64 // device address of the pool
	Buf     uint64 // device address of the stream buffer
	Offset  int64
	Length  int64
}

// abiField is one size or offset that C and Go must agree on, named as kvx_cuda_abi_offset
// names it.
type abiField struct {
	name string
	goAt uintptr
}

// abiFields lists the size and every field offset of each struct that crosses the ABI.
func abiFields() []abiField {
	var l layout.Layout
	var s layout.Selection
	var c copyArgs
	return []abiField{
		{"kvx_layout_t", unsafe.Sizeof(l)},
		{"kvx_layout_t.num_layers", unsafe.Offsetof(l.NumLayers)},
		{"kvx_layout_t.kv_factor", unsafe.Offsetof(l.KVFactor)},
		{"kvx_layout_t.num_heads", unsafe.Offsetof(l.NumHeads)},
		{"kvx_layout_t.head_dim", unsafe.Offsetof(l.HeadDim)},
		{"kvx_layout_t.elem_size", unsafe.Offsetof(l.ElemSize)},
		{"kvx_layout_t.tokens_per_block", unsafe.Offsetof(l.TokensPerBlock)},
		{"kvx_layout_t.num_blocks", unsafe.Offsetof(l.NumBlocks)},
		{"kvx_layout_t.stride_block", unsafe.Offsetof(l.StrideBlock)},
		{"kvx_layout_t.stride_layer", unsafe.Offsetof(l.StrideLayer)},
		{"kvx_layout_t.stride_kv", unsafe.Offsetof(l.StrideKV)},
		{"kvx_layout_t.stride_head", unsafe.Offsetof(l.StrideHead)},
		{"kvx_layout_t.stride_token", unsafe.Offsetof(l.StrideToken)},
		{"kvx_selection_t", unsafe.Sizeof(s)},
		{"kvx_selection_t.layer_begin", unsafe.Offsetof(s.LayerBegin)},
		{"kvx_selection_t.layer_end", unsafe.Offsetof(s.LayerEnd)},
		{"kvx_selection_t.head_begin", unsafe.Offsetof(s.HeadBegin)},
		{"kvx_selection_t.head_end", unsafe.Offsetof(s.HeadEnd)},
		{"kvx_cuda_copy_t", unsafe.Sizeof(c)},
		{"kvx_cuda_copy_t.layout", unsafe.Offsetof(c.Layout)},
		{"kvx_cuda_copy_t.sel", unsafe.Offsetof(c.Sel)},
		{"kvx_cuda_copy_t.blocks", unsafe.Offsetof(c.Blocks)},
		{"kvx_cuda_copy_t.nblocks", unsafe.Offsetof(c.NBlocks)},
		{"kvx_cuda_copy_t.pool", unsafe.Offsetof(c.Pool)},
		{"kvx_cuda_copy_t.buf", unsafe.Offsetof(c.Buf)},
		{"kvx_cuda_copy_t.offset", unsafe.Offsetof(c.Offset)},
		{"kvx_cuda_copy_t.length", unsafe.Offsetof(c.Length)},
	}
}

// checkABI compares the library's version and every struct size and offset with this
// package's mirrors. A mismatch would make kernels read garbage strides, so it is fatal.
func checkABI(k *kvxAPI) error {
	if v := k.abiVersion(); v != abiVersion {
		return fmt.Errorf("%w: %s has ABI version %d, this package speaks %d", ErrABIMismatch, k.path, v, abiVersion)
	}
	for _, f := range abiFields() {
		if c := k.abiOffset(f.name); c != int64(f.goAt) {
			return fmt.Errorf("%w: %s: %s is %d in C, %d in Go", ErrABIMismatch, k.path, f.name, c, f.goAt)
		}
	}
	return nil
}
