// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvxfer/kvxfer/layout"
)

// poolDims is both workers' KV pool: a small Llama-like model (4 layers, 8 KV heads of 128
// fp16 values, 16 tokens a block), 256 KiB per block, 64 blocks.
var poolDims = layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}

// kvPool is a worker's KV cache: the memory the engine reads or writes through plans, and the
// serving stack's allocator of its blocks. The engine never frees blocks; the worker does,
// when the cancel outcome or Quiesced says it may.
type kvPool struct {
	layout layout.Layout
	mem    []byte

	mu   sync.Mutex
	free []int32
}

// newKVPool maps the worker's KV cache through its fabric, the way a serving process hands
// the cache it already owns to kvxfer (see fabric.mapPool), so transfers take the one-copy
// path.
func newKVPool(fab fabric) (*kvPool, error) {
	l := layout.Packed(poolDims, layout.BlockMajor)
	mem, err := fab.mapPool(int(l.SpanBytes()))
	if err != nil {
		return nil, fmt.Errorf("KV cache: %w", err)
	}
	p := &kvPool{layout: l, mem: mem}
	for b := int32(poolDims.NumBlocks) - 1; b >= 0; b-- {
		p.free = append(p.free, b)
	}
	return p, nil
}

// alloc takes enough blocks for tokens.
func (p *kvPool) alloc(tokens int) ([]int32, error) {
	return p.allocBlocks(int((int64(tokens) + poolDims.TokensPerBlock - 1) / poolDims.TokensPerBlock))
}

// allocBlocks takes n blocks.
func (p *kvPool) allocBlocks(n int) ([]int32, error) {
	if n <= 0 {
		return nil, fmt.Errorf("asked for %d KV blocks", n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < n {
		return nil, fmt.Errorf("KV pool full: %d blocks free, %d needed", len(p.free), n)
	}
	blocks := make([]int32, 0, n)
	for range n { // lowest ids first: the free list is kept in descending order
		blocks = append(blocks, p.free[len(p.free)-1])
		p.free = p.free[:len(p.free)-1]
	}
	slices.Sort(blocks) // released blocks come back in any order
	return blocks, nil
}

// release returns blocks to the pool: only once no engine operation can touch them.
func (p *kvPool) release(blocks []int32) {
	p.mu.Lock()
	p.free = append(p.free, blocks...)
	p.mu.Unlock()
}

func (p *kvPool) freeBlocks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

func (p *kvPool) plan(blocks []int32) (*layout.Plan, error) {
	return layout.NewPlan(p.layout, p.layout.All(), blocks)
}

// kvByte is the value the "model" writes at stream offset off of request id, so the decode
// worker can check every byte it received.
func kvByte(id uint64, off int64) byte { return byte(uint64(off)*131 + id*29 + 7) }
