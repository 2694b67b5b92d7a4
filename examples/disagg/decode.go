// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// decodeWorker pulls prefilled requests' KV with Engine.Receive, polling Status the way a
// serving loop would between decode steps.
type decodeWorker struct {
	eng        *transfer.Engine
	addr       transfer.Peer                          // this engine's peer name (fabric.self)
	senderPeer func(*ucx.ContextParams) transfer.Peer // fabric.senderPeer
	pool       *kvPool
	out        *printer
	control    string // the prefill worker's control plane, http://host:port
	reg        discovery.Registry
	client     *http.Client
	bound      time.Duration
}

// post sends body as JSON to the prefill worker's control plane and returns the answer's
// body (at most limit bytes) after checking its content type.
func (d *decodeWorker) post(ctx context.Context, path string, body any, wantType string, limit int64) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.control+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	msg, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: reading the answer: %w", path, err)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%s: %s: %s", path, resp.Status, bytes.TrimSpace(msg))
	case int64(len(msg)) > limit:
		return nil, fmt.Errorf("%s: answer longer than %d bytes", path, limit)
	case resp.Header.Get("Content-Type") != wantType:
		return nil, fmt.Errorf("%s: answer is %q, want %q", path, resp.Header.Get("Content-Type"), wantType)
	}
	return msg, nil
}

// askPrefill has the prefill worker prefill a prompt and returns the request's ContextParams,
// decoded and checked against this worker's pool.
func (d *decodeWorker) askPrefill(ctx context.Context, id uint64, tokens int) (*ucx.ContextParams, error) {
	blob, err := d.post(ctx, pathPrefill, prefillRequest{Request: id, Tokens: tokens, Decode: string(d.addr)},
		contextParamsType, maxContextParamsBytes)
	if err != nil {
		return nil, err
	}
	cp, err := ucx.UnmarshalContextParams(blob) // checks version, length, checksum and plan
	if err != nil {
		return nil, err
	}
	// With cluster keys, params a key of ours did not seal (forged, or changed on the way)
	// are refused and counted before anything they name is used; without, this is a no-op.
	if err := d.eng.VerifyParams(cp); err != nil {
		return nil, fmt.Errorf("request %d: %w", id, err)
	}
	if cp.RequestID != transfer.RequestID(id) {
		return nil, fmt.Errorf("asked for request %d, got ContextParams of request %d", id, cp.RequestID)
	}
	// Params of a prefill life that is over (it restarted or died since, which this engine's
	// transport may know before the registry does) fail here, at once, instead of a Receive
	// that waits out its deadline.
	if err := checkParams(ctx, d.reg, cp, d.eng); err != nil {
		return nil, fmt.Errorf("request %d: %w", id, err)
	}
	d.out.printf("decode: request %d: ContextParams (%d bytes) from %s: prefill blocks %v", id, len(blob),
		d.senderPeer(cp).Short(), cp.Blocks)
	return cp, nil
}

// receive pulls a handed-over request into as many fresh blocks as the sender used, checks
// every byte, and (generation being out of scope) frees the blocks.
func (d *decodeWorker) receive(ctx context.Context, cp *ucx.ContextParams) error {
	sender, err := cp.Plan()
	if err != nil {
		return err
	}
	blocks, err := d.pool.allocBlocks(len(cp.Blocks))
	if err != nil {
		return err
	}
	plan, err := d.pool.plan(blocks)
	if err == nil {
		err = layout.Compatible(sender, plan) // the engines check again; failing here is cheaper
	}
	if err != nil {
		d.pool.release(blocks)
		return err
	}
	began := time.Now()
	peer := d.senderPeer(cp)
	h, err := d.eng.Receive(ctx, transfer.Spec{ID: cp.RequestID, Peer: peer, Plan: plan, Pool: d.pool.mem, Secret: cp.Secret})
	if err != nil {
		d.pool.release(blocks) // never started
		return err
	}
	defer h.Release()
	st, err := d.poll(ctx, h)
	if err != nil {
		return err
	}
	if st.State != transfer.Completed {
		return d.afterFailure(h, blocks, st)
	}
	d.out.printf("decode: request %d: %s, %d bytes from %s into blocks %v in %v, path %s", cp.RequestID, st.State, st.Bytes,
		peer.Short(), blocks, time.Since(began).Round(time.Microsecond), h.Path())
	got := make([]byte, plan.Bytes())
	if err := layouttest.ReferenceGather(plan, d.pool.mem, got); err != nil {
		return err
	}
	for i, b := range got {
		if want := kvByte(uint64(cp.RequestID), int64(i)); b != want {
			return fmt.Errorf("request %d: stream byte %d is %d, want %d", cp.RequestID, i, b, want)
		}
	}
	d.out.printf("decode: request %d: all %d bytes verified; blocks ready for generation", cp.RequestID, len(got))
	d.pool.release(blocks) // generation done
	return nil
}

// poll reads Status until the outcome is decided; each read is a few atomic loads and never
// blocks, so a serving loop can do it between decode steps.
func (d *decodeWorker) poll(ctx context.Context, h *transfer.Handle) (transfer.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, d.bound)
	defer cancel()
	tick := time.NewTicker(200 * time.Microsecond)
	defer tick.Stop()
	for {
		st := h.Status()
		if st.State.Terminal() || st.State == transfer.Quarantined {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("request %d still %s: %w", h.ID(), st.State, ctx.Err())
		case <-tick.C:
		}
	}
}

// afterFailure frees a failed receive's blocks when the engine says they are quiescent.
func (d *decodeWorker) afterFailure(h *transfer.Handle, blocks []int32, st transfer.Status) error {
	select {
	case <-h.Quiesced():
		d.pool.release(blocks)
		return fmt.Errorf("request %d %s: %w", h.ID(), st.State, st.Err)
	case <-time.After(d.bound):
		return fmt.Errorf("request %d %s and never quiesced; blocks %v kept out of use: %w", h.ID(), st.State, blocks, st.Err)
	}
}

// abort tells the prefill worker a request is gone before the decode worker pulled it.
func (d *decodeWorker) abort(ctx context.Context, id uint64) error {
	b, err := d.post(ctx, pathAbort, abortRequest{Request: id}, "application/json", 1024)
	if err != nil {
		return err
	}
	var reply abortReply
	if err := json.Unmarshal(b, &reply); err != nil {
		return fmt.Errorf("%s: %w", pathAbort, err)
	}
	d.out.printf("decode: request %d: client went away before its KV moved; prefill's cancel said %s", id, reply.Outcome)
	return nil
}

// giveUp starts receiving a request that the prefill worker never sends (its prefill is stuck,
// say), then cancels it in flight: the blocks are freed only when Quiesced closes.
func (d *decodeWorker) giveUp(ctx context.Context, id uint64, tokens int, peer transfer.Peer) error {
	blocks, err := d.pool.alloc(tokens)
	if err != nil {
		return err
	}
	plan, err := d.pool.plan(blocks)
	if err != nil {
		d.pool.release(blocks)
		return err
	}
	h, err := d.eng.Receive(ctx, transfer.Spec{ID: transfer.RequestID(id), Peer: peer, Plan: plan, Pool: d.pool.mem})
	if err != nil {
		d.pool.release(blocks)
		return err
	}
	defer h.Release()
	wait, cancel := context.WithTimeout(ctx, d.bound)
	defer cancel()
	for h.Status().State == transfer.Queued { // leasing a slot and posting the receive: microseconds
		select {
		case <-wait.Done():
			return fmt.Errorf("request %d never advertised: %w", id, wait.Err())
		case <-time.After(100 * time.Microsecond):
		}
	}
	out := d.eng.Cancel(transfer.RequestID(id))
	if out.FreeNow() {
		d.pool.release(blocks)
		d.out.printf("decode: request %d: cancel: %s: blocks %v freed at once", id, out, blocks)
		return nil
	}
	d.out.printf("decode: request %d: cancel: %s: stop scheduling it; blocks %v wait for Quiesced", id, out, blocks)
	select {
	case <-h.Quiesced():
		d.pool.release(blocks)
		d.out.printf("decode: request %d: quiesced (%s); blocks %v freed", id, h.Status().State, blocks)
		return nil
	case <-wait.Done():
		return fmt.Errorf("request %d never quiesced; blocks %v kept out of use: %w", id, blocks, wait.Err())
	}
}

// done tells the prefill worker this decode worker has finished.
func (d *decodeWorker) done(ctx context.Context) error {
	_, err := d.post(ctx, pathDone, doneRequest{Decode: string(d.addr)}, "application/json", 1024)
	return err
}
