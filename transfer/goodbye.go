// SPDX-License-Identifier: Apache-2.0

package transfer

// The goodbye (wire 4, docs/protocol.md "Goodbye"). A departing engine (Drain, Close) tells
// each peer it had transfers with which of them ended on its side with every operation
// quiescent; the survivor ends those as an acknowledged abort would, instead of waiting for
// the peer's loss, and, once the goodbye has ended every transfer it had with the peer, closes
// its connection to the peer so that its own operations still on it get their final verdict
// from its transport. Nothing here frees memory on the peer's word alone: the survivor's own
// operations end only by their transport's verdicts (L9), and a transfer the goodbye does not
// name, or names with another nonce, sub-transfer or role, keeps the lost-peer rule.

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"weak"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// wireIdent is how a sub-transfer is named on the wire, published for the inbound handler,
// which matches a goodbye against it without touching the transfer's own fields.
type wireIdent struct {
	sub   uint16
	nonce uint64
}

// publishIdent makes the sub-transfer's wire name (wireSub, nonce) visible to onGoodbye; its
// goroutine calls it whenever it sets them.
func (x *xfer) publishIdent() { x.ident.Store(&wireIdent{sub: x.wireSub, nonce: x.nonce}) }

// endedClean is a transfer this engine ended, not completed, with every operation quiescent:
// what its goodbye lists.
type endedClean struct {
	peer  Peer
	ended wire.Ended
	at    time.Time
	// x tells a later transfer with its route key from this one, without keeping it alive: a
	// strong pointer held every ended transfer (its plan, buffers, mailbox) for PendingTTL,
	// gigabytes in minutes under the soak's load.
	x weak.Pointer[xfer]
}

// goodbyeState is what an engine keeps for goodbyes, under Engine.mu.
type goodbyeState struct {
	// ended lists, oldest first, the transfers to name in this engine's goodbye, at most
	// MaxPending, none older than PendingTTL: past that the peer has given up on them anyway.
	ended []endedClean
	// sent counts goodbye messages sent; matched and refused the entries of peers' goodbyes
	// that ended a transfer here, and those that named none of this engine's (another
	// transfer's nonce, a role that does not fit, a transfer never had with that peer).
	sent, matched, refused atomic.Int64
}

// rememberEnded records, as its goroutine ends, a sub-transfer that failed or was cancelled
// with every operation ending transport.MemoryDone: no slot poisoned, the caller's blocks not. A
// completed one is left out (its peer heard Done or completed itself), and so is a Receive that
// never got past Queued (it sent no request, so nothing of it reached the peer). A Send that
// never got past Queued is named, its operations trivially quiescent (none ever started): its
// receiver advertised and waits for it. One that took its receiver's request is named with the
// request's nonce, one whose request never reached it (its engine closed first) with none, so
// the survivor ends a Receive that never heard from it (onGoodbye) rather than wait for a
// sender that is gone. An exposure nobody claimed has no peer to tell.
func (x *xfer) rememberEnded() {
	st := x.m.load()
	if x.blocksUnknown || x.slotPoisoned || (st != Failed && st != Cancelled) || x.peer == "" {
		return
	}
	if x.receive && (x.nonce == 0 || x.path == nil) {
		return
	}
	if x.path != nil && x.nonce == 0 {
		return
	}
	role := wire.RoleSender
	if x.receive {
		role = wire.RoleReceiver
	}
	e := x.eng
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	g := &e.goodbye
	drop := 0
	for drop < len(g.ended) && (len(g.ended)-drop >= e.cfg.Tuning.MaxPending || now.Sub(g.ended[drop].at) > e.cfg.Tuning.PendingTTL) {
		drop++
	}
	g.ended = append(g.ended[drop:], endedClean{peer: x.peer, at: now, x: weak.Make(x),
		ended: wire.Ended{Request: x.h.id, Sub: x.wireSub, Nonce: x.nonce, Role: role}})
}

// takesGoodbyeLocked reports whether peer said in its hello that it takes a goodbye, in a wire
// version that has one. A peer not met, or forgotten, gets none. e.mu is held.
func (e *Engine) takesGoodbyeLocked(p Peer) bool {
	ph, ok := e.peers[p]
	if !ok || !chanClosed(ph.met) {
		return false
	}
	v, f, ok := e.agreed(ph.hello)
	return ok && v >= 4 && f&wire.FeatureGoodbye != 0
}

// sayGoodbye sends each peer that takes one a goodbye naming the transfers with it that this
// engine ended cleanly (rememberEnded); with leaving (Close, after settleBeforeGoodbye), also
// each peer it still has transfers with, so the goodbye reaches every peer before the
// endpoints close. greeted are peers known to take one although this engine may have
// forgotten their hello since (settleBeforeGoodbye's closes report them lost). Drain and
// Close call it; it never blocks on a peer (SendControl is best effort).
func (e *Engine) sayGoodbye(leaving bool, greeted map[Peer]bool) {
	e.mu.Lock()
	now := time.Now()
	byPeer := map[Peer][]wire.Ended{}
	// An entry without a nonce names whatever Receive of the request never heard from this
	// engine: not once a later transfer with the peer has the request id.
	stale := make([]bool, len(e.goodbye.ended))
	later := map[routeKey]bool{}
	for i := len(e.goodbye.ended) - 1; i >= 0; i-- {
		r := e.goodbye.ended[i]
		key := routeKey{r.peer, r.ended.Request}
		stale[i] = r.ended.Nonce == 0 && (later[key] || (e.routes[key] != nil && weak.Make(e.routes[key]) != r.x))
		later[key] = true
	}
	for i, r := range e.goodbye.ended {
		if now.Sub(r.at) <= e.cfg.Tuning.PendingTTL && !stale[i] {
			byPeer[r.peer] = append(byPeer[r.peer], r.ended)
		}
	}
	if leaving {
		for k := range e.routes {
			if _, ok := byPeer[k.peer]; !ok {
				byPeer[k.peer] = nil
			}
		}
	}
	for p := range byPeer {
		if !greeted[p] && !e.takesGoodbyeLocked(p) {
			delete(byPeer, p)
		}
	}
	e.mu.Unlock()
	room := math.MaxInt32
	if cb, ok := e.tr.(transport.ControlBound); ok {
		room = cb.ControlRoom()
	}
	for p, ended := range byPeer {
		parts, err := wire.GoodbyeParts(ended, room)
		if err != nil {
			e.log.Warn("no goodbye: the transport's control messages are too small", zap.String("peer", p.Short()), zap.Error(err))
			continue
		}
		for _, m := range parts {
			if err := e.tr.SendControl(p, wire.Encode(m)); err != nil {
				e.log.Debug("goodbye not sent", zap.String("peer", p.Short()), zap.Error(err))
				break
			}
			e.goodbye.sent.Add(1)
		}
	}
}

// settleBeforeGoodbye (Close, its transfers already told to stop, before its goodbye) waits
// at most an eighth of CloseTimeout more for them, then closes the connection to every peer
// that still has a transfer here whose operations did not end (a receive UCX matched, a send
// on the wire to a frozen peer), and waits at most half of
// CloseTimeout, and never past ctx (Close's share for stopping its transfers), for those
// transfers to take the verdicts the close gives their operations (on a loaded host a
// CancelGrace was found too short). What ends so, with every verdict transport.MemoryDone, the
// goodbye can name; the rest keep the lost-peer rule on the other side. The transport's own
// Close, right after, would have closed these connections anyway. It returns the peers it
// closed that take a goodbye: a closed connection reports its peer lost, which forgets the
// peer's hello, and the goodbye must still reach them (a new connection carries it); without
// it a survivor's receive that UCX had matched stayed held until its slot was poisoned.
func (e *Engine) settleBeforeGoodbye(ctx context.Context) map[Peer]bool {
	pc, ok := e.tr.(transport.PeerCloser)
	if !ok || e.liveDrivers.Load() == 0 {
		return nil
	}
	// First a while longer without closing: a send to a live peer that is cut mid-message
	// strands the peer's receive that UCX had matched (nothing completes it, and over TCP it
	// stays held even after the goodbye), and the goodbye would go on a new connection that the
	// transport's close may drop before it leaves. On a loaded host CancelGrace was too short
	// for sends the peer was taking (its slots were poisoned at the quarantine timeout).
	wait, cancelWait := context.WithTimeout(ctx, e.cfg.CloseTimeout/8)
	err := e.waitDrivers(wait)
	cancelWait()
	if err == nil {
		return nil
	}
	e.mu.Lock()
	peers := map[Peer]bool{}
	greeted := map[Peer]bool{}
	for k := range e.routes {
		peers[k.peer] = true
		if e.takesGoodbyeLocked(k.peer) {
			greeted[k.peer] = true
		}
	}
	e.mu.Unlock()
	for p := range peers {
		pc.ClosePeer(p)
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CloseTimeout/2)
	defer cancel()
	_ = e.waitDrivers(ctx)
	return greeted
}

// onGoodbye takes a peer's goodbye: each transfer it names that this engine has with that peer,
// with the same nonce and sub-transfer and the other role, is told the peer ended it with its
// operations quiescent (xfer.peerLeft). On the last part, when every transfer this engine has
// with the peer under way was so named, the engine closes its connection to the peer
// (transport.PeerCloser): its own operations still on it then end with their transport's verdict. A
// goodbye that names a transfer it does not have, or names one wrongly (someone else's
// message claiming the peer's address cannot know the nonces), ends nothing and closes
// nothing that still carries a transfer.
func (e *Engine) onGoodbye(from Peer, m *wire.Goodbye) {
	var told []*xfer
	refused := 0
	e.mu.Lock()
	for _, en := range m.Ended {
		x := e.routes[routeKey{from, en.Request}]
		if x == nil || !(x.named(en) || x.unansweredBy(en)) {
			refused++
			continue
		}
		x.farewell.Store(true)
		told = append(told, x)
	}
	closePeer := false
	if m.Flags&wire.GoodbyeLast != 0 {
		closePeer = true
		for k, x := range e.routes {
			if k.peer == from && x.m.load() != Queued && !x.farewell.Load() {
				closePeer = false // a transfer the goodbye did not end still runs on the connection
				break
			}
		}
	}
	e.mu.Unlock()
	e.goodbye.matched.Add(int64(len(told)))
	e.goodbye.refused.Add(int64(refused))
	if refused > 0 {
		e.log.Debug("goodbye named transfers this engine does not have with the peer", zap.String("peer", from.Short()), zap.Int("refused", refused))
	}
	for _, x := range told {
		x.box.Push(event{goodbye: true})
	}
	if !closePeer {
		return
	}
	if dc, ok := e.tr.(departedCloser); ok {
		dc.CloseDepartedPeer(from) // its completions come after the events just pushed
	} else if pc, ok := e.tr.(transport.PeerCloser); ok {
		pc.ClosePeer(from)
	}
}

// departedCloser is a transport.PeerCloser that can close the connection to a peer whose
// goodbye said it sends nothing more, releasing what the close fails where the transport can
// prove that everything the peer sent has arrived (the UCX transport over shared memory),
// rather than keeping it busy as for a live peer.
type departedCloser interface {
	CloseDepartedPeer(peer Peer)
}

// named reports whether a goodbye's entry names this sub-transfer: its nonce and sub-transfer
// as on the wire, and the departing side in the other role.
func (x *xfer) named(en wire.Ended) bool {
	id := x.ident.Load()
	if id == nil || id.nonce == 0 || id.nonce != en.Nonce || id.sub != en.Sub {
		return false
	}
	return (en.Role == wire.RoleSender) == x.receive
}

// unansweredBy reports whether a goodbye's entry without a nonce, a Send of the departing peer
// that ended before any request reached it, is about this sub-transfer: a Receive of that
// request that never heard from its sender. Its request will never be answered; a Receive
// that heard from its sender has a nonce the goodbye would name.
func (x *xfer) unansweredBy(en wire.Ended) bool {
	return en.Nonce == 0 && en.Role == wire.RoleSender && x.receive && !x.heard.Load()
}

// peerLeft ends the transfer on the peer's goodbye: the peer's operations for it are over, so
// what this side exposed to it (an RMA offer, announced slots) is no longer read, as on an
// acknowledged abort; its own operations are cancelled and the transfer resolves when their
// transport reports them final (the goodbye's endpoint close gives those still on the wire
// their verdict). Nothing is released on the peer's word that this side's transport holds.
func (x *xfer) peerLeft() {
	if p, ok := x.path.(peerTalk); ok {
		p.peerLost()
	}
	if x.aborting {
		x.maybeResolve()
		return
	}
	x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%w (code %d): it ended the transfer and said goodbye", ErrPeerAborted, wire.AbortClosed)},
		0, x.eng.cfg.Tuning.CancelGrace)
}
