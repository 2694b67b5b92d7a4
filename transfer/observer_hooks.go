// SPDX-License-Identifier: Apache-2.0

package transfer

import "github.com/kvxfer/kvxfer/transfer/transport"

// This file holds optional extensions of Observer, kept apart from the lifecycle so the state
// machine does not change when a metrics or logging package needs one more fact. An Observer
// that also implements one of these interfaces hears the extra events; one that does not is
// called exactly as before. The engine reaches them only through the notify helpers below.

// StartInfo describes a request the engine has just accepted.
type StartInfo struct {
	// ID is the request id.
	ID RequestID
	// Receive is true for Engine.Receive (the decode side), false for Engine.Send and
	// Engine.Expose (the prefill side).
	Receive bool
	// Peers names the peer of every sub-transfer, in sub-transfer order.
	Peers []Peer
	// Bytes is the stream size over all sub-transfers.
	Bytes int64
}

// startObserver is an optional extension of Observer: it hears every request the engine
// accepts, before any transition of that request is reported, so it can tell a transfer's
// direction, peers and size, and time it from acceptance. Same rules as Observer: it hears
// events on the engine's observer goroutine, in order, and should be fast.
type startObserver interface {
	OnStart(info StartInfo)
}

// peerObserver is an optional extension of Observer: it hears about peers coming and going.
// Same rules as Observer.
type peerObserver interface {
	// OnPeerConnected reports that the transport reached peer (a new or re-established
	// connection). The engine reports it when its transport does.
	OnPeerConnected(peer Peer)
	// OnPeerLost reports that the transport lost peer, and why: once per loss, however many
	// times the transport reports it, until the peer is heard from again.
	OnPeerLost(peer Peer, err error)
}

// helloRefusal says why the engine refused a peer's proof of its hello (docs/protocol.md, "The
// hello handshake"): each is a peer that claimed what it could not prove, or a message
// misrouted or replayed; the peer's entry is unchanged.
type helloRefusal int

// The reasons.
const (
	// helloRefusedUnsolicited: a proof from an address this engine has no challenge
	// outstanding for (never sent one, or forgot it: expired, evicted, the peer lost).
	helloRefusedUnsolicited helloRefusal = iota
	// helloRefusedMismatch: a proof that echoes bytes other than the challenge outstanding
	// for its address.
	helloRefusedMismatch
	// helloRefusedReplayed: a proof that echoes a challenge already answered.
	helloRefusedReplayed
	// helloRefusalCount is the number of reasons, for tables indexed by them.
	helloRefusalCount
)

var helloRefusalNames = [helloRefusalCount]string{"unsolicited", "mismatch", "replayed"}

// String names the reason as metrics label it.
func (r helloRefusal) String() string {
	if r >= 0 && r < helloRefusalCount {
		return helloRefusalNames[r]
	}
	return "unknown"
}

// trustObserver is an optional extension of Observer: it hears each message of a peer's hello
// handshake that the engine refused. Same rules as Observer.
type trustObserver interface {
	// OnHelloRefused reports a proof that did not answer a challenge of this engine's.
	OnHelloRefused(peer Peer, reason string)
	// OnAuthRefused reports a hello, challenge or proof, or ContextParams given to
	// Engine.VerifyParams, that no cluster key of this engine's sealed (Config.ClusterKeys).
	OnAuthRefused(err *AuthError)
}

// notifyStart tells o about h, just accepted, if it listens for starts; the StartInfo is built
// only then, so an engine without such an observer pays one type assertion.
func notifyStart(o Observer, h *Handle, receive bool) {
	if q, ok := o.(*observerQueue); ok && !q.start {
		return
	}
	if s, ok := o.(startObserver); ok {
		s.OnStart(startInfo(h, receive))
	}
}

// notifyPeerLost tells o about a lost peer if it listens for peers.
func notifyPeerLost(o Observer, peer Peer, err error) {
	if p, ok := o.(peerObserver); ok {
		p.OnPeerLost(peer, err)
	}
}

// notifyHelloRefused tells o about a refused hello proof if it listens for them.
func notifyHelloRefused(o Observer, peer Peer, reason helloRefusal) {
	if p, ok := o.(trustObserver); ok {
		p.OnHelloRefused(peer, reason.String())
	}
}

// notifyAuthRefused tells o about an unauthenticated message if it listens for them.
func notifyAuthRefused(o Observer, err *AuthError) {
	if p, ok := o.(trustObserver); ok {
		p.OnAuthRefused(err)
	}
}

// startInfo describes h, whose subs are set, for notifyStart.
func startInfo(h *Handle, receive bool) StartInfo {
	info := StartInfo{ID: h.id, Receive: receive, Peers: make([]Peer, len(h.subs)), Bytes: h.total.Load()}
	for i, x := range h.subs {
		info.Peers[i] = x.peer
	}
	return info
}

var _ transport.PeerConnectReporter = inbound{}

// OnPeerConnected passes the transport's report on to the observer.
func (in inbound) OnPeerConnected(peer Peer) {
	if p, ok := in.e.obs.(peerObserver); ok {
		p.OnPeerConnected(peer)
	}
}
