// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

// The report queue: UCX completions, control messages and peer failures, delivered in order
// on the transport's own goroutine, never inside a call the engine made.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

func (t *ucxTransport) enqueueRequest(r *native.Request) { t.push(ucxReport{req: r}) }

func (t *ucxTransport) push(r ucxReport) { t.reports.Push(r) }

// dispatch delivers reports in order until Close has drained them.
func (t *ucxTransport) dispatch() {
	defer close(t.exited)
	ready := t.reports.Ready()
	var batch []ucxReport
	for {
		batch = t.reports.Take(batch)
		for _, r := range batch {
			t.deliver(r)
		}
		if len(batch) > 0 {
			clear(batch) // drop the delivered requests
			continue
		}
		select {
		case <-ready:
		case <-t.stop:
			if t.reports.Len() == 0 {
				return
			}
		}
	}
}

func (t *ucxTransport) deliver(r ucxReport) {
	switch {
	case r.connected != "":
		t.mu.Lock()
		in := t.in
		t.mu.Unlock()
		if rep, ok := in.(transport.PeerConnectReporter); ok {
			rep.OnPeerConnected(r.connected)
		}
	case r.lost != "":
		// Its keys go now, not when its endpoints fail or the transport closes: a loss seen
		// on one endpoint (a lane's, or a failed read) may be all this side ever hears of a
		// dead peer. A key some get still uses goes with its last get.
		t.dropPeerKeys(r.lost)
		t.mu.Lock()
		in := t.in
		t.mu.Unlock()
		if in != nil {
			in.OnPeerLost(r.lost, r.err)
		}
	case r.busy != nil:
		t.mu.Lock()
		op := r.busy
		live := t.ops[op.id] == op && !op.busy
		op.busy = op.busy || live
		t.mu.Unlock()
		if live {
			op.done(transport.Completion{Err: fmt.Errorf("%w: send on the wire", transport.ErrCancelled), Memory: transport.MemoryBusy})
		}
	case r.req != nil:
		t.deliverRequest(r.req)
	case r.cma != nil:
		t.deliverCMA(r.cma, r.err, r.cmaUnknown)
	}
}

func (t *ucxTransport) deliverRequest(req *native.Request) {
	t.mu.Lock()
	if req == t.ctrl {
		in := t.in
		if t.ctrl = req.Next(); t.ctrl == nil && !t.closed {
			t.postControlLocked() // the chain ended: the receive failed
		}
		t.mu.Unlock()
		if req.Err() == nil && in != nil {
			t.deliverControl(in, req.Data())
		}
		return
	}
	if d := t.drainByReq[req]; d != nil {
		t.drainDoneLocked(d)
		t.mu.Unlock()
		return
	}
	op := t.byReq[req]
	if op == nil {
		t.mu.Unlock()
		return // a control send, or an op already given its final verdict
	}
	final := req.Settled()
	if !final && op.busy {
		t.mu.Unlock()
		return
	}
	if final {
		delete(t.byReq, req)
		delete(t.ops, op.id)
		if !op.send && t.recvTag[op.tag] == op.id {
			delete(t.recvTag, op.tag)
			// A receive cancelled before a message matched it is drained, and so are the
			// chunks past it. So are those past a receive asked to cancel that a message
			// matched first (it completes, and cannot be cancelled): its sender, a pipeline
			// ahead, may have sent the next chunks already, which no receive will take.
			if cancelled := errors.Is(req.Err(), native.ErrCancelled); op.cancel && !t.closed {
				if cancelled {
					t.startDrainLocked(op.tag)
				}
				for k := range uint64(t.cfg.drainAhead) {
					if seq := op.tag&ucxSeqMask + k + 1; seq <= ucxSeqMask {
						t.startDrainLocked(op.tag&^ucxSeqMask | seq)
					}
				}
			}
		}
	} else {
		op.busy = true
	}
	asked, closed := op.cancel, t.closed
	t.mu.Unlock()
	c := transport.Completion{Err: ucxError(req.Err(), op.peer), Memory: transport.MemoryDone}
	if !asked && !closed && errors.Is(req.Err(), native.ErrCancelled) {
		// Nobody here asked: the endpoint to the peer failed, and UCX cancelled what was
		// posted on it. The caller must hear that the peer was lost, not that it cancelled.
		c.Err = fmt.Errorf("%w: %.16s: its endpoint failed: %w", transport.ErrPeerLost, op.peer, req.Err())
	}
	if c.Err == nil {
		c.Bytes = op.size
		if !op.send {
			c.Bytes = int(req.Length())
		}
	}
	if !final {
		c.Memory = transport.MemoryBusy // abandoned: UCX still holds it; the final verdict follows
	}
	op.done(c)
}

func (t *ucxTransport) deliverControl(in transport.Inbound, b []byte) {
	if len(b) < 2 {
		return
	}
	n := int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+n || n == 0 {
		return
	}
	if t.probe.Load().arrived(b[2:2+n], b[2+n:]) || t.answerChallenge(b[2+n:]) {
		return
	}
	in.OnControl(t.peerOf(b[2:2+n]), b[2+n:])
}

// peerNamesMax bounds the senders peerOf remembers: a transport has a few peers, and a sender
// that makes up addresses only empties the cache now and then.
const peerNamesMax = 64

// peerOf is PeerFromAddress(addr), remembered: every control message names its sender by
// address, and hex-encoding it cost two allocations of about 1 KiB a message, in both engines.
// Only the dispatch goroutine calls it.
func (t *ucxTransport) peerOf(addr []byte) transport.Peer {
	if p, ok := t.peerNames[string(addr)]; ok {
		return p
	}
	if t.peerNames == nil || len(t.peerNames) >= peerNamesMax {
		t.peerNames = make(map[string]transport.Peer, peerNamesMax)
	}
	p := PeerFromAddress(addr)
	t.peerNames[string(addr)] = p
	return p
}

// ucxError maps native errors onto the engine's sentinels, keeping the UCX detail.
func ucxError(err error, peer transport.Peer) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, native.ErrCancelled):
		return fmt.Errorf("%w: %w", transport.ErrCancelled, err)
	case errors.Is(err, native.ErrPeerUnreachable), errors.Is(err, native.ErrClosed):
		return fmt.Errorf("%w: %.16s: %w", transport.ErrPeerLost, peer, err)
	case errors.Is(err, native.ErrOutOfBounds), errors.Is(err, native.ErrBadRemoteKey):
		return fmt.Errorf("%w: %.16s: %w", transport.ErrProtocol, peer, err) // it named memory it does not have
	}
	return err
}
