// SPDX-License-Identifier: Apache-2.0

//go:build cgo && linux

// Command pair: a prefill and a decode worker in two processes over UCX, each with its own KV
// pool mapped and registered. The decode serves the registry, /livez, /readyz and /metrics and
// starts the prefill (this binary, given the URL), which exposes requests naming no receiver and
// hands their params over by name: req-1 moves, decode cancels req-2, req-3's prefill dies.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// kv is both pools: 4 layers, 8 KV heads of 128 fp16 values, 16 tokens a block, 64 blocks.
var kv = layout.Packed(layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2,
	TokensPerBlock: 16, NumBlocks: 64}, layout.BlockMajor)

const numBlocks, blockBytes = 64, 256 << 10

// worker is one process's engine, its KV pool and the pool's free blocks.
type worker struct {
	eng  *transfer.Engine
	pool []byte
	free chan int32
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr := must(ucx.New(ucx.Config{TLS: "posix,cma,self", KeepaliveInterval: 100 * time.Millisecond})) // shared memory; a dead peer seen soon
	w := &worker{free: make(chan int32, numBlocks), pool: must(syscall.Mmap(-1, 0, numBlocks*blockBytes,
		syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE))}
	must(tr.RegisterHost(w.pool)) // once: blocks then move straight between the two pools
	for b := range int32(numBlocks) {
		w.free <- b
	}
	w.eng = must(transfer.New(tr, transfer.Config{Observer: must(observe.NewMetrics(observe.MetricsConfig{Registerer: prometheus.DefaultRegisterer}))}))
	defer w.eng.Close()
	if len(os.Args) > 1 { // the registry's URL: this process is the prefill
		w.prefill(ctx, os.Args[1])
	}
	ln := must(net.Listen("tcp", "127.0.0.1:0"))
	go http.Serve(ln, must(observe.Handler(observe.HandlerConfig{Health: w.eng, Gatherer: prometheus.DefaultGatherer, Registry: discovery.Handler()})))
	w.decode(ctx, "http://"+ln.Addr().String())
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}

// lease takes a request's blocks from the free list.
func (w *worker) lease(id transfer.RequestID) (transfer.Spec, []int32) {
	blocks := []int32{<-w.free, <-w.free, <-w.free, <-w.free}
	return transfer.Spec{ID: id, Plan: must(layout.NewPlan(kv, kv.All(), blocks)), Pool: w.pool}, blocks
}

// model writes (prefill) or checks (decode) request id's KV in blocks.
func (w *worker) model(id transfer.RequestID, blocks []int32, write bool) bool {
	for i, b := range blocks {
		for j := range blockBytes {
			v, at := byte(int(id)+i*31+j*7), &w.pool[int(b)*blockBytes+j]
			if write {
				*at = v
			} else if *at != v {
				return false
			}
		}
	}
	return true
}

// release gives blocks back to the free list once the engine says nothing touches them.
func (w *worker) release(name string, h *transfer.Handle, blocks []int32) {
	<-h.Quiesced()
	for _, b := range blocks {
		w.free <- b
	}
	fmt.Printf("%s %s, blocks free: %d\n", name, h.Status().State, len(w.free))
}

func (w *worker) prefill(ctx context.Context, url string) {
	reg := must(discovery.Open(url, discovery.Config{}))
	var names transfer.RequestIDs // the serving engine's string ids, mapped onto kvxfer's
	for _, name := range []string{"req-1", "req-2", "req-3"} {
		spec, blocks := w.lease(must(names.Acquire(name)))
		w.model(spec.ID, blocks, true)
		spec.Stream = name == "req-2" // and no layer marked ready: still being prefilled
		h, params, err := w.eng.Expose(ctx, spec)
		must(0, err)
		must(0, discovery.Hand(ctx, reg, name, params, h.Done())) // withdrawn once h is done
		if name == "req-3" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL) // dies, req-3 handed over and unclaimed
		}
		w.release("prefill: "+name+":", h, blocks)
	}
}

func (w *worker) decode(ctx context.Context, url string) {
	reg := must(discovery.Open(url, discovery.Config{}))
	pf := exec.CommandContext(ctx, must(os.Executable()), url)
	pf.Stdout, pf.Stderr, pf.SysProcAttr = os.Stdout, os.Stderr, &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must(0, pf.Start())
	for _, name := range []string{"req-1", "req-2", "req-3"} {
		cp := must(discovery.Take(ctx, reg, name))
		if name == "req-3" {
			fmt.Printf("decode: prefill exited: %v\n", pf.Wait())
		}
		spec, blocks := w.lease(cp.RequestID)
		spec.Peer, spec.Secret = ucx.PeerFromAddress(cp.WorkerAddress), cp.Secret
		start, h := time.Now(), must(w.eng.Receive(ctx, spec))
		for name == "req-2" && h.Status().State == transfer.Queued && ctx.Err() == nil {
			time.Sleep(time.Millisecond) // until prefill has it; then its client goes away
		}
		if name == "req-2" {
			fmt.Printf("decode: req-2 cancel: %s\n", w.eng.Cancel(cp.RequestID))
		}
		<-h.Done()
		var lost *transfer.PeerLostError
		w.release(fmt.Sprintf("decode: %s in %d ms (KV as prefill wrote it: %v, prefill lost: %v, %v):", name, time.Since(start).Milliseconds(),
			w.model(cp.RequestID, blocks, false), errors.As(h.Status().Err, &lost) && lost.Peer == spec.Peer, h.Status().Err), h, blocks)
	}
	for _, path := range []string{"/livez", "/readyz", "/metrics"} {
		resp := must(http.Get(url + path))
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("decode: %s %d %s\n", path, resp.StatusCode, regexp.MustCompile(`(?m)^(ok|kvxfer_transferred_bytes_total.*)$`).Find(body))
	}
}
