// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"go.uber.org/zap"
)

// What arrives from the transport without a posted receive: control messages, routed to
// their transfer or kept for a Send not made yet, and lost peers.

// inbound is the engine's face to the transport.
type inbound struct{ e *Engine }

// OnControl routes a control message to its transfer, or keeps an early request for a Send
// not made yet.
func (in inbound) OnControl(from Peer, msg []byte) {
	e := in.e
	m, err := wire.Decode(msg)
	if err != nil {
		e.malformed.Add(1)
		e.log.Debug("dropping malformed control message", zap.String("peer", from.Short()), zap.Error(err))
		return
	}
	if !e.authentic(from, msg, m) {
		return
	}
	stampIn(m)
	switch m := m.(type) {
	case *wire.Hello:
		e.onHello(from, m)
		return
	case *wire.HelloChallenge:
		if e.readsProofs(from) {
			e.onChallenge(from, m)
		}
		return
	case *wire.HelloProof:
		if e.readsProofs(from) {
			e.onProof(from, m)
		}
		return
	case *wire.Goodbye:
		e.onGoodbye(from, m) // goodbye.go
		return
	}
	key := routeKey{from, m.Head().Request}
	e.mu.Lock()
	e.heardLocked(from)
	x := e.routes[key]
	if x == nil {
		switch m := m.(type) {
		case *wire.RequestInfo:
			if xe := e.exposures[m.Request]; xe != nil { // expose.go: a claim
				ab, ae := e.claimLocked(from, xe, m)
				e.mu.Unlock()
				if ae != nil {
					e.refuseClaim(from, ab, ae)
				} else if ab != nil {
					_ = e.tr.SendControl(from, wire.Encode(ab))
				}
				return
			}
			if u, ended := e.unanswered[routeKey{"", key.id}]; ended && u.secret != nil { // an exposure that ended
				ab, ae := e.endedClaimLocked(from, m, u)
				e.mu.Unlock()
				if ae != nil {
					e.refuseClaim(from, ab, ae)
				} else {
					_ = e.tr.SendControl(from, wire.Encode(ab))
				}
				return
			}
			if u, gone := e.unanswered[key]; gone {
				e.mu.Unlock()
				_ = e.tr.SendControl(from, wire.Encode(&wire.Abort{Header: wire.Header{Sub: m.Sub, Request: m.Request, Nonce: m.Nonce}, Code: u.code, Reason: u.reason}))
				return
			}
			if !e.closed {
				e.addPendingLocked(key, m)
			}
		case *wire.Abort:
			if p, early := e.pending[key]; early && p.abort == nil && p.info.Nonce == m.Nonce {
				p.abort = m // the receiver of an early request gave up: its Send must not start
				e.pending[key] = p
			}
		}
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	x.box.Push(event{msg: m})
	if ab, ok := m.(*wire.Abort); ok {
		x.abortQueued(ab) // xfer.go: a Send queued on the request its receiver aborted waits no longer
	}
}

// authentic reports whether m, decoded from msg, may be read: with Config.ClusterKeys, a
// hello, challenge or proof must be sealed by a key this engine holds, and one that is not is
// refused and counted before it is answered (no endpoint is made for it). Other messages,
// and everything without keys, pass.
func (e *Engine) authentic(from Peer, msg []byte, m wire.Message) bool {
	if e.keys == nil {
		return true
	}
	var what string
	var seal wire.Seal
	switch m := m.(type) {
	case *wire.Hello:
		what, seal = "hello", m.Seal
	case *wire.HelloChallenge:
		what, seal = "challenge", m.Seal
	case *wire.HelloProof:
		what, seal = "proof", m.Seal
	default:
		return true
	}
	err := e.keys.Open(msg, seal)
	if err == nil {
		return true
	}
	ae := &AuthError{Peer: from, What: what, Reason: transport.AuthUnsealed}
	switch {
	case errors.Is(err, wire.ErrUnknownKey):
		ae.Reason = transport.AuthUnknownKey
	case errors.Is(err, wire.ErrBadMAC):
		ae.Reason = transport.AuthBadMAC
	}
	e.log.Debug("refusing an unauthenticated message", zap.String("peer", from.Short()), zap.Error(ae))
	notifyAuthRefused(e.obs, ae)
	return false
}

// readsProofs reports whether this engine reads hello challenges and proofs: an engine that
// speaks only wire 3 (a test's older build) drops them as malformed, as that build does.
func (e *Engine) readsProofs(from Peer) bool {
	if e.speech.max >= wire.ProofVersion {
		return true
	}
	e.malformed.Add(1)
	e.log.Debug("dropping a hello challenge or proof: this engine speaks wire 3", zap.String("peer", from.Short()))
	return false
}

// OnPeerLost fails every transfer with the peer and forgets its early requests. The observer
// hears of the loss once: a transport may report one loss several times (UCX does for each
// endpoint to the peer, lanes' included, and for one remade to send it a last message), and a
// peer counts as lost anew only once it was heard from since.
func (in inbound) OnPeerLost(peer Peer, err error) {
	e := in.e
	e.mu.Lock()
	_, told := e.lost[peer]
	var xs []*xfer
	for k, x := range e.routes {
		if k.peer == peer {
			xs = append(xs, x)
		}
	}
	for k := range e.pending {
		if k.peer == peer {
			delete(e.pending, k)
		}
	}
	delete(e.peers, peer)                      // its proof and challenge too: a peer that comes back may run another build
	if len(xs) == 0 && e.droppedLocked(peer) { // the engine closed it: an address that never proved its hello
		e.mu.Unlock()
		return
	}
	// A retirement is this side's own reset (the UCX transport replacing its worker): the
	// peer may be alive, and is not refused to new transfers.
	if !told && !errors.Is(err, transport.ErrEndpointRetired) {
		e.rememberLostLocked(peer, err)
	}
	e.mu.Unlock()
	if !told {
		notifyPeerLost(e.obs, peer, err)
	}
	if !errors.Is(err, ErrPeerLost) {
		err = fmt.Errorf("%w: %w", ErrPeerLost, err)
	}
	for _, x := range xs {
		lost := peerLost(peer, err)
		x.box.Push(event{lost: lost})
		x.lostQueued(lost) // a transfer still queued waits no longer (L11)
	}
}

// heardLocked forgets that peer was lost: it spoke, so its next loss is a new one. e.mu is
// held.
func (e *Engine) heardLocked(peer Peer) {
	if len(e.lost) > 0 {
		delete(e.lost, peer)
	}
}

// rememberUnanswered records a Send that ended before its request arrived, bounded in count
// (Config.Tuning.MaxPending) and age (Config.Tuning.PendingTTL) like the pending requests.
func (e *Engine) rememberUnanswered(key routeKey, code wire.AbortCode, cause error) {
	e.rememberEnded(key, unanswered{code: code, reason: cause.Error()})
}

// rememberEnded is rememberUnanswered of u, stamped now. The entries older than PendingTTL go
// first, then, while the table is full, the oldest: the newest ending is always remembered (a
// late request is likelier for a transfer that just ended). The entries go in the order they
// were made (e.endedOrder), so an ending costs O(1) amortized however full the table: a scan
// of a full table on every ending, as a steady 2,500 short requests a second keep it (4,096
// entries younger than 30 s), took 14 % of a prefill process's CPU (docs/benchmarks.md).
func (e *Engine) rememberEnded(key routeKey, u unanswered) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	limit := max(e.cfg.Tuning.MaxPending, 1)
	for e.endedHead < len(e.endedOrder) {
		r := e.endedOrder[e.endedHead]
		cur, live := e.unanswered[r.key]
		live = live && cur.seq == r.seq
		if live && len(e.unanswered) < limit && now.Sub(cur.at) <= e.cfg.Tuning.PendingTTL {
			break // the oldest entry is young and there is room
		}
		if live {
			delete(e.unanswered, r.key)
		}
		e.endedOrder[e.endedHead] = endedRecord{}
		e.endedHead++
	}
	if len(e.endedOrder)-e.endedHead >= 2*limit {
		// Records of entries that left the table another way (a new transfer of the id, a
		// claim) pile up behind a live one: keep only the live ones, in order.
		kept := e.endedOrder[:0]
		for _, r := range e.endedOrder[e.endedHead:] {
			if cur, live := e.unanswered[r.key]; live && cur.seq == r.seq {
				kept = append(kept, r)
			}
		}
		clear(e.endedOrder[len(kept):])
		e.endedOrder, e.endedHead = kept, 0
	} else if e.endedHead > 0 && e.endedHead*2 >= len(e.endedOrder) { // half spent: to the front
		k := copy(e.endedOrder, e.endedOrder[e.endedHead:])
		clear(e.endedOrder[k:])
		e.endedOrder, e.endedHead = e.endedOrder[:k], 0
	}
	e.endedSeq++
	u.at, u.seq = now, e.endedSeq
	e.unanswered[key] = u
	e.endedOrder = append(e.endedOrder, endedRecord{key: key, seq: u.seq})
}

// addPendingLocked keeps a request that arrived before its Send, bounded in count and age; a
// dropped one is resent by the receiver. A request after an abort of the same id replaces it:
// the receiver started again. e.mu is held.
func (e *Engine) addPendingLocked(key routeKey, ri *wire.RequestInfo) {
	if p, ok := e.pending[key]; ok && p.abort == nil {
		return // a repeat
	}
	if len(e.pending) >= e.cfg.Tuning.MaxPending {
		now := time.Now()
		for k, p := range e.pending {
			if now.Sub(p.at) > e.cfg.Tuning.PendingTTL {
				delete(e.pending, k)
			}
		}
		if len(e.pending) >= e.cfg.Tuning.MaxPending {
			return
		}
	}
	e.pending[key] = pendingInfo{info: ri, at: time.Now()}
}

// lostPeer is a peer the transport reported lost: when, and its report.
type lostPeer struct {
	at  time.Time
	err error
}

// rememberLostLocked remembers peer as lost and not heard from since, bounded in count
// (Config.Tuning.MaxPending: past it the expired entries go, then the oldest) and age
// (Config.Tuning.LostPeerTTL). e.mu is held.
func (e *Engine) rememberLostLocked(peer Peer, err error) {
	now := time.Now()
	if _, ok := e.lost[peer]; !ok && len(e.lost) >= max(e.cfg.Tuning.MaxPending, 1) {
		var oldest Peer
		for p, l := range e.lost {
			if now.Sub(l.at) > e.cfg.Tuning.LostPeerTTL {
				delete(e.lost, p)
			} else if oldest == "" || l.at.Before(e.lost[oldest].at) {
				oldest = p
			}
		}
		if len(e.lost) >= max(e.cfg.Tuning.MaxPending, 1) {
			delete(e.lost, oldest)
		}
	}
	e.lost[peer] = lostPeer{at: now, err: err}
}

// PeerLost reports, without blocking, whether the transport reported peer lost less than
// Config.Tuning.LostPeerTTL ago with no word from the peer since: a *PeerLostError matching
// ErrPeerLost, or nil. A Send or Receive with such a peer fails at once with it; a live peer
// (a false alarm) clears the loss with its next message, and its request for a Send refused
// so is answered with an abort at once.
// discovery.CheckParams asks it too (discovery.LostPeers), so params of a sender that died
// are refused before its registry entry expires.
func (e *Engine) PeerLost(peer Peer) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	l, ok := e.lost[peer]
	if !ok {
		return nil
	}
	if time.Since(l.at) > e.cfg.Tuning.LostPeerTTL {
		delete(e.lost, peer)
		return nil
	}
	return &PeerLostError{Peer: peer, since: l.at, err: l.err}
}
