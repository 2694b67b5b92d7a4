// SPDX-License-Identifier: Apache-2.0

package transfer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// blockFreeList is a decode worker's free list of KV blocks, keyed on what kvxfer says: a
// request's blocks go back when its handle's Quiesced closes (which a FreeNow cancel outcome
// guarantees has happened), never earlier, and exactly once. The blocks of a request whose
// Quiesced never closes (Status.BlocksPoisoned: the transport never proved it was done with
// them) never go back: the watcher gives up when the process's context ends.
type blockFreeList struct {
	mu   sync.Mutex
	free []int32
	held map[transfer.RequestID][]int32
}

func newBlockFreeList(n int32) *blockFreeList {
	f := &blockFreeList{held: map[transfer.RequestID][]int32{}}
	for b := range n {
		f.free = append(f.free, b)
	}
	return f
}

// take leases n blocks to request id, or none when fewer are free.
func (f *blockFreeList) take(id transfer.RequestID, n int) ([]int32, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.free) < n {
		return nil, false
	}
	blocks := slices.Clone(f.free[:n])
	f.free = f.free[n:]
	f.held[id] = blocks
	return blocks, true
}

// giveBack returns request id's blocks; a second call for the same request does nothing.
func (f *blockFreeList) giveBack(id transfer.RequestID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.free = append(f.free, f.held[id]...)
	delete(f.held, id)
}

// watch gives h's blocks back when Quiesced closes; the channel it returns closes then.
func (f *blockFreeList) watch(ctx context.Context, h *transfer.Handle) <-chan struct{} {
	back := make(chan struct{})
	go func() {
		select {
		case <-h.Quiesced():
			f.giveBack(h.ID())
			close(back)
		case <-ctx.Done(): // shutting down; poisoned blocks stay out for good
		}
	}()
	return back
}

func (f *blockFreeList) freeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.free)
}

// ExampleHandle_Quiesced keeps a decode worker's block free list on what the engine says:
// one request completes and its blocks come back once Quiesced closes; another is cancelled
// and its blocks come back as its cancel outcome allows (at once after FreeNow, else when
// Quiesced closes).
func ExampleHandle_Quiesced() {
	l := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 64, ElemSize: 2,
		TokensPerBlock: 16, NumBlocks: 8}, layout.BlockMajor)
	net := mem.NewNetwork()
	prefill, err := transfer.New(net.Transport("prefill-0"), transfer.Config{})
	if err != nil {
		panic(err)
	}
	defer prefill.Close()
	decode, err := transfer.New(net.Transport("decode-0"), transfer.Config{})
	if err != nil {
		panic(err)
	}
	defer decode.Close()
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second) // the process's life
	defer stop()

	srcPool, dstPool := make([]byte, l.SpanBytes()), make([]byte, l.SpanBytes())
	blocks := newBlockFreeList(8)
	receive := func(id transfer.RequestID) (*transfer.Handle, <-chan struct{}) {
		ids, _ := blocks.take(id, 2)
		plan, _ := layout.NewPlan(l, l.All(), ids)
		h, err := decode.Receive(ctx, transfer.Spec{ID: id, Peer: "prefill-0", Plan: plan, Pool: dstPool})
		if err != nil {
			panic(err)
		}
		return h, blocks.watch(ctx, h)
	}

	// Request 1 completes.
	h1, back1 := receive(1)
	defer h1.Release()
	fmt.Println("request 1 holds 2 blocks, free:", blocks.freeCount()) // nothing sent yet
	srcPlan, _ := layout.NewPlan(l, l.All(), []int32{3, 5})
	send, err := prefill.Send(ctx, transfer.Spec{ID: 1, Peer: "decode-0", Plan: srcPlan, Pool: srcPool})
	if err != nil {
		panic(err)
	}
	defer send.Release()
	<-back1
	fmt.Println("request 1", h1.Status().State, "and quiesced, free:", blocks.freeCount())

	// Request 2 is given up on by decode before its prefill sends anything.
	h2, back2 := receive(2)
	defer h2.Release()
	if out := decode.Cancel(2); out.FreeNow() {
		blocks.giveBack(2) // Quiesced is already closed too: the watcher's giveBack is a no-op
	}
	<-back2 // after an in-flight cancel outcome, the blocks come back only here
	fmt.Println("request 2", h2.Status().State, "and quiesced, free:", blocks.freeCount())
	// Output:
	// request 1 holds 2 blocks, free: 6
	// request 1 completed and quiesced, free: 8
	// request 2 cancelled and quiesced, free: 8
}
