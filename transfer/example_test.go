// SPDX-License-Identifier: Apache-2.0

package transfer_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// exampleLayout is a tiny KV pool: 2 layers, K and V, 2 heads of 64 fp16 values, 16 tokens a
// block, 8 blocks; 16 KiB per block.
var exampleLayout = layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 64, ElemSize: 2,
	TokensPerBlock: 16, NumBlocks: 8}, layout.BlockMajor)

// ExampleEngine_Receive moves one request's KV blocks from a prefill engine to a decode engine.
// Both run in this process over the in-memory transport; in production each runs in its own
// process over UCX, and the decode side learns the request id and block ids from the
// ucx.ContextParams the prefill side hands over through the serving stack's control plane.
func ExampleEngine_Receive() {
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

	srcPool := make([]byte, exampleLayout.SpanBytes()) // the prefill worker's KV pool
	for i := range srcPool {
		srcPool[i] = byte(i)
	}
	dstPool := make([]byte, exampleLayout.SpanBytes()) // the decode worker's KV pool
	// The request's blocks: 3 and 5 on the prefill side, 0 and 1 on the decode side.
	srcPlan, _ := layout.NewPlan(exampleLayout, exampleLayout.All(), []int32{3, 5})
	dstPlan, _ := layout.NewPlan(exampleLayout, exampleLayout.All(), []int32{0, 1})

	ctx := context.Background()
	send, err := prefill.Send(ctx, transfer.Spec{ID: 17, Peer: "decode-0", Plan: srcPlan, Pool: srcPool})
	if err != nil {
		panic(err)
	}
	defer send.Release()
	recv, err := decode.Receive(ctx, transfer.Spec{ID: 17, Peer: "prefill-0", Plan: dstPlan, Pool: dstPool,
		Timeout: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	defer recv.Release()

	// A serving loop polls Status (it never blocks); here we wait on the channel, which the
	// transfer's deadline bounds.
	<-recv.Quiesced()
	st := recv.Status()
	fmt.Println(st.State, st.Bytes, "of", st.Total, "bytes")
	block := exampleLayout.StrideBlock
	fmt.Println("block 3 arrived in block 0:", bytes.Equal(dstPool[:block], srcPool[3*block:4*block]))
	<-send.Quiesced()
	fmt.Println("sender:", send.Status().State)
	// Output:
	// completed 32768 of 32768 bytes
	// block 3 arrived in block 0: true
	// sender: completed
}

// ExampleEngine_Cancel shows what each cancel outcome lets the caller do with the request's KV
// blocks: free them now, or stop scheduling the request and free them when Quiesced closes.
func ExampleEngine_Cancel() {
	eng, err := transfer.New(mem.NewNetwork().Transport("prefill-0"), transfer.Config{})
	if err != nil {
		panic(err)
	}
	defer eng.Close()
	pool := make([]byte, exampleLayout.SpanBytes())
	plan, _ := layout.NewPlan(exampleLayout, exampleLayout.All(), []int32{2})
	// No decode worker ever asks for request 5, so its Send waits, queued.
	h, err := eng.Send(context.Background(), transfer.Spec{ID: 5, Peer: "decode-0", Plan: plan, Pool: pool})
	if err != nil {
		panic(err)
	}
	defer h.Release()

	freeBlocks := func(id transfer.RequestID) { fmt.Println("free the blocks of request", id) }
	for _, id := range []transfer.RequestID{5, 5, 6} {
		out := eng.Cancel(id)
		fmt.Print(id, " ", out, ": ")
		switch {
		case out.FreeNow(): // NotFound, AlreadyComplete, CancelledBeforeAdvertise
			freeBlocks(id)
		default: // CancelRequestedInFlight, BackendUnhealthy, NotCancellable
			fmt.Println("stop scheduling it; free its blocks when Quiesced closes")
			go func() { <-h.Quiesced(); freeBlocks(id) }() // closes exactly once, bounded by the quarantine timeout
		}
	}
	// Output:
	// 5 cancelled-before-advertise: free the blocks of request 5
	// 5 already-complete: free the blocks of request 5
	// 6 not-found: free the blocks of request 6
}

// ExampleEngine_Drain shuts an engine down: stop taking requests (in the serving stack), let the
// transfers in flight finish for a bounded time, then Close, which cancels the rest.
func ExampleEngine_Drain() {
	eng, err := transfer.New(mem.NewNetwork().Transport("decode-0"), transfer.Config{})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := eng.Drain(ctx); err != nil {
		fmt.Println("some transfers did not finish:", err)
	}
	fmt.Println("close:", eng.Close())
	fmt.Println("health:", eng.Health().Reason)
	// Output:
	// close: <nil>
	// health: engine closed
}
