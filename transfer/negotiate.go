// SPDX-License-Identifier: Apache-2.0

package transfer

// Version negotiation. Two engines exchange hellos (package wire) the first time a receiver asks
// its sender for a request: the receiver sends its hello and waits, in Queued, for the
// answer; the sender records the receiver's hello and answers with its own. Each then knows
// the wire version the pair speaks (the highest both do) and the features the other lacks,
// so a request that needs one fails at once with an ErrPeerLacksFeature, and one that can do
// without (the direct path, RMA, an offer in parts) takes the path both speak.
//
// A hello's sender address is whatever its sender wrote, so from wire 4 on a hello proves
// nothing by itself (docs/protocol.md, "The hello handshake"): the engine answers it and sends
// a challenge to the address it named, and takes the peer's speech only from a proof that
// echoes that challenge, which only the worker behind the address received. A wire-3 peer
// proves nothing: its hello is taken as it says, but for large segments, and never over a
// proven one. A peer the engine knows nothing of (never met, forgotten from the table, or lost:
// a restarted peer may run another build) is unknown, with no features, and a transfer with it
// greets it and waits for its proof.

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"go.uber.org/zap"
)

// wireVersions returns the lowest and highest wire versions this build's engines speak: what
// they say in their hellos, and what a worker may publish for others to check.
func wireVersions() (min, max int) { return wire.MinVersion, wire.Version }

// knownFeatures returns the features this build's engines speak.
func knownFeatures() feature { return wire.KnownFeatures }

// feature is one part of the wire protocol that a peer may lack (a set of them, joined with
// "+" by String: streaming, partial, direct, rma, multi-part, large-segments, ...). The staging
// path is in every wire version and is not one.
type feature = wire.Feature

// ErrPeerLacksFeature: the peer does not speak a feature the request needs, or no wire
// version in common with this engine. The error names the feature and the
// peer's versions; the request fails
// before anything of it is sent, not at its deadline.
var ErrPeerLacksFeature = errors.New("kvxfer: the peer lacks a protocol feature")

// featureError names the peer, what the request needed, and the versions the peer speaks.
type featureError struct {
	Peer Peer
	// Feature is what the request needed; zero when the two engines share no wire version.
	Feature feature
	// PeerVersion is the version the pair speaks (the highest both do), or, when they share
	// none, the highest the peer speaks; PeerMinVersion is the lowest it speaks.
	PeerVersion, PeerMinVersion int
}

// Error implements error.
func (e *featureError) Error() string {
	if e.Feature == 0 {
		return fmt.Sprintf("%v: %s speaks wire versions %d to %d, this engine %d to %d: none in common",
			ErrPeerLacksFeature, e.Peer, e.PeerMinVersion, e.PeerVersion, wire.MinVersion, wire.Version)
	}
	return fmt.Sprintf("%v: %s (wire version %d) does not speak %v, which the request needs",
		ErrPeerLacksFeature, e.Peer, e.PeerVersion, e.Feature)
}

// Unwrap returns ErrPeerLacksFeature.
func (e *featureError) Unwrap() error { return ErrPeerLacksFeature }

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
	met    chan struct{} // closed once the peer's speech is known: proven, or a wire-3 hello
	hello  wire.Hello    // that speech, valid once met is closed; under Engine.mu
	proven bool          // hello came from a proof: no hello changes it
	sentAt time.Time     // our last hello to it that asked for an answer
	// waiting counts the transfers waiting on met: the table does not forget the entry
	// while any does.
	waiting   int
	challenge challenge
	// greeted: a transfer of this engine greeted the peer, so its connection is this
	// engine's own wish, never dropped as unproven (unproven.go).
	greeted bool
}

// challenge is the one challenge outstanding for a peer's address, and the last one answered
// (a proof that echoes it again is a replay).
type challenge struct {
	value          [wire.ChallengeBytes]byte
	drawnAt        time.Time // zero: none outstanding
	sentAt         time.Time
	answered       [wire.ChallengeBytes]byte
	answeredBefore bool
}

// agreed is the pair's speech with the peer: the version both speak (ok false when none)
// and the peer's features. Called with e.mu held.
func (e *Engine) agreed(h wire.Hello) (version uint8, features wire.Feature, ok bool) {
	version = min(e.speech.max, h.Max)
	return version, h.Features, version >= max(e.speech.min, h.Min)
}

// proves reports whether this engine takes a peer's speech only from a proof: both speak
// wire 4 or later.
func (e *Engine) proves(peerMax uint8) bool {
	return min(e.speech.max, peerMax) >= wire.ProofVersion
}

// peerLocked returns the peer's entry, made if new, or nil when the table is full of entries
// transfers wait on and forWaiter is false (a hello nobody asked for). e.mu is held. The table
// holds MaxPending peers: past that, peers nobody waits on are forgotten with their proofs
// and challenges (a transfer with one greets it again).
func (e *Engine) peerLocked(p Peer, forWaiter bool) *peerHello {
	if ph, ok := e.peers[p]; ok {
		return ph
	}
	if len(e.peers) >= e.cfg.Tuning.MaxPending {
		for k, ph := range e.peers {
			if ph.waiting == 0 {
				delete(e.peers, k)
			}
		}
		if len(e.peers) >= e.cfg.Tuning.MaxPending && !forWaiter {
			return nil
		}
	}
	ph := &peerHello{met: make(chan struct{})}
	e.peers[p] = ph
	return ph
}

// learnLocked records the peer's speech and wakes whoever waits for it. e.mu is held.
func (ph *peerHello) learnLocked(h wire.Hello, proven bool) {
	ph.hello, ph.proven = h, proven
	if !chanClosed(ph.met) {
		close(ph.met)
	}
}

// onHello answers a peer's hello unless it is itself an answer. A wire-3 peer's hello is its
// speech (less large segments, which it cannot prove); a wire-4 peer's is challenged, and
// changes nothing until proven.
func (e *Engine) onHello(from Peer, m *wire.Hello) {
	e.mu.Lock()
	e.heardLocked(from)
	ph := e.peerLocked(from, false)
	if ph == nil {
		e.mu.Unlock()
		e.log.Debug("dropping a hello: the peer table is full of peers transfers wait on", zap.String("peer", from.Short()))
		return
	}
	var ch *wire.HelloChallenge
	_, _, common := e.agreed(*m)
	switch {
	case !e.proves(m.Max) || !common: // nothing to prove: it can only fail a request at once
		if !ph.proven {
			h := *m
			if e.speech.max >= wire.ProofVersion {
				h.Features &^= wire.FeatureLargeSegments
			}
			ph.learnLocked(h, false)
		}
	case !m.Reply || !ph.proven: // a peer met again may have restarted: prove it anew
		ch = e.challengeLocked(ph)
	}
	var dropNow Peer
	if !m.Reply || ch != nil { // an answer connects to the address the hello names
		dropNow = e.answeredUnprovenLocked(from)
	}
	e.mu.Unlock()
	e.closeUnproven(dropNow)
	if !m.Reply {
		_ = e.tr.SendControl(from, e.seal(e.speech.hello(true)))
	}
	if ch != nil {
		_ = e.tr.SendControl(from, e.seal(ch))
	}
}

// challengeLocked returns the challenge to send to the peer, or nil when the outstanding one
// went less than a RetryInterval ago. One is outstanding per peer; it is resent as it is
// until answered, or replaced after PendingTTL. e.mu is held.
func (e *Engine) challengeLocked(ph *peerHello) *wire.HelloChallenge {
	c, now := &ph.challenge, time.Now()
	switch {
	case c.drawnAt.IsZero() || now.Sub(c.drawnAt) > e.cfg.Tuning.PendingTTL:
		_, _ = rand.Read(c.value[:]) // never fails (crypto/rand)
		c.drawnAt = now
	case now.Sub(c.sentAt) < e.cfg.Tuning.RetryInterval:
		return nil
	}
	c.sentAt = now
	return &wire.HelloChallenge{Challenge: c.value}
}

// seal encodes a message of the hello handshake, sealed when the engine holds cluster keys.
func (e *Engine) seal(m wire.Message) []byte {
	if e.keys != nil {
		return e.keys.SealMessage(m)
	}
	return wire.Encode(m)
}

// onChallenge proves this engine's hello to the address the challenge came from: only the
// worker behind that address gets the proof.
func (e *Engine) onChallenge(from Peer, m *wire.HelloChallenge) {
	e.mu.Lock()
	dropNow := e.answeredUnprovenLocked(from) // the proof connects to the address named
	e.mu.Unlock()
	e.closeUnproven(dropNow)
	p := &wire.HelloProof{Echo: m.Challenge, Min: e.speech.min, Max: e.speech.max, Features: e.speech.features}
	_ = e.tr.SendControl(from, e.seal(p))
}

// onProof takes the peer's speech from a proof that echoes the challenge outstanding for its
// address; any other is refused, counted, and changes nothing.
func (e *Engine) onProof(from Peer, m *wire.HelloProof) {
	e.mu.Lock()
	ph := e.peers[from]
	refusal := helloRefusal(-1)
	switch {
	case ph == nil:
		refusal = helloRefusedUnsolicited
	case ph.challenge.answeredBefore && subtle.ConstantTimeCompare(m.Echo[:], ph.challenge.answered[:]) == 1:
		refusal = helloRefusedReplayed
	case ph.challenge.drawnAt.IsZero() || time.Since(ph.challenge.drawnAt) > e.cfg.Tuning.PendingTTL:
		refusal = helloRefusedUnsolicited
	case subtle.ConstantTimeCompare(m.Echo[:], ph.challenge.value[:]) != 1:
		refusal = helloRefusedMismatch
	default:
		c := &ph.challenge
		c.answered, c.answeredBefore, c.drawnAt = c.value, true, time.Time{}
		e.provenLocked(from)
		ph.learnLocked(wire.Hello{Header: wire.Header{Kind: wire.KindHello}, Min: m.Min, Max: m.Max, Features: m.Features}, true)
	}
	e.mu.Unlock()
	if refusal >= 0 {
		e.log.Debug("refusing a hello proof", zap.String("peer", from.Short()), zap.Stringer("reason", refusal))
		notifyHelloRefused(e.obs, from, refusal)
	}
}

// greet sends the engine's hello to p unless one went less than a RetryInterval ago, and
// returns the peer's entry.
func (e *Engine) greet(p Peer) *peerHello {
	ph, release := e.greetWaiting(p)
	release()
	return ph
}

// greetWaiting is greet for a transfer that may wait on the entry: the table keeps it until
// release is called.
func (e *Engine) greetWaiting(p Peer) (ph *peerHello, release func()) {
	e.mu.Lock()
	ph = e.peerLocked(p, true)
	ph.waiting++
	ph.greeted = true
	e.provenLocked(p)
	release = func() {
		e.mu.Lock()
		ph.waiting--
		e.mu.Unlock()
	}
	now := time.Now()
	send := !chanClosed(ph.met) && now.Sub(ph.sentAt) >= e.cfg.Tuning.RetryInterval
	if send {
		ph.sentAt = now
	}
	e.mu.Unlock()
	if send {
		_ = e.tr.SendControl(p, e.seal(e.speech.hello(false)))
	}
	return ph, release
}

// peerFeatures is what the engine knows of a peer: the version the pair speaks, the lowest the
// peer speaks, and its features; or, for a peer it knows nothing of (never met, forgotten or
// lost), the lowest version this engine speaks and no features.
func (e *Engine) peerFeatures(p Peer) (version, minVersion int, features wire.Feature) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ph, ok := e.peers[p]; ok && chanClosed(ph.met) {
		v, f, _ := e.agreed(ph.hello)
		return int(v), int(ph.hello.Min), f
	}
	return int(e.speech.min), int(e.speech.min), 0
}

// know (a sender, on the receiver's request) makes sure the engine knows the receiver's speech:
// if it does not (its entry was forgotten, or the receiver was lost and came back), it greets
// the receiver and waits for its proof as a receiver waits for a hello, and sets
// x.peerFeatures. It reports false if the transfer ended; the receiver has heard why.
func (x *xfer) know() bool {
	e := x.eng
	ph, release := e.greetWaiting(x.peer)
	defer release()
	if !chanClosed(ph.met) && !x.awaitHello(ph) {
		x.stoppedBeforeStart("learned the receiver's wire versions and features")
		return false
	}
	e.mu.Lock()
	_, x.peerFeatures, _ = e.agreed(ph.hello)
	e.mu.Unlock()
	return true
}

// meet (a receiver, first thing, still Queued) greets the peer and waits for its hello, then
// checks that the peer speaks what the request needs. It resends the hello as the request
// would be resent (RetryInterval, doubling, MaxRetries times) and waits at most the queued
// phase. It reports false if the transfer ended.
func (x *xfer) meet() bool {
	e := x.eng
	ph, release := e.greetWaiting(x.peer)
	defer release()
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
		fe := &featureError{Peer: x.peer, Feature: lacks, PeerVersion: int(version), PeerMinVersion: int(peerMin)}
		if !ok {
			fe.Feature, fe.PeerVersion = 0, int(peerMax)
		}
		x.log().Debug("the peer lacks what the request needs", zap.Error(fe))
		x.queuedExit(&requestError{ID: x.h.id, Err: fe})
		return false
	}
	return true
}

// awaitHello waits for the peer's hello, resending ours as a request would be resent. It
// reports false if the transfer ended instead.
func (x *xfer) awaitHello(ph *peerHello) bool {
	e := x.eng
	backoff, retries := e.cfg.Tuning.RetryInterval, 0
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
			if retries < e.cfg.Tuning.MaxRetries {
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
	return &featureError{Peer: x.peer, Feature: wire.FeatureLargeSegments, PeerVersion: v, PeerMinVersion: vmin}
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
