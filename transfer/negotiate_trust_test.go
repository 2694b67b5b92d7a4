// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// A hello names its sender in a field the sender writes, so it proves nothing: these tests
// forge hellos and proofs "from" a peer (mem.Network.Spoof, what a lying peer does over UCX)
// and check that what the engine believes of that peer, and what it sends it, follow only what
// the real peer proved (docs/protocol.md, "The hello handshake").

// wire3 is an engine of wire version 3: an older build, which sends hellos and no proofs.
var wire3 = speech{min: 3, max: 3, features: wire.KnownFeatures}

// trustTrio is a sender ("prefill") whose transport sends large pieces when large is set, a
// receiver ("decode") that says sp, and the network, on which a test forges messages.
type trustTrio struct {
	net      *mem.Network
	src, dst *Engine
	hellos   atomic.Int32 // hellos from the sender to the receiver
	refusals *refusalCounter
}

func newTrustTrio(t *testing.T, large bool, sp speech, srcCfg Config) *trustTrio {
	t.Helper()
	tt := &trustTrio{net: mem.NewNetwork(), refusals: &refusalCounter{}}
	var srcTr transport.Transport = tt.net.Transport("prefill")
	if large {
		srcTr = largeSegments{srcTr.(*mem.Transport)}
	}
	srcCfg.Observer = tt.refusals
	a, err := newEngine(srcTr, srcCfg, buildSpeech())
	require.NoError(t, err)
	b, err := newEngine(tt.net.Transport("decode"), patientConfig(), sp)
	require.NoError(t, err)
	tt.src, tt.dst = a, b
	tt.countHellos()
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
		requireSlotsAccounted(t, a)
		requireSlotsAccounted(t, b)
	})
	return tt
}

// countHellos counts the hellos from the sender to the receiver, and delivers every message.
func (tt *trustTrio) countHellos() {
	tt.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		if fp.Kind == wire.KindHello && fp.From == "prefill" && fp.To == "decode" {
			tt.hellos.Add(1)
		}
		return mem.Fault{}
	})
}

// transfer moves request id from the sender to the receiver and checks the outcome: refused
// (the sender would send large pieces to a receiver that did not prove it takes them; not a
// byte reaches it) or completed, every byte.
func (tt *trustTrio) transfer(t *testing.T, id RequestID, refused bool) {
	t.Helper()
	tt.transferOrdered(t, id, refused, false)
}

// transferOrdered is transfer, with the Receive made first when receiverFirst: after a false
// alarm the sender refuses a Send to the receiver until the receiver speaks again, and its
// request does.
func (tt *trustTrio) transferOrdered(t *testing.T, id RequestID, refused, receiverFirst bool) {
	t.Helper()
	src, dst := pools(t, uint64(id))
	before := dst.stream(t)
	var hr *Handle
	var err error
	if receiverFirst {
		hr, err = tt.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		require.NoError(t, err)
		eventually(t, func() bool { return tt.src.PeerLost("decode") == nil }, "the receiver's request ended the false alarm")
	}
	hs, err := tt.src.Send(bg, Spec{ID: id, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	if !receiverFirst {
		hr, err = tt.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		require.NoError(t, err)
	}
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	if !refused {
		requireState(t, hs, Completed)
		requireState(t, hr, Completed)
		require.Equal(t, src.stream(t), dst.stream(t), "every byte")
		return
	}
	requireState(t, hs, Failed, ErrIncompatible, ErrPeerLacksFeature)
	var fe *featureError
	require.True(t, errors.As(hs.Status().Err, &fe))
	require.Equal(t, wire.FeatureLargeSegments, fe.Feature)
	requireState(t, hr, Failed, ErrPeerAborted)
	require.Equal(t, before, dst.stream(t), "no byte reached the receiver")
}

// believed is what e would act on for peer p: the features of its hello, once known.
func believed(e *Engine, p Peer) feature {
	_, _, f := e.peerFeatures(p)
	return f
}

// refusalCounter counts the hello messages an engine refused, by reason.
type refusalCounter struct {
	nopObserver
	mu sync.Mutex
	n  map[string]int
}

func (r *refusalCounter) OnHelloRefused(_ Peer, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[reason]++
}

func (r *refusalCounter) OnAuthRefused(err *AuthError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[err.What+" "+err.Reason.String()]++
	r.n["auth"]++
}

// auth counts the messages refused unauthenticated: all of them, or those named what and why.
func (r *refusalCounter) auth(whatWhy ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(whatWhy) == 0 {
		return r.n["auth"]
	}
	return r.n[whatWhy[0]+" "+whatWhy[1]]
}

func (r *refusalCounter) count(reason helloRefusal) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason.String()]
}

// TestForgedHelloChangesNothing: a third party sends the sender a hello "from" the receiver
// that claims features the receiver lacks (large segments, for an older receiver), or fewer
// than it has, before or after the two met. What the sender believes of the receiver is what
// the receiver itself proved (never a feature it lacks), and large pieces go only to a
// receiver that proved it takes them.
func TestForgedHelloChangesNothing(t *testing.T) {
	older := lacking(wire.FeatureLargeSegments)
	for _, c := range []struct {
		desc     string
		receiver speech
		metFirst bool // the pair met (a transfer) before the forgery
		forged   *wire.Hello
		refused  bool // the transfer after it is refused: the receiver lacks large segments
	}{
		{"a hello claiming large segments for an older receiver it never met", older, false,
			&wire.Hello{Min: wire.MinVersion, Max: wire.Version, Features: wire.KnownFeatures}, true},
		{"a hello claiming large segments for an older receiver it met", older, true,
			&wire.Hello{Min: wire.MinVersion, Max: wire.Version, Features: wire.KnownFeatures}, true},
		{"a wire-3 hello claiming large segments for an older receiver it never met", older, false,
			&wire.Hello{Min: 3, Max: 3, Features: wire.KnownFeatures}, true},
		{"a wire-3 hello claiming large segments for an older receiver it met", older, true,
			&wire.Hello{Min: 3, Max: 3, Features: wire.KnownFeatures}, true},
		{"a hello claiming no features for a receiver of this build it met", buildSpeech(), true,
			&wire.Hello{Min: wire.MinVersion, Max: wire.Version}, false},
		{"a wire-3 hello claiming no features for a receiver of this build it met", buildSpeech(), true,
			&wire.Hello{Min: 3, Max: 3}, false},
		{"an answer claiming no features for a receiver of this build it met", buildSpeech(), true,
			&wire.Hello{Min: wire.MinVersion, Max: wire.Version, Reply: true}, false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			tt := newTrustTrio(t, true, c.receiver, patientConfig())
			if c.metFirst {
				tt.transfer(t, 1, c.refused)
				require.Equal(t, c.receiver.features, believed(tt.src, "decode"), "what the receiver proved")
			}
			// The forgery, then a proof nobody asked for, while nothing from the sender reaches
			// the receiver (which would prove itself again): once the proof is refused, the
			// sender has read the forged hello, and believes what it did before, or nothing.
			believedBefore := believed(tt.src, "decode")
			tt.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				return mem.Fault{Drop: fp.From == "prefill" && fp.To == "decode"}
			})
			require.NoError(t, tt.net.Spoof("decode", "prefill", wire.Encode(c.forged)))
			require.NoError(t, tt.net.Spoof("decode", "prefill", wire.Encode(&wire.HelloProof{Min: wire.MinVersion, Max: wire.Version})))
			eventually(t, func() bool {
				return tt.refusals.count(helloRefusedUnsolicited)+tt.refusals.count(helloRefusedMismatch) == 1
			}, "the forged proof refused")
			got := believed(tt.src, "decode")
			require.Zero(t, got&^c.receiver.features, "the sender believes %v, which the receiver lacks", got&^c.receiver.features)
			if c.metFirst {
				require.Equal(t, believedBefore, got, "the forgery changed nothing")
			}
			tt.countHellos()
			tt.transfer(t, 2, c.refused)
			got = believed(tt.src, "decode")
			require.Zero(t, got&^c.receiver.features, "the sender believes %v, which the receiver lacks", got&^c.receiver.features)
			if c.metFirst {
				require.Equal(t, c.receiver.features, got, "the forgery changed nothing")
			}
		})
	}
}

// TestForgottenPeerGetsConservativeFeatures: when the sender's table forgets a receiver (a third
// engine's hello evicted it, MaxPending 1) or the transport reports it lost, the sender believes
// nothing of it (never its own features), greets it again on its next request and waits for its
// proof: an older receiver still gets no large pieces, and one of this build is served. (A
// receiver reported lost must speak first, its request here: the sender refuses a Send to a
// peer it knows lost, TestL11_ASendToALostPeerFailsAtOnceOnEveryPath.)
func TestForgottenPeerGetsConservativeFeatures(t *testing.T) {
	for _, c := range []struct {
		desc     string
		receiver speech
		forget   func(t *testing.T, tt *trustTrio)
		refused  bool
		lost     bool // a false alarm: the receiver speaks first
	}{
		{"evicted by a third engine, an older receiver", lacking(wire.FeatureLargeSegments), evictByThirdEngine, true, false},
		{"evicted by a third engine, a receiver of this build", buildSpeech(), evictByThirdEngine, false, false},
		{"lost, an older receiver", lacking(wire.FeatureLargeSegments), losePeer, true, true},
		{"lost, a receiver of this build", buildSpeech(), losePeer, false, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := patientConfig()
			cfg.Tuning.MaxPending = 1
			tt := newTrustTrio(t, true, c.receiver, cfg)
			tt.transfer(t, 1, c.refused)
			require.Equal(t, c.receiver.features, believed(tt.src, "decode"))
			c.forget(t, tt)
			require.Zero(t, believed(tt.src, "decode"), "a forgotten peer is unknown: no features")
			hellos := tt.hellos.Load()
			tt.transferOrdered(t, 2, c.refused, c.lost)
			require.Greater(t, tt.hellos.Load(), hellos, "the sender greeted the receiver again")
			require.Equal(t, c.receiver.features, believed(tt.src, "decode"), "what the receiver proved again")
		})
	}
}

// evictByThirdEngine has a third engine meet the sender, whose table (MaxPending 1) then
// forgets the receiver.
func evictByThirdEngine(t *testing.T, tt *trustTrio) {
	third, err := New(tt.net.Transport("third"), patientConfig())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, third.Close()) })
	src, dst := pools(t, 9)
	hs, err := tt.src.Send(bg, Spec{ID: 9, Peer: "third", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	hr, err := third.Receive(bg, Spec{ID: 9, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
	require.NoError(t, err)
	waitClosed(t, hr.Quiesced(), "third receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender to the third quiesced")
	requireState(t, hs, Completed)
}

// losePeer has the sender's transport report the receiver lost (a false alarm: the receiver
// still runs, and meets the sender again).
func losePeer(t *testing.T, tt *trustTrio) {
	tt.net.ReportPeerLost(tt.net.Endpoint("prefill"), "decode", errors.New("keepalive missed"))
	eventually(t, func() bool {
		tt.src.mu.Lock()
		defer tt.src.mu.Unlock()
		_, known := tt.src.peers["decode"]
		return !known
	}, "the sender forgot the receiver")
}

// TestWire3PeerInteroperates: an engine of this build and one of wire version 3 (which sends no
// proof) complete transfers both ways, every byte; the older engine's claims are taken without
// proof but for large segments, which a sender that sends large pieces never gives it.
func TestWire3PeerInteroperates(t *testing.T) {
	for _, c := range []struct {
		desc                  string
		sender, receiver      speech
		large, refused        bool
		believed              feature // what the sender believes of the receiver
		believedByTheReceiver feature
	}{
		{"a wire-3 sender to this build", wire3, buildSpeech(), false, false, wire.KnownFeatures, wire.KnownFeatures &^ wire.FeatureLargeSegments},
		{"this build to a wire-3 receiver", buildSpeech(), wire3, false, false, wire.KnownFeatures &^ wire.FeatureLargeSegments, wire.KnownFeatures},
		{"large pieces to a wire-3 receiver that claims them", buildSpeech(), wire3, true, true, wire.KnownFeatures &^ wire.FeatureLargeSegments, wire.KnownFeatures},
	} {
		t.Run(c.desc, func(t *testing.T) {
			n := mem.NewNetwork()
			var srcTr transport.Transport = n.Transport("prefill")
			if c.large {
				srcTr = largeSegments{srcTr.(*mem.Transport)}
			}
			a, err := newEngine(srcTr, patientConfig(), c.sender)
			require.NoError(t, err)
			b, err := newEngine(n.Transport("decode"), patientConfig(), c.receiver)
			require.NoError(t, err)
			tt := &trustTrio{net: n, src: a, dst: b}
			t.Cleanup(func() {
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
			})
			tt.transfer(t, 1, c.refused)
			tt.transfer(t, 2, c.refused)
			require.Equal(t, c.believed, believed(a, "decode"))
			require.Equal(t, c.believedByTheReceiver, believed(b, "prefill"))
		})
	}
}

// TestHelloProofMustEchoAnOutstandingChallenge: a proof counts only when it echoes the
// challenge this engine has outstanding for the address it came from. A forged proof with no
// challenge outstanding, one echoing other bytes, and a replay of one already answered are
// each refused and counted by reason (trustObserver, kvxfer_hello_refused_total), and what
// the engine believes of the peer does not change.
func TestHelloProofMustEchoAnOutstandingChallenge(t *testing.T) {
	forged := func(echo [wire.ChallengeBytes]byte) []byte {
		return wire.Encode(&wire.HelloProof{Echo: echo, Min: wire.MinVersion, Max: wire.Version, Features: wire.KnownFeatures | 1<<40})
	}
	for _, c := range []struct {
		desc   string
		setup  func(t *testing.T, tt *trustTrio) []byte // returns the forged proof
		reason helloRefusal
		met    bool // the pair met first: the sender believes the receiver's proof
	}{
		{"a proof nobody asked for", func(t *testing.T, tt *trustTrio) []byte {
			return forged([wire.ChallengeBytes]byte{1, 2, 3})
		}, helloRefusedUnsolicited, false},
		{"a proof echoing other bytes than the challenge", func(t *testing.T, tt *trustTrio) []byte {
			echo := outstandingChallenge(t, tt)
			echo[0] ^= 1
			return forged(echo)
		}, helloRefusedMismatch, false},
		{"a proof of a challenge sent before the peer was lost", func(t *testing.T, tt *trustTrio) []byte {
			echo := outstandingChallenge(t, tt)
			losePeer(t, tt)
			return forged(echo)
		}, helloRefusedUnsolicited, false},
		{"a replay of a proof already answered", func(t *testing.T, tt *trustTrio) []byte {
			tt.src.mu.Lock()
			defer tt.src.mu.Unlock()
			ph := tt.src.peers["decode"]
			require.True(t, ph.challenge.answeredBefore)
			return forged(ph.challenge.answered)
		}, helloRefusedReplayed, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			tt := newTrustTrio(t, false, lacking(wire.FeatureStreaming), patientConfig())
			want := feature(0)
			if c.met {
				tt.transfer(t, 1, false)
				want = lacking(wire.FeatureStreaming).features
			}
			proof := c.setup(t, tt)
			require.NoError(t, tt.net.Spoof("decode", "prefill", proof))
			eventually(t, func() bool { return tt.refusals.count(c.reason) == 1 }, "the proof refused and counted")
			require.Equal(t, want, believed(tt.src, "decode"), "what the sender believes of the receiver")
			for r := range helloRefusalCount {
				if r != c.reason {
					require.Zero(t, tt.refusals.count(r), r.String())
				}
			}
		})
	}
}

// outstandingChallenge has the sender challenge the receiver, with a hello forged "from" it,
// and returns the challenge, which never reaches the receiver: it stays outstanding.
func outstandingChallenge(t *testing.T, tt *trustTrio) [wire.ChallengeBytes]byte {
	tt.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		return mem.Fault{Drop: fp.From == "prefill" && fp.To == "decode"}
	})
	require.NoError(t, tt.net.Spoof("decode", "prefill", wire.Encode(buildSpeech().hello(false))))
	var echo [wire.ChallengeBytes]byte
	eventually(t, func() bool {
		tt.src.mu.Lock()
		defer tt.src.mu.Unlock()
		ph := tt.src.peers["decode"]
		if ph == nil || ph.challenge.drawnAt.IsZero() {
			return false
		}
		echo = ph.challenge.value
		return true
	}, "a challenge outstanding for the receiver")
	return echo
}

// TestForgedHellosAreBoundedByMaxPending: hellos forged from many addresses (each answered
// with a challenge nobody proves) never hold more than MaxPending entries, and a transfer with
// a real peer still meets it and completes.
func TestForgedHellosAreBoundedByMaxPending(t *testing.T) {
	cfg := patientConfig()
	cfg.Tuning.MaxPending = 4
	tt := newTrustTrio(t, false, buildSpeech(), cfg)
	for i := range 100 {
		require.NoError(t, tt.net.Spoof(Peer(fmt.Sprintf("forged-%d", i)), "prefill", wire.Encode(buildSpeech().hello(false))))
	}
	require.NoError(t, tt.net.Spoof("decode", "prefill", wire.Encode(&wire.HelloProof{Min: wire.MinVersion, Max: wire.Version})))
	eventually(t, func() bool { return tt.refusals.count(helloRefusedUnsolicited) == 1 }, "every forged hello read")
	tt.src.mu.Lock()
	n := len(tt.src.peers)
	tt.src.mu.Unlock()
	require.LessOrEqual(t, n, cfg.Tuning.MaxPending)
	tt.transfer(t, 1, false)
}

// closeRecorder is a transport that records the peers the engine closed its connection to.
type closeRecorder struct {
	*mem.Transport
	mu     sync.Mutex
	closed []Peer
}

func (c *closeRecorder) ClosePeer(p Peer) {
	c.mu.Lock()
	c.closed = append(c.closed, p)
	c.mu.Unlock()
	c.Transport.ClosePeer(p)
}

func (c *closeRecorder) closedPeers() []Peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.closed)
}

// Hellos forged from more addresses than MaxPending: the engine connects to each to answer it,
// but keeps at most MaxPending such unproven addresses, closing the oldest connection at once
// past that (long before PendingTTL); the receiver, which proves its hello, is never closed, and
// transfers with it go on.
func TestForgedHelloAddressesAreBoundedByMaxPending(t *testing.T) {
	cfg := patientConfig() // PendingTTL an hour: every close here is the bound's
	cfg.Tuning.MaxPending = 4
	n := mem.NewNetwork()
	tr := &closeRecorder{Transport: n.Transport("prefill")}
	src, err := New(tr, cfg)
	require.NoError(t, err)
	dst, err := New(n.Transport("decode"), patientConfig())
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, src.Close())
		require.NoError(t, dst.Close())
	})
	const forged = 10
	for i := range forged {
		require.NoError(t, n.Spoof(Peer(fmt.Sprintf("forged-%d", i)), "prefill", wire.Encode(buildSpeech().hello(false))))
	}
	eventually(t, func() bool { return len(tr.closedPeers()) == forged-cfg.Tuning.MaxPending }, "the oldest unproven addresses closed")
	for _, p := range tr.closedPeers() {
		require.True(t, strings.HasPrefix(string(p), "forged-"), "closed %s", p)
	}
	src.mu.Lock()
	remembered := len(src.unproven.since)
	src.mu.Unlock()
	require.Equal(t, cfg.Tuning.MaxPending, remembered)

	s, d := pools(t, 1)
	hs, err := src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: s.plan, Pool: s.mem})
	require.NoError(t, err)
	hr, err := dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: d.plan, Pool: d.mem})
	require.NoError(t, err)
	waitQuiesced(t, hr, 10*time.Second)
	waitQuiesced(t, hs, 10*time.Second)
	requireState(t, hs, Completed)
	requireState(t, hr, Completed)
	require.Equal(t, s.stream(t), d.stream(t), "every byte")
	require.NotContains(t, tr.closedPeers(), Peer("decode"), "the proven receiver is never closed")
}
