// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// prefillWorker computes prompts' KV (here: writes a known pattern), offers it with
// Engine.Send, and frees each request's blocks exactly once, when the engine says it may.
type prefillWorker struct {
	eng    *transfer.Engine
	params func(transfer.RequestID, *layout.Plan) *ucx.ContextParams // fabric.params
	pool   *kvPool
	out    *printer
	bound  time.Duration // the longest a request's blocks may stay pinned before we call it a leak

	// decodeDone closes when the decode worker says it has finished (POST /v1/done).
	decodeDone chan struct{}
	doneOnce   sync.Once

	mu   sync.Mutex
	live map[transfer.RequestID]*prefilled
	wg   sync.WaitGroup
}

// prefilled is one request whose KV sits in the prefill worker's pool.
type prefilled struct {
	h        *transfer.Handle
	blocks   []int32
	aborting bool // the abort handler owns the cleanup
	freed    bool
}

func (w *prefillWorker) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST "+pathPrefill, w.handlePrefill)
	mux.HandleFunc("POST "+pathAbort, w.handleAbort)
	mux.HandleFunc("POST "+pathDone, w.handleDone)
}

func (w *prefillWorker) handleDone(rw http.ResponseWriter, r *http.Request) {
	var req doneRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	w.doneOnce.Do(func() {
		w.out.printf("prefill: decode worker %s says it is done", transfer.Peer(req.Decode).Short())
		close(w.decodeDone)
	})
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write([]byte("{}\n"))
}

func (w *prefillWorker) handlePrefill(rw http.ResponseWriter, r *http.Request) {
	var req prefillRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Tokens <= 0 || req.Decode == "" {
		http.Error(rw, fmt.Sprintf("bad prefill request %+v: %v", req, err), http.StatusBadRequest)
		return
	}
	blob, err := w.prefill(r.Context(), req)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", contextParamsType)
	_, _ = rw.Write(blob)
}

// prefill writes the request's KV into fresh blocks, offers them to the decode engine, and
// returns the request's ContextParams blob for the decode worker.
func (w *prefillWorker) prefill(ctx context.Context, req prefillRequest) ([]byte, error) {
	id := transfer.RequestID(req.Request)
	blocks, err := w.pool.alloc(req.Tokens)
	if err != nil {
		return nil, err
	}
	plan, err := w.pool.plan(blocks)
	if err != nil {
		w.pool.release(blocks)
		return nil, err
	}
	stream := make([]byte, plan.Bytes())
	for i := range stream {
		stream[i] = kvByte(req.Request, int64(i))
	}
	if err := layouttest.ReferenceScatter(plan, stream, w.pool.mem); err != nil {
		w.pool.release(blocks)
		return nil, err
	}
	// Send returns at once; ctx bounds only the wait for the decode worker's request.
	// The request's secret goes in the Send and in its ContextParams, so only the holder of
	// the blob can claim it (checked with cluster keys or Config.RequireClaimProof).
	secret := transfer.NewClaimSecret()
	h, err := w.eng.Send(context.WithoutCancel(ctx), transfer.Spec{ID: id, Peer: transfer.Peer(req.Decode), Plan: plan, Pool: w.pool.mem, Secret: secret})
	if err != nil {
		w.pool.release(blocks) // never started: nothing can touch them
		return nil, err
	}
	p := &prefilled{h: h, blocks: blocks}
	w.mu.Lock()
	w.live[id] = p
	w.mu.Unlock()
	w.out.printf("prefill: request %d: %d tokens in blocks %v, %d bytes offered to %s", id, req.Tokens, blocks, plan.Bytes(),
		transfer.Peer(req.Decode).Short())
	w.wg.Add(1)
	go w.cleanupWhenQuiesced(id, p)
	// A blob that does not encode is our bug; the offer stands and the decode worker's
	// abort (or the transfer's deadline) frees the blocks. With cluster keys the engine seals
	// the params (last, after every change), so the decode worker can tell them from a forgery.
	cp := w.params(id, plan)
	cp.Secret = secret
	if err := w.eng.SignParams(cp); err != nil {
		return nil, err
	}
	return cp.MarshalBinary()
}

// cleanupWhenQuiesced frees a request's blocks once the engine is done with them, unless an
// abort took over the cleanup.
func (w *prefillWorker) cleanupWhenQuiesced(id transfer.RequestID, p *prefilled) {
	defer w.wg.Done()
	select {
	case <-p.h.Quiesced():
	case <-time.After(w.bound):
		w.out.printf("prefill: request %d: blocks %v never quiesced; kept out of use", id, p.blocks)
		return
	}
	w.mu.Lock()
	mine := !p.aborting && !p.freed
	if mine {
		p.freed = true
		delete(w.live, id)
	}
	w.mu.Unlock()
	if !mine {
		return
	}
	st := p.h.Status()
	w.pool.release(p.blocks)
	_ = p.h.Release()
	w.out.printf("prefill: request %d: %s (%d of %d bytes); blocks %v freed", id, st.State, st.Bytes, st.Total, p.blocks)
}

func (w *prefillWorker) handleAbort(rw http.ResponseWriter, r *http.Request) {
	var req abortRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	id := transfer.RequestID(req.Request)
	w.mu.Lock()
	p := w.live[id]
	already := p == nil || p.freed
	if !already {
		p.aborting = true
	}
	w.mu.Unlock()
	out := w.eng.Cancel(id)
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(abortReply{Outcome: out.String()})
	if already {
		w.out.printf("prefill: request %d: abort: %s; nothing left to free", id, out)
		return
	}
	if out.FreeNow() {
		w.free(id, p, fmt.Sprintf("abort: %s: blocks %v freed at once", out, p.blocks))
		return
	}
	w.out.printf("prefill: request %d: abort: %s: blocks %v stay pinned until the transfer quiesces", id, out, p.blocks)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		select {
		case <-p.h.Quiesced():
			w.free(id, p, fmt.Sprintf("quiesced after abort: blocks %v freed", p.blocks))
		case <-time.After(w.bound):
			w.out.printf("prefill: request %d: blocks %v never quiesced; kept out of use", id, p.blocks)
		}
	}()
}

func (w *prefillWorker) free(id transfer.RequestID, p *prefilled, what string) {
	w.mu.Lock()
	p.freed = true
	delete(w.live, id)
	w.mu.Unlock()
	w.pool.release(p.blocks)
	_ = p.h.Release()
	w.out.printf("prefill: request %d: %s", id, what)
}

// wait waits, bounded, for every cleanup goroutine.
func (w *prefillWorker) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("prefill cleanups still running: %w", ctx.Err())
	}
}
