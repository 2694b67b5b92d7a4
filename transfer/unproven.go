// SPDX-License-Identifier: Apache-2.0

package transfer

// Endpoints made only to answer. A hello or a hello challenge names its sender by an address
// the sender writes itself, and answering it (a hello and a challenge back, or a proof) makes
// the transport connect to that address. Anyone who reaches the engine could so make it
// connect to addresses of their choosing, and keep those connections for the engine's life.
// The engine remembers each address it answered that had not proven itself, and drops the
// connection (transport.PeerCloser) once PendingTTL has passed with no proof from it, no
// transfer of this engine with it, and no request of it kept: the worker behind a real peer's
// address answers the challenge within a round trip, and a transfer with it greets it, so only
// an address nobody answers from loses its connection (docs/protocol.md, "The hello
// handshake"). At most MaxPending such addresses are remembered; past that, the oldest is
// dropped at once.

import (
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// unprovenState is the engine's record of the addresses it connected to only to answer them.
// Under Engine.mu.
type unprovenState struct {
	since map[Peer]time.Time // answered first at, not proven, not used since
	// dropped are the addresses whose connection this engine closed itself: the transport's
	// report of that loss is the engine's own doing, not a peer's, and is not told.
	dropped map[Peer]time.Time
	timer   *time.Timer // the next sweep; nil when none is due
}

// answeredUnprovenLocked records that the engine is about to answer p, which has not proven
// itself: unless p is proven, or a transfer of this engine greeted it, its connection goes
// at the next sweep after PendingTTL. It returns an address to drop at once (the oldest, when
// MaxPending are remembered), or "". e.mu is held.
func (e *Engine) answeredUnprovenLocked(p Peer) (dropNow Peer) {
	if ph := e.peers[p]; ph != nil && (ph.proven || ph.waiting > 0 || ph.greeted) {
		return ""
	}
	u := &e.unproven
	if _, ok := u.since[p]; ok {
		return ""
	}
	if u.since == nil {
		u.since = map[Peer]time.Time{}
	}
	if len(u.since) >= max(e.cfg.Tuning.MaxPending, 1) {
		var oldest Peer
		for q, at := range u.since {
			if oldest == "" || at.Before(u.since[oldest]) {
				oldest = q
			}
		}
		delete(u.since, oldest)
		if e.dropUnprovenLocked(oldest, e.peersInUseLocked()) {
			dropNow = oldest
		}
	}
	u.since[p] = time.Now()
	if u.timer == nil && !e.closed {
		u.timer = time.AfterFunc(e.cfg.Tuning.PendingTTL, e.sweepUnproven)
	}
	return dropNow
}

// provenLocked forgets p among the unproven: it proved itself, or a transfer of this engine
// greeted it. e.mu is held.
func (e *Engine) provenLocked(p Peer) {
	delete(e.unproven.since, p)
}

// peersInUseLocked returns the peers that a transfer of this engine or a kept request names.
// e.mu is held.
func (e *Engine) peersInUseLocked() map[Peer]bool {
	in := map[Peer]bool{}
	for k := range e.routes {
		in[k.peer] = true
	}
	for k := range e.pending {
		in[k.peer] = true
	}
	return in
}

// dropUnprovenLocked forgets p's unproven hello and reports whether its connection is to be
// closed: not while anything of this engine uses it. e.mu is held.
func (e *Engine) dropUnprovenLocked(p Peer, inUse map[Peer]bool) bool {
	if inUse[p] {
		return false
	}
	if ph := e.peers[p]; ph != nil {
		if ph.proven || ph.waiting > 0 || ph.greeted {
			return false
		}
		delete(e.peers, p) // its challenge too: a proof that comes later is unsolicited
	}
	u := &e.unproven
	if u.dropped == nil {
		u.dropped = map[Peer]time.Time{}
	}
	now := time.Now()
	if len(u.dropped) >= max(e.cfg.Tuning.MaxPending, 1) {
		for q, at := range u.dropped {
			if now.Sub(at) > e.cfg.Tuning.PendingTTL {
				delete(u.dropped, q)
			}
		}
		if len(u.dropped) >= max(e.cfg.Tuning.MaxPending, 1) {
			clear(u.dropped) // the reports of those are long past or never come
		}
	}
	u.dropped[p] = now
	return true
}

// sweepUnproven drops the connections of the addresses answered at least PendingTTL ago that
// never proved themselves nor were used, and sets the next sweep.
func (e *Engine) sweepUnproven() {
	e.mu.Lock()
	u := &e.unproven
	u.timer = nil
	if e.closed {
		e.mu.Unlock()
		return
	}
	now, ttl := time.Now(), e.cfg.Tuning.PendingTTL
	inUse := e.peersInUseLocked()
	var drop []Peer
	var next time.Duration
	for p, at := range u.since {
		if ph := e.peers[p]; ph != nil && (ph.proven || ph.waiting > 0 || ph.greeted) {
			delete(u.since, p)
			continue
		}
		left := ttl - now.Sub(at)
		if left <= 0 && inUse[p] { // a request of it is kept: look again once it is gone
			left = ttl / 8
		}
		if left > 0 {
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		delete(u.since, p)
		if e.dropUnprovenLocked(p, inUse) {
			drop = append(drop, p)
		}
	}
	if len(u.since) > 0 {
		u.timer = time.AfterFunc(max(next, ttl/8), e.sweepUnproven) // sweeps batch under a flood
	}
	e.mu.Unlock()
	e.closeUnproven(drop...)
}

// closeUnproven closes the transport's connections to peers (where it can close one
// connection: transport.PeerCloser). Called without e.mu.
func (e *Engine) closeUnproven(peers ...Peer) {
	pc, ok := e.tr.(transport.PeerCloser)
	for _, p := range peers {
		if p == "" {
			continue
		}
		e.log.Debug("closing the connection to an address that never proved its hello", zap.String("peer", p.Short()))
		if ok {
			pc.ClosePeer(p)
		}
	}
}

// droppedLocked reports whether a loss of p is that of a connection the engine closed itself
// because p never proved its hello (and forgets it). e.mu is held.
func (e *Engine) droppedLocked(p Peer) bool {
	if _, ok := e.unproven.dropped[p]; !ok {
		return false
	}
	delete(e.unproven.dropped, p)
	return true
}

// stopUnprovenLocked stops the next sweep (Close). e.mu is held.
func (e *Engine) stopUnprovenLocked() {
	if t := e.unproven.timer; t != nil {
		t.Stop()
		e.unproven.timer = nil
	}
}
