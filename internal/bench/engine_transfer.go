// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// engineAdapter is the benchmark's view of a transfer.Engine: the caller's pool moved through
// the timed host mover, peers named as the engine's transport names them.
type engineAdapter struct {
	eng *transfer.Engine
	// addr is what the other end is told; peerOf turns the other end's into a Peer.
	addr   []byte
	peerOf func(addr []byte) transfer.Peer
	// mapPool maps a pool through the transport for the direct path; nil: staging only.
	mapPool func(n int64) ([]byte, error)
	// direct says whether a pool may go direct (the transport reaches it in place).
	direct func(pool []byte) bool
	obs    *observability // nil without --http
	// unmaps release the caller-mapped pools (--pool caller) once the engine is closed.
	unmaps []func()
	// hugePages asks for transparent huge pages on the caller-mapped pools (--caller-pages thp).
	hugePages bool
	// decodeParams decodes the params an exposure handed out (ucx.UnmarshalContextParams):
	// the request they name, their secret, and whether they carry a one-hop read's section;
	// nil for a transport that issues none.
	decodeParams func(b []byte) (p transport.Params, id uint64, secret []byte, oneHop bool, err error)
}

var (
	_ engineSide = (*engineAdapter)(nil)
	_ exposer    = (*engineAdapter)(nil)
)

// engineConfig sizes an engine for the run: as many transfers at once as the largest
// concurrency (times the decode ranks), each holding up to --pipeline-depth slots of --slot-size, with deadlines long
// enough for the slowest request of a loaded host.
func engineConfig(cfg RunConfig) transfer.Config {
	maxConc := 1
	for _, c := range cfg.Concurrency {
		maxConc = max(maxConc, c)
	}
	maxConc *= cfg.decodeRanks() // --decode-tp: a request is a Send and a Receive per decode rank
	timeout := max(30*time.Second, 10*cfg.Duration)
	return transfer.Config{
		SlotBytes:       cfg.SlotBytes,
		MaxConcurrent:   maxConc,
		TransferTimeout: timeout,
		QueueTimeout:    timeout,
		ClusterKeys:     clusterKeys(cfg),
		Tuning:          tuning.Config{PipelineDepth: cfg.PipelineDepth, NumSlots: maxConc * cfg.PipelineDepth, DisableDirect: cfg.Staging, DirectChunkBytes: cfg.DirectChunkBytes, DisableRMA: cfg.NoRMA, RMAWhereEmulated: cfg.RMAWhereEmulated, DisablePull: cfg.NoPull, DisableInPlaceReads: cfg.NoInPlace, RMAMinRegionBytes: cfg.RMAMinRegionBytes},
	}
}

// clusterKeys is the engine's Config.ClusterKeys: the run's key (--cluster-key), or none.
func clusterKeys(cfg RunConfig) [][]byte {
	if len(cfg.ClusterKey) == 0 {
		return nil
	}
	return [][]byte{cfg.ClusterKey}
}

func (e *engineAdapter) Address() []byte { return e.addr }

func (e *engineAdapter) Connect(_ context.Context, addr []byte) (peerRef, error) {
	return peerRef(e.peerOf(addr)), nil
}

// NewPool implements engineSide.
func (e *engineAdapter) NewPool(n int64) ([]byte, bool, error) {
	if e.mapPool == nil {
		return make([]byte, n), false, nil
	}
	pool, err := e.mapPool(n)
	if err != nil {
		return nil, false, err
	}
	clear(pool) // mapped memory is not promised zeroed
	return pool, e.direct != nil && e.direct(pool), nil
}

// spec moves the pool behind m: through the timed mover, or, when the pool may go direct,
// as the spec's Pool with no Mover, so the engine can hand it to the transport in place.
func (e *engineAdapter) spec(id uint64, secret []byte, m mover) transfer.Spec {
	spec := transfer.Spec{ID: transfer.RequestID(id), Secret: secret}
	if tm, ok := m.(*timedMover); ok && e.direct != nil && e.direct(tm.pool) {
		spec.Pool = tm.pool
	} else {
		spec.Mover = m
	}
	return spec
}

func (e *engineAdapter) Send(ctx context.Context, id uint64, secret []byte, to peerRef, p *layout.Plan, m mover) (pendingXfer, error) {
	spec := e.spec(id, secret, m)
	spec.Peer, spec.Plan = transfer.Peer(to), p
	h, err := e.eng.Send(ctx, spec)
	if err != nil {
		return nil, err
	}
	return handle{h: h}, nil
}

func (e *engineAdapter) Receive(ctx context.Context, id uint64, secret []byte, subs []recvSub, m mover) (pendingXfer, error) {
	spec := e.spec(id, secret, m)
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
	return handle{h: h}, nil
}

// Expose implements exposer.
func (e *engineAdapter) Expose(ctx context.Context, id uint64, p *layout.Plan, m mover) (pendingXfer, []byte, []byte, error) {
	spec := e.spec(id, transfer.NewClaimSecret(), m)
	spec.Plan = p
	h, params, err := e.eng.Expose(ctx, spec)
	if err != nil {
		return nil, nil, nil, err
	}
	if params == nil { // a transport that describes no requests: the secret is all there is
		return handle{h: h}, nil, spec.Secret, nil
	}
	blob, err := params.MarshalBinary()
	if err != nil {
		e.eng.Cancel(spec.ID)
		_ = h.Release()
		return nil, nil, nil, fmt.Errorf("expose %d: encoding its params: %w", id, err)
	}
	return handle{h: h}, blob, nil, nil
}

// ReceiveExposed implements exposer: the params decoded (and, with a cluster key, verified)
// as a serving stack's decode end would, then a Receive that carries them.
func (e *engineAdapter) ReceiveExposed(ctx context.Context, id uint64, params, secret []byte, sub recvSub, m mover) (pendingXfer, error) {
	spec := e.spec(id, secret, m)
	spec.Peer, spec.Plan = transfer.Peer(sub.peer), sub.plan
	oneHop := false
	if params != nil {
		if e.decodeParams == nil {
			return nil, fmt.Errorf("receive %d: params from a transport this end cannot decode", id)
		}
		p, pid, sec, hop, err := e.decodeParams(params)
		if err != nil {
			return nil, fmt.Errorf("receive %d: %w", id, err)
		}
		if pid != id {
			return nil, fmt.Errorf("receive %d: the params name request %d", id, pid)
		}
		if err := e.eng.VerifyParams(p); err != nil {
			return nil, fmt.Errorf("receive %d: %w", id, err)
		}
		spec.Params, spec.Secret, oneHop = p, sec, hop
	}
	h, err := e.eng.Receive(ctx, spec)
	if err != nil {
		return nil, err
	}
	return handle{h: h, oneHop: oneHop}, nil
}

func (e *engineAdapter) Close() error {
	err := e.eng.Close()
	e.obs.close()
	for _, unmap := range e.unmaps {
		unmap() // the transport unregistered them as it closed
	}
	return err
}

// handle adapts *transfer.Handle. oneHop: its Receive was given params with a one-hop read's
// section, so an rma path is that read (the receiver falls back to an offer, or to messages,
// only where it cannot take it: then its path is not rma, or reads the offer's).
type handle struct {
	h      *transfer.Handle
	oneHop bool
}

func (h handle) Done() <-chan struct{}     { return h.h.Done() }
func (h handle) Quiesced() <-chan struct{} { return h.h.Quiesced() }
func (h handle) Err() error                { return h.h.Status().Err }
func (h handle) Release()                  { _ = h.h.Release() }
func (h handle) Path() string {
	p := h.h.Path()
	if p == transfer.PathRMA && h.oneHop {
		return "rma-one-hop"
	}
	if p != transfer.PathStaging || !h.h.Pulled() {
		return p.String()
	}
	return "staging-pull"
}
