// SPDX-License-Identifier: Apache-2.0

package transfer

// Version negotiation. Two engines exchange hellos (package wire) the first time a receiver asks
// its sender for a request: the receiver sends its hello and waits, in Queued, for the
// answer; the sender records the receiver's hello and answers with its own. Each then knows
// the wire version the pair speaks (the highest both do) and the features the other lacks,
// so a request that needs one fails at once with a *FeatureError, and one that can do
// without (the direct path, RMA, an offer in parts) takes the path both speak. The engine
// forgets a peer's hello when the transport reports the peer lost: a restarted peer may run
// another build.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"go.uber.org/zap"
)

// WireVersions returns the lowest and highest wire versions this build's engines speak: what
// they say in their hellos, and what a worker may publish for others to check.
func WireVersions() (min, max int) { return wire.MinVersion, wire.Version }

// Features returns the features this build's engines speak.
func Features() Feature { return wire.KnownFeatures }

// Feature is one part of the wire protocol that a peer may lack (a set of them, joined with
// "+" by String). The staging path is in every wire version and is not one.
type Feature = wire.Feature

// The features.
const (
	// FeatureStreaming: layer-aligned chunks, which a streaming Receive asks for.
	FeatureStreaming = wire.FeatureStreaming
	// FeaturePartial: a request naming the blocks its receiver already holds.
	FeaturePartial = wire.FeaturePartial
	// FeatureDirect: the one-copy path.
	FeatureDirect = wire.FeatureDirect
	// FeatureRMA: the direct path's RMA mode.
	FeatureRMA = wire.FeatureRMA
	// FeatureMultiPart: an RMA offer in more than one control message.
	FeatureMultiPart = wire.FeatureMultiPart
	// FeatureLargeSegments: a receiver that takes the large pieces some transports send
	// (transport.LargeSegmentSender: UCX's TCP segments above 64 KiB).
	FeatureLargeSegments = wire.FeatureLargeSegments
)

// ErrPeerLacksFeature: the peer does not speak a feature the request needs, or no wire
// version in common with this engine. The error is a *FeatureError; the request fails
// before anything of it is sent, not at its deadline.
var ErrPeerLacksFeature = errors.New("kvxfer: the peer lacks a protocol feature")

// FeatureError names the peer, what the request needed, and the versions the peer speaks.
type FeatureError struct {
	Peer Peer
	// Feature is what the request needed; zero when the two engines share no wire version.
	Feature Feature
	// PeerVersion is the version the pair speaks (the highest both do), or, when they share
	// none, the highest the peer speaks; PeerMinVersion is the lowest it speaks.
	PeerVersion, PeerMinVersion int
}

// Error implements error.
func (e *FeatureError) Error() string {
	if e.Feature == 0 {
		return fmt.Sprintf("%v: %s speaks wire versions %d to %d, this engine %d to %d: none in common",
			ErrPeerLacksFeature, e.Peer, e.PeerMinVersion, e.PeerVersion, wire.MinVersion, wire.Version)
	}
	return fmt.Sprintf("%v: %s (wire version %d) does not speak %v, which the request needs",
		ErrPeerLacksFeature, e.Peer, e.PeerVersion, e.Feature)
}

// Unwrap returns ErrPeerLacksFeature.
func (e *FeatureError) Unwrap() error { return ErrPeerLacksFeature }

// speech is what an engine says in its hello: the versions and features it speaks. Every
// engine speaks the build's (New); tests make engines that speak less, or more.
type speech struct {
	min, max uint8
	features wire.Feature
}

func buildSpeech() speech {
	return speech{min: wire.MinVersion, max: wire.Version, features: wire.KnownFeatures}
}

func (s speech) hello(reply bool) *wire.Hello {
	return &wire.Hello{Min: s.min, Max: s.max, Reply: reply, Features: s.features}
}

// peerHello is what the engine knows of one peer's speech.
type peerHello struct {
	met    chan struct{} // closed once the peer's hello arrived
	hello  wire.Hello    // the latest, valid once met is closed; under Engine.mu
	sentAt time.Time     // our last hello to it that asked for an answer
}

// agreed is the pair's speech with the peer: the version both speak (ok false when none)
// and the peer's features. Called with e.mu held.
func (e *Engine) agreed(h wire.Hello) (version uint8, features wire.Feature, ok bool) {
	version = min(e.speech.max, h.Max)
	return version, h.Features, version >= max(e.speech.min, h.Min)
}

// peerLocked returns the peer's entry, made if new. e.mu is held. The table holds at most
// MaxPending peers: past that, peers nobody waits on are forgotten (they are greeted again).
func (e *Engine) peerLocked(p Peer) *peerHello {
	if ph, ok := e.peers[p]; ok {
		return ph
	}
	if len(e.peers) >= e.cfg.MaxPending {
		for k, ph := range e.peers {
			if chanClosed(ph.met) {
				delete(e.peers, k)
			}
		}
	}
	ph := &peerHello{met: make(chan struct{})}
	e.peers[p] = ph
	return ph
}

// onHello records a peer's hello and answers it unless it is itself an answer.
func (e *Engine) onHello(from Peer, m *wire.Hello) {
	e.mu.Lock()
	e.heardLocked(from)
	ph := e.peerLocked(from)
	ph.hello = *m
	if !chanClosed(ph.met) {
		close(ph.met)
	}
	e.mu.Unlock()
	if !m.Reply {
		_ = e.tr.SendControl(from, wire.Encode(e.speech.hello(true)))
	}
}

// greet sends the engine's hello to p unless one went less than a RetryInterval ago, and
// returns the peer's entry.
func (e *Engine) greet(p Peer) *peerHello {
	e.mu.Lock()
	ph := e.peerLocked(p)
	now := time.Now()
	send := !chanClosed(ph.met) && now.Sub(ph.sentAt) >= e.cfg.RetryInterval
	if send {
		ph.sentAt = now
	}
	e.mu.Unlock()
	if send {
		_ = e.tr.SendControl(p, wire.Encode(e.speech.hello(false)))
	}
	return ph
}

// peerFeatures is what a sender knows of its receiver: the version the pair speaks, the
// lowest the receiver speaks, and its features; or, when no hello came (the table forgot
// it), this engine's own, which the receiver checked its request against when it met us.
func (e *Engine) peerFeatures(p Peer) (version, minVersion int, features wire.Feature) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ph, ok := e.peers[p]; ok && chanClosed(ph.met) {
		v, f, _ := e.agreed(ph.hello)
		return int(v), int(ph.hello.Min), f
	}
	return int(e.speech.max), int(e.speech.min), e.speech.features
}

// meet (a receiver, first thing, still Queued) greets the peer and waits for its hello, then
// checks that the peer speaks what the request needs. It resends the hello as the request
// would be resent (RetryInterval, doubling, MaxRetries times) and waits at most the queued
// phase. It reports false if the transfer ended.
func (x *xfer) meet() bool {
	e := x.eng
	ph := e.greet(x.peer)
	if !chanClosed(ph.met) && !x.awaitHello(ph) {
		return false
	}
	e.mu.Lock()
	version, features, ok := e.agreed(ph.hello)
	peerMin, peerMax := ph.hello.Min, ph.hello.Max
	e.mu.Unlock()
	x.peerFeatures = features
	need := wire.Feature(0)
	if x.stream {
		need |= wire.FeatureStreaming
	}
	if x.heldOf > 0 {
		need |= wire.FeaturePartial
	}
	if lacks := need &^ features; !ok || lacks != 0 {
		fe := &FeatureError{Peer: x.peer, Feature: lacks, PeerVersion: int(version), PeerMinVersion: int(peerMin)}
		if !ok {
			fe.Feature, fe.PeerVersion = 0, int(peerMax)
		}
		x.log().Debug("the peer lacks what the request needs", zap.Error(fe))
		x.queuedExit(&RequestError{ID: x.h.id, Err: fe})
		return false
	}
	return true
}

// awaitHello waits for the peer's hello, resending ours as a request would be resent. It
// reports false if the transfer ended instead.
func (x *xfer) awaitHello(ph *peerHello) bool {
	e := x.eng
	backoff, retries := e.cfg.RetryInterval, 0
	retry := time.NewTimer(backoff)
	defer retry.Stop()
	for !chanClosed(ph.met) {
		select {
		case <-ph.met:
		case <-x.box.Ready():
			for _, ev := range x.box.Take(nil) {
				if ev.lost != nil {
					x.queuedExit(ev.lost)
					return false
				}
				x.backlog = append(x.backlog, ev) // another transfer's: the loop drops it
			}
		case <-x.qctx.Done():
			x.queuedExit(x.queueErr(context.Cause(x.qctx)))
			return false
		case <-retry.C:
			if retries < e.cfg.MaxRetries {
				retries++
				backoff *= 2
				e.greet(x.peer)
				retry.Reset(backoff)
			}
		}
	}
	return true
}

// peerHas reports whether the peer speaks f.
func (x *xfer) peerHas(f wire.Feature) bool { return x.peerFeatures&f == f }

// refuseUnspoken (a sender, on the receiver's request) refuses a request for a feature this
// engine does not speak, which only an engine that speaks less than its build gets: one that
// read our hello never asks.
// refuseSmallReceiver (a sender, before anything is sent) refuses a receiver that does not say
// it takes the large pieces this engine's transport sends (transport.LargeSegmentSender): such
// a receiver's transport would read past its buffer or abort.
func (x *xfer) refuseSmallReceiver() error {
	ls, ok := x.eng.tr.(transport.LargeSegmentSender)
	if !ok || !ls.SendsLargeSegments() || x.peerFeatures&wire.FeatureLargeSegments != 0 {
		return nil
	}
	v, vmin, _ := x.eng.peerFeatures(x.peer)
	return &FeatureError{Peer: x.peer, Feature: wire.FeatureLargeSegments, PeerVersion: v, PeerMinVersion: vmin}
}

func (x *xfer) refuseUnspoken(ri *wire.RequestInfo) error {
	need := wire.Feature(0)
	if ri.Flags&wire.FlagLayerCut != 0 {
		need |= wire.FeatureStreaming
	}
	if ri.HeldOf > 0 {
		need |= wire.FeaturePartial
	}
	if ri.Flags&wire.FlagDirect != 0 {
		need |= wire.FeatureDirect
	}
	if ri.Flags&wire.FlagRMA != 0 {
		need |= wire.FeatureRMA
	}
	if lacks := need &^ x.eng.speech.features; lacks != 0 {
		return fmt.Errorf("this engine does not speak %v", lacks)
	}
	return nil
}
