// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// answerHello answers a hello, and proves it when challenged, as an engine of this build would,
// for the test's fake peers; it reports whether m was one of those messages.
func answerHello(tr transport.Transport, from Peer, m wire.Message) bool {
	sp := buildSpeech()
	switch m := m.(type) {
	case *wire.Hello:
		if !m.Reply {
			_ = tr.SendControl(from, wire.Encode(sp.hello(true)))
		}
		return true
	case *wire.HelloChallenge:
		_ = tr.SendControl(from, wire.Encode(&wire.HelloProof{Echo: m.Challenge, Min: sp.min, Max: sp.max, Features: sp.features}))
		return true
	case *wire.HelloProof:
		return true
	}
	return false
}

// Speeches of the engines the mixed-version tests pair with one of this build.
var (
	// lacking speaks this build's version without the given features: an older build.
	lacking = func(f feature) speech { s := buildSpeech(); s.features &^= f; return s }
	// newer speaks this version and the next, with a feature this build does not know.
	newer = speech{min: wire.MinVersion, max: wire.Version + 1, features: wire.KnownFeatures | 1<<40}
	// tooNew speaks only versions after this build's.
	tooNew = speech{min: wire.Version + 1, max: wire.Version + 2, features: wire.KnownFeatures}
)

// newSpeakingPair is newPair with engines that say srcSp and dstSp in their hellos.
func newSpeakingPair(t testing.TB, srcSp, dstSp speech, src, dst Config) *pair {
	t.Helper()
	n := mem.NewNetwork()
	a, err := newEngine(n.Transport("prefill"), src, srcSp)
	require.NoError(t, err)
	b, err := newEngine(n.Transport("decode"), dst, dstSp)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
		requireSlotsAccounted(t, a)
		requireSlotsAccounted(t, b)
	})
	return &pair{net: n, src: a, dst: b}
}

// patientConfig is directConfig with deadlines an hour away: a request that fails within the
// test's wait did not wait one out.
func patientConfig() Config {
	cfg := rmaConfig()
	cfg.TransferTimeout, cfg.QueueTimeout, cfg.Tuning.PendingTTL = time.Hour, time.Hour, time.Hour
	return cfg
}

// Mixed versions: an engine of this build (the receiver, "decode") and one that speaks less
// (an older build), more (a newer one) or nothing in common. A request that needs what the
// peer lacks fails at once with an ErrPeerLacksFeature naming the feature and the peer's version:
// the synchronisation point is that no request-info ever left the receiver, while every
// deadline is an hour away. A request that needs nothing the peer lacks completes on the best
// path both speak, every byte checked.
func TestMixedVersions(t *testing.T) {
	cases := []struct {
		desc     string
		sender   speech
		spec     func(*Spec) // the receive's spec, changed
		wantErr  *featureError
		wantPath Path
	}{
		{"an older peer without streaming: a streaming receive fails at once", lacking(wire.FeatureStreaming),
			func(s *Spec) { s.Stream = true }, &featureError{Peer: "prefill", Feature: wire.FeatureStreaming, PeerVersion: wire.Version, PeerMinVersion: wire.MinVersion}, 0},
		{"an older peer without partial requests: a partial receive fails at once", lacking(wire.FeaturePartial),
			func(s *Spec) { s.Held = []int{1} }, &featureError{Peer: "prefill", Feature: wire.FeaturePartial, PeerVersion: wire.Version, PeerMinVersion: wire.MinVersion}, 0},
		{"a peer with no version in common fails at once", tooNew,
			nil, &featureError{Peer: "prefill", PeerVersion: wire.Version + 2, PeerMinVersion: wire.Version + 1}, 0},
		{"an older peer without streaming: a plain receive completes", lacking(wire.FeatureStreaming), nil, nil, PathRMA},
		{"an older peer without rma: the direct path's messages", lacking(wire.FeatureRMA), nil, nil, PathDirect},
		{"an older peer without direct or rma: staging", lacking(wire.FeatureDirect | wire.FeatureRMA), nil, nil, PathStaging},
		{"an older peer with none of the features: staging", lacking(wire.KnownFeatures), nil, nil, PathStaging},
		{"a newer peer: the version both speak, every feature", newer, func(s *Spec) { s.Stream = true }, nil, PathRMA},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			p := newSpeakingPair(t, c.sender, buildSpeech(), patientConfig(), patientConfig())
			src := newKVPool(t, testDims, layout.BlockMajor, nil, blocks(1, 2, 3, 4), 3)
			dst := newKVPool(t, testDims, layout.BlockMajor, nil, blocks(5, 6, 7, 8), 0) // whole blocks: rma where both speak it
			p.net.Endpoint("prefill").AllowDirect(src.mem)
			p.net.Endpoint("decode").AllowDirect(dst.mem)
			var infos atomic.Int32
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind == wire.KindRequestInfo {
					infos.Add(1)
				}
				return mem.Fault{}
			})
			spec := Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem}
			if c.spec != nil {
				c.spec(&spec)
			}
			hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, spec)
			require.NoError(t, err)
			if c.wantErr != nil {
				waitClosed(t, hr.Quiesced(), "receiver quiesced")
				requireState(t, hr, Failed, ErrPeerLacksFeature)
				var fe *featureError
				require.True(t, errors.As(hr.Status().Err, &fe))
				require.Equal(t, c.wantErr, fe)
				require.Zero(t, infos.Load(), "the request never left the receiver")
				require.Equal(t, CancelledBeforeAdvertise, p.src.Cancel(1), "the sender still waits for a request")
				return
			}
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, c.wantPath, hr.Path())
			require.Equal(t, src.stream(t), dst.stream(t), "every byte")
		})
	}
}

// A sender of this build offers an RMA pool in parts only to a receiver that speaks them: an
// older receiver gets a decline, and the request moves on the direct path's messages.
func TestMixedVersionsOfferInPartsOnlyToAPeerThatSpeaksThem(t *testing.T) {
	tiny := layout.Dims{NumLayers: 1, KVFactor: 1, NumHeads: 1, HeadDim: 4, ElemSize: 2, TokensPerBlock: 1, NumBlocks: 2048}
	for _, c := range []struct {
		desc     string
		receiver speech
		want     Path
	}{
		{"a receiver that speaks parts reads the pool", buildSpeech(), PathRMA},
		{"an older receiver gets the direct path's messages", lacking(wire.FeatureMultiPart), PathDirect},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := patientConfig()
			cfg.Tuning.RMAMinRegionBytes = 1
			p := newSpeakingPair(t, buildSpeech(), c.receiver, cfg, cfg)
			src := newKVPool(t, tiny, layout.BlockMajor, nil, seqBlocks(0, 2*rmaMaxOfferBlocks), 5)
			dst := newKVPool(t, tiny, layout.BlockMajor, nil, seqBlocks(1, 2*rmaMaxOfferBlocks), 0)
			p.net.Endpoint("prefill").AllowDirect(src.mem)
			p.net.Endpoint("decode").AllowDirect(dst.mem)
			hs, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, c.want, hr.Path())
			require.Equal(t, src.stream(t), dst.stream(t), "every byte")
		})
	}
}

// An older engine refuses a request for a feature it does not speak (one sent without
// reading its hello) with an abort the receiver sees at once, not by dropping it.
func TestMixedVersionsOlderSenderRefusesWhatItLacks(t *testing.T) {
	p := newSpeakingPair(t, lacking(wire.FeatureStreaming), buildSpeech(), patientConfig(), patientConfig())
	src, dst := pools(t, 4)
	// The receiver believes the sender speaks what this build does (as if it had proven it):
	// it asks for streaming.
	p.dst.mu.Lock()
	p.dst.peerLocked("prefill", true).learnLocked(*buildSpeech().hello(true), true)
	p.dst.mu.Unlock()
	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: true})
	require.NoError(t, err)
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hs, Failed, ErrIncompatible)
	requireState(t, hr, Failed, ErrPeerAborted)
	require.Contains(t, hr.Status().Err.Error(), "does not speak streaming")
}

// A hello that does not decode is a *DecodeError (ErrMalformed) and changes nothing: the
// engine counts it, keeps what it knew of the peer, and transfers in flight and after it
// complete, every byte checked.
func TestGarbageHelloLosesNothing(t *testing.T) {
	good := wire.Encode(buildSpeech().hello(false))
	bad := map[string][]byte{
		"oversized":             append(append([]byte(nil), good...), 0),
		"truncated":             good[:wire.HelloBytes-1],
		"version 2":             func() []byte { b := append([]byte(nil), good...); b[2] = 2; b[wire.HeaderBytes+1] = 2; return b }(),
		"header and max differ": func() []byte { b := append([]byte(nil), good...); b[2] = wire.Version + 1; return b }(),
		"min above max":         func() []byte { b := append([]byte(nil), good...); b[wire.HeaderBytes] = wire.Version + 1; return b }(),
		"min zero":              func() []byte { b := append([]byte(nil), good...); b[wire.HeaderBytes] = 0; return b }(),
		"unknown flags":         func() []byte { b := append([]byte(nil), good...); b[wire.HeaderBytes+2] = 0x80; return b }(),
		"reserved set":          func() []byte { b := append([]byte(nil), good...); b[wire.HeaderBytes+4] = 1; return b }(),
		"names a request":       func() []byte { b := append([]byte(nil), good...); b[8] = 1; return b }(),
		"names a nonce":         func() []byte { b := append([]byte(nil), good...); b[16] = 1; return b }(),
	}
	for desc, b := range bad {
		_, err := wire.Decode(b)
		var de *wire.DecodeError
		require.True(t, errors.As(err, &de), "%s: %v", desc, err)
		require.ErrorIs(t, err, wire.ErrMalformed, desc)
	}

	p := newPair(t, fastConfig(), fastConfig())
	src, dst := pools(t, 6)
	hs, hr := p.start(t, 1, src, dst) // the engines meet
	waitClosed(t, hr.Quiesced(), "first receive quiesced")
	waitClosed(t, hs.Quiesced(), "first send quiesced")
	requireState(t, hr, Completed)
	requireState(t, hs, Completed)

	// A second transfer, with its chunks held on the wire while the garbage arrives.
	p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
	src2, dst2 := pools(t, 7)
	hs, hr = p.start(t, 2, src2, dst2)
	eventually(t, func() bool { return p.net.OnWire() >= 1 }, "a chunk on the wire")
	for _, b := range bad {
		require.NoError(t, p.net.Endpoint("prefill").SendControl("decode", b))
		require.NoError(t, p.net.Endpoint("decode").SendControl("prefill", b))
	}
	eventually(t, func() bool {
		return p.dst.Health().Numbers.MalformedControl == int64(len(bad)) && p.src.Health().Numbers.MalformedControl == int64(len(bad))
	}, "every bad hello counted")
	p.net.SetFault(nil)
	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "second receive quiesced")
	waitClosed(t, hs.Quiesced(), "second send quiesced")
	requireState(t, hr, Completed)
	requireState(t, hs, Completed)
	require.Equal(t, src2.stream(t), dst2.stream(t))
	p.dst.mu.Lock()
	known := p.dst.peers["prefill"].hello
	p.dst.mu.Unlock()
	require.Equal(t, buildSpeech().hello(true).Features, known.Features, "what the receiver knew of its peer is intact")
}

func TestHelloRoundTrips(t *testing.T) {
	for _, m := range []*wire.Hello{buildSpeech().hello(false), buildSpeech().hello(true), newer.hello(false),
		{Min: 1, Max: 200, Features: ^feature(0)}} {
		b := wire.Encode(m)
		require.Len(t, b, wire.HelloBytes)
		got, err := wire.Decode(b)
		require.NoError(t, err)
		want := *m
		want.Kind = wire.KindHello
		require.Equal(t, &want, got)
	}
	_, err := (&wire.Hello{Min: 2, Max: 2}).AppendBinary(nil)
	require.Error(t, err, "no hello before version 3")
	require.Equal(t, "streaming+rma+feature40", (wire.FeatureStreaming | wire.FeatureRMA | 1<<40).String())
}

// Messages other than a hello travel at the version the pair speaks: one of a version this
// build does not speak (an older build's without a hello, or a newer one's) is malformed.
func TestWireVersionsOutsideOursAreRefused(t *testing.T) {
	for _, v := range []byte{1, 2, wire.Version + 1} {
		b := wire.Encode(&wire.Done{Header: wire.Header{Request: 1, Nonce: 2}, Bytes: 3})
		b[2] = v
		_, err := wire.Decode(b)
		var de *wire.DecodeError
		require.True(t, errors.As(err, &de), "version %d: %v", v, err)
		require.Equal(t, 2, de.Offset)
	}
	lo, hi := wireVersions()
	require.Equal(t, [2]int{wire.MinVersion, wire.Version}, [2]int{lo, hi})
	require.Equal(t, wire.KnownFeatures, knownFeatures())
}
