// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

var (
	_ transport.RMAEmulation = (*ucxTransport)(nil)
	_ transport.RMALanes     = (*ucxTransport)(nil)
)

// GetLanes implements transport.RMALanes: Config.Lanes, the workers gets go to in turn.
func (t *ucxTransport) GetLanes() int { return t.cfg.Lanes }

// stripesGets says whether gets from peer go to the lanes in turn: only where UCX serves them
// natively (shared memory, cma, RDMA). Where it emulates them (TCP in UCX 1.13) they stay on
// the transport's own worker: striping buys nothing there (the bytes go through each
// worker's active messages one way or another), and UCX 1.13 crashed the process
// (SIGSEGV in a lane's thread) when a peer was killed under gets striped over TCP lanes.
func (t *ucxTransport) stripesGets(peer transport.Peer) bool {
	l, ok := t.getLanes(peer)
	return t.cfg.Lanes > 1 && (!ok || l.native)
}

// ucxGetLanes is what UCX reported about the lanes of the endpoint to a peer.
type ucxGetLanes struct {
	ep     *native.Endpoint
	native bool
	// sharedMemoryOnly: every lane is a shared-memory transport of this host (posix, sysv,
	// cma, self), none a network or RDMA one that could get from memory a peer registered.
	sharedMemoryOnly bool
}

// GetsEmulated implements transport.RMAEmulation by what UCX says about the endpoint to peer
// (native.Endpoint.Lanes): gets are native where a lane serves them (shared memory in UCX
// 1.13, cma, RDMA), emulated with active messages where none does (TCP in UCX 1.13). An
// endpoint whose every lane is shared memory reaches a peer on this host, whose pools the
// receiver reads itself whatever UCX does with gets: in place where UCX maps the peer's
// segment (MapRemote), else by process_vm_readv (cma.go). So its gets count as native even
// where UCX would emulate its own: UCX 1.22 gives an endpoint with peer error handling no RMA
// lane over shared memory at all (it asks the memory domain for UCT_MD_FLAG_INVALIDATE_RMA,
// which posix and cma lack), and the receiver fell back to the direct path's messages at
// half the speed (docs/ucx.md, "UCX 1.22"). The answer is kept per endpoint; a replaced
// endpoint is asked again. When UCX cannot be asked it answers false, and the receiver keeps
// the RMA mode, which works on every transport.
func (t *ucxTransport) GetsEmulated(peer transport.Peer) bool {
	l, ok := t.getLanes(peer)
	return ok && !l.native && !l.sharedMemoryOnly
}

// getLanes is what UCX reported about the endpoint to peer, asked once per endpoint; ok is
// false when it cannot be asked (closed, no endpoint).
func (t *ucxTransport) getLanes(peer transport.Peer) (ucxGetLanes, bool) {
	if t.ensureEndpoint(peer) != nil {
		return ucxGetLanes{}, false
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ucxGetLanes{}, false
	}
	ep, err := t.endpointLocked(peer)
	if err != nil {
		t.mu.Unlock()
		return ucxGetLanes{}, false
	}
	if l, ok := t.rma.getLanes[peer]; ok && l.ep == ep {
		t.mu.Unlock()
		return l, true
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	defer cancel()
	lanes, err := ep.Lanes(ctx) // a worker round trip: not under mu
	if err != nil {
		return ucxGetLanes{}, false
	}
	l := ucxGetLanes{ep: ep, native: lanes.NativeGet, sharedMemoryOnly: sharedMemoryOnly(lanes)}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rma.getLanes == nil {
		t.rma.getLanes = map[transport.Peer]ucxGetLanes{}
	}
	t.rma.getLanes[peer] = l
	return l, true
}

// ucxLanes are the workers a ucxTransport's gets are striped over, lane 0 being the
// transport's own worker (t.w, its endpoints t.eps) and lane i > 0 extra[i-1]. Guarded by
// ucxTransport.mu, except start.
type ucxLanes struct {
	start sync.Once // makes the extra workers, on the first get
	extra []*ucxLane
	next  uint64 // round robin: the lane of the next get
}

// ucxLane is one extra worker and its endpoints, one per peer read from.
type ucxLane struct {
	w   *native.Worker
	eps map[transport.Peer]*native.Endpoint
}

// startLanes makes the extra workers once, outside mu (a worker starts its own thread). A
// worker that cannot be made leaves fewer lanes, logged; gets still go.
func (t *ucxTransport) startLanes() {
	t.rma.lanes.start.Do(func() {
		var ws []*native.Worker
		for range t.cfg.Lanes - 1 {
			w, err := t.uctx.NewWorker(native.WorkerConfig{OnReport: t.enqueueRequest, Logger: t.cfg.Logger})
			if err != nil {
				t.log.Warn("ucx: fewer lanes for gets than configured", zap.Int("lanes", 1+len(ws)), zap.Error(err))
				break
			}
			ws = append(ws, w)
		}
		t.mu.Lock()
		closed := t.closed
		if !closed {
			for _, w := range ws {
				t.rma.lanes.extra = append(t.rma.lanes.extra, &ucxLane{w: w, eps: map[transport.Peer]*native.Endpoint{}})
			}
		}
		t.mu.Unlock()
		if closed {
			for _, w := range ws {
				_ = w.Close()
			}
		}
	})
}

// nextLaneLocked is the lane of the next get: round robin, so a request of n gets in flight
// spreads them over min(n, lanes) workers and a request of one get uses one, and concurrent
// requests share every lane.
func (t *ucxTransport) nextLaneLocked() int {
	n := uint64(1 + len(t.rma.lanes.extra))
	lane := int(t.rma.lanes.next % n)
	t.rma.lanes.next++
	return lane
}

// ensureLaneEndpoints makes the lanes' missing endpoints to peer outside mu (each a round
// trip to its lane's worker), as ensureEndpoint does for the transport's own, so a first get to
// a peer holds up nobody else's posts and completions.
func (t *ucxTransport) ensureLaneEndpoints(peer transport.Peer) error {
	t.mu.Lock()
	var need []*ucxLane
	if !t.closed {
		for _, l := range t.rma.lanes.extra {
			if ep := l.eps[peer]; ep == nil || ep.Err() != nil {
				need = append(need, l)
			}
		}
	}
	t.mu.Unlock()
	for _, l := range need {
		ep, err := t.connect(l.w, peer, nil)
		if err != nil {
			return err
		}
		t.mu.Lock()
		cur := l.eps[peer]
		extra := t.closed || (cur != nil && cur.Err() == nil) // closed, or another get made one first
		if !extra {
			l.eps[peer] = ep
			go t.watchLane(l, peer, ep)
		}
		t.mu.Unlock()
		if extra {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
				defer cancel()
				_ = ep.ForceClose(ctx)
			}()
		}
	}
	return nil
}

// laneEndpointLocked is the endpoint to peer on lane: the transport's own for lane 0, else
// the lane worker's. The caller ran ensureLaneEndpoints first, so it exists but for a race
// with its failure; then it is made here, under mu. A lane endpoint that fails reports the
// peer lost, as the transport's own endpoint does, and takes the keys unpacked on it with it.
func (t *ucxTransport) laneEndpointLocked(lane int, peer transport.Peer) (*native.Endpoint, error) {
	if lane == 0 {
		return t.endpointLocked(peer)
	}
	l := t.rma.lanes.extra[lane-1]
	if ep := l.eps[peer]; ep != nil && ep.Err() == nil {
		return ep, nil
	}
	ep, err := t.connect(l.w, peer, nil)
	if err != nil {
		return nil, fmt.Errorf("lane %d: %w", lane, err)
	}
	l.eps[peer] = ep
	go t.watchLane(l, peer, ep)
	return ep, nil
}

// watchLane forgets a lane endpoint that failed and reports its peer lost, unless the
// transport is closing.
func (t *ucxTransport) watchLane(l *ucxLane, peer transport.Peer, ep *native.Endpoint) {
	select {
	case <-ep.Failed():
	case <-t.stop:
		return
	}
	t.mu.Lock()
	if l.eps[peer] == ep {
		delete(l.eps, peer)
	}
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return
	}
	t.held.failed(peer)
	t.log.Warn("ucx peer lost on a lane", zap.String("peer", peer.Short()), zap.Error(ep.Err()))
	t.push(ucxReport{lost: peer, err: ep.Err()})
}

// closeLanes closes the lanes' endpoints (forced, or flushed) and their workers, which
// settles every get still in them, each reported through dispatch like the transport's own.
// It runs in Close before the transport's worker closes; a start still making workers is
// waited for, and one not begun never will.
func (t *ucxTransport) closeLanes(ctx context.Context, force bool) error {
	t.rma.lanes.start.Do(func() {})
	t.mu.Lock()
	lanes := t.rma.lanes.extra
	t.rma.lanes.extra = nil
	eps := make([][]*native.Endpoint, len(lanes))
	for i, l := range lanes {
		for _, ep := range l.eps {
			eps[i] = append(eps[i], ep)
		}
	}
	t.mu.Unlock()
	var errs []error
	for i, l := range lanes {
		for _, ep := range eps[i] {
			if force {
				errs = append(errs, ep.ForceClose(ctx))
			} else {
				errs = append(errs, ep.Close(ctx))
			}
		}
		errs = append(errs, l.w.Close())
	}
	return errors.Join(errs...)
}

// sharedMemoryOnly reports whether every lane of an endpoint is a shared-memory transport of
// this host: "posix/memory.0", "cma/memory.0", "self/memory0" (UCX names its shared-memory
// transports' one device "memory").
func sharedMemoryOnly(lanes native.EndpointLanes) bool {
	for _, tl := range lanes.Transports {
		if _, dev, _ := strings.Cut(tl, "/"); !strings.HasPrefix(dev, "memory") {
			return false
		}
	}
	return len(lanes.Transports) > 0
}
