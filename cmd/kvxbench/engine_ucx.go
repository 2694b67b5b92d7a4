// SPDX-License-Identifier: Apache-2.0

//go:build cgo && ucxlifecycle

// This file follows transfer/ucx_transport.go's build tag: the UCX transport is built only
// with -tags ucxlifecycle until the engine (branch lifecycle) is on main, and so is the
// benchmark's use of it. Drop the tag here when it is dropped there.

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/cuda/layout"
	"github.com/kvxfer/kvxfer/transfer"
)

func init() {
	newEngineSide = newUCXEngineSide
	engineBuilt = true
}

// ucxEngineSide is the benchmark's view of a transfer.Engine over a transfer.UCXTransport:
// staging slots in UCX-mapped memory, the caller's pool in Go memory moved through the
// timed host mover.
type ucxEngineSide struct {
	tr  *transfer.UCXTransport
	eng *transfer.Engine
}

var _ engineSide = (*ucxEngineSide)(nil)

// newUCXEngineSide sizes the engine for the run: as many transfers at once as the largest
// concurrency, each holding up to --pipeline-depth slots of --slot-size.
func newUCXEngineSide(cfg runConfig, role string, rank int) (engineSide, error) {
	maxConc := 1
	for _, c := range cfg.Concurrency {
		maxConc = max(maxConc, c)
	}
	slots := maxConc * cfg.PipelineDepth
	tr, err := transfer.NewUCXTransport(transfer.UCXConfig{TLS: cfg.TLS, StagingBytes: int64(slots) * cfg.SlotBytes})
	if err != nil {
		return nil, fmt.Errorf("%s rank %d: UCX transport: %w", role, rank, err)
	}
	timeout := max(30*time.Second, 10*cfg.Duration)
	eng, err := transfer.New(tr, transfer.Config{SlotBytes: cfg.SlotBytes, MaxConcurrent: maxConc,
		PipelineDepth: cfg.PipelineDepth, NumSlots: slots, StagingMemory: tr.StagingMemory(),
		TransferTimeout: timeout, QueueTimeout: timeout})
	if err != nil {
		_ = tr.Close(true)
		return nil, fmt.Errorf("%s rank %d: engine: %w", role, rank, err)
	}
	return &ucxEngineSide{tr: tr, eng: eng}, nil
}

func (e *ucxEngineSide) Address() []byte { return e.tr.WorkerAddress() }

func (e *ucxEngineSide) Connect(_ context.Context, addr []byte) (peerRef, error) {
	return peerRef(transfer.PeerFromAddress(addr)), nil
}

func (e *ucxEngineSide) Send(ctx context.Context, id uint64, to peerRef, p *layout.Plan, m mover) (pendingXfer, error) {
	h, err := e.eng.Send(ctx, transfer.Spec{ID: transfer.RequestID(id), Peer: transfer.Peer(to), Plan: p, Mover: m})
	if err != nil {
		return nil, err
	}
	return handle{h}, nil
}

func (e *ucxEngineSide) Receive(ctx context.Context, id uint64, subs []recvSub, m mover) (pendingXfer, error) {
	spec := transfer.Spec{ID: transfer.RequestID(id), Mover: m}
	if len(subs) == 1 {
		spec.Peer, spec.Plan = transfer.Peer(subs[0].peer), subs[0].plan
	} else {
		for _, s := range subs {
			spec.Subs = append(spec.Subs, transfer.SubSpec{Peer: transfer.Peer(s.peer), Plan: s.plan})
		}
	}
	h, err := e.eng.Receive(ctx, spec)
	if err != nil {
		return nil, err
	}
	return handle{h}, nil
}

func (e *ucxEngineSide) Close() error { return e.eng.Close() }

// handle adapts *transfer.Handle.
type handle struct{ h *transfer.Handle }

func (h handle) Done() <-chan struct{}     { return h.h.Done() }
func (h handle) Quiesced() <-chan struct{} { return h.h.Quiesced() }
func (h handle) Err() error                { return h.h.Status().Err }
func (h handle) Release()                  { _ = h.h.Release() }
