// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// newUCXEngineSpeaking is newUCXEngine for an engine that says sp in its hellos.
func newUCXEngineSpeaking(t testing.TB, tls, dev string, cfg Config, sp speech) *ucxEngine {
	t.Helper()
	cfg = cfg.withDefaults()
	cfg.Tuning.NumSlots = cfg.MaxConcurrent * cfg.Tuning.PipelineDepth
	tr, err := ucx.New(ucx.Config{TLS: tls, NetDevices: dev, KeepaliveInterval: 200 * time.Millisecond,
		StagingBytes: int64(cfg.Tuning.NumSlots) * cfg.SlotBytes, CloseTimeout: 2 * time.Second,
		ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 3 * time.Second, ServeEmulatedRMA: cfg.Tuning.RMAWhereEmulated})
	require.NoError(t, err)
	cfg.StagingMemory = tr.StagingMemory()
	e, err := newEngine(ucxContract(tr), cfg, sp)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return &ucxEngine{tr: tr, e: e}
}

// Mixed versions over UCX loopback: an older sender (no streaming, no partial requests) and a
// receiver of this build. A streaming receive fails at once with an ErrPeerLacksFeature (deadlines
// an hour away, the sender still waiting for a request); a plain one completes, every byte
// checked.
func TestUCXTransport_MixedVersions(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cfg := ucxTestConfig()
	cfg.TransferTimeout, cfg.QueueTimeout = time.Hour, time.Hour
	old := newUCXEngineSpeaking(t, "posix,cma,self", "", cfg, lacking(wire.FeatureStreaming|wire.FeaturePartial))
	cur := newUCXEngine(t, "posix,cma,self", "", cfg)

	s := newUCXKV(t, dims, layout.BlockMajor, []int32{3, 9, 27}, 11)
	r := newUCXKV(t, dims, layout.LayerMajor, []int32{1, 2, 40}, 0)
	hs, err := old.e.Send(bg, Spec{ID: 1, Peer: cur.tr.Self(), Plan: s.plan, Pool: s.mem})
	require.NoError(t, err)
	hr, err := cur.e.Receive(bg, Spec{ID: 1, Peer: old.tr.Self(), Plan: r.plan, Pool: r.mem, Stream: true})
	require.NoError(t, err)
	waitQuiesced(t, hr, 30*time.Second)
	requireState(t, hr, Failed, ErrPeerLacksFeature)
	var fe *featureError
	require.True(t, errors.As(hr.Status().Err, &fe))
	require.Equal(t, &featureError{Peer: old.tr.Self(), Feature: wire.FeatureStreaming, PeerVersion: wire.Version, PeerMinVersion: wire.MinVersion}, fe)
	require.Equal(t, Queued, hs.Status().State, "the sender never got a request")
	require.NoError(t, hr.Release()) // the id is free again

	hr, err = cur.e.Receive(bg, Spec{ID: 1, Peer: old.tr.Self(), Plan: r.plan, Pool: r.mem})
	require.NoError(t, err)
	waitQuiesced(t, hr, 30*time.Second)
	waitQuiesced(t, hs, 30*time.Second)
	requireState(t, hr, Completed)
	requireState(t, hs, Completed)
	require.Equal(t, s.stream(t), r.stream(t), "every byte")
}

// Over UCX's TCP transport, whose segments are 1 MiB by default (ucx.Config.TCPSegmentBytes), a
// sender sends nothing to a receiver that does not say it takes them (an older build, whose
// receive buffer would be UCX's 64 KiB): it fails with an ErrPeerLacksFeature naming
// wire.FeatureLargeSegments, the receiver hears why, and its pool is untouched. Over shared memory
// there are no TCP segments and the same pair completes.
func TestUCXTransport_LargeTCPSegmentsOnlyToAReceiverThatTakesThem(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cfg := ucxTestConfig()
	cfg.TransferTimeout, cfg.QueueTimeout = time.Hour, time.Hour
	for _, c := range []struct {
		tls, dev string
		refused  bool
	}{{"tcp,self", "lo", true}, {"posix,cma,self", "", false}} {
		t.Run(c.tls, func(t *testing.T) {
			cur := newUCXEngine(t, c.tls, c.dev, cfg)
			if c.refused && !ucxOf(cur.tr).SendsLargeSegments() {
				t.Skip("this process's UCX_TCP_TX_SEG_SIZE is at most 64 KiB (set in its environment)")
			}
			require.Equal(t, c.refused, ucxOf(cur.tr).SendsLargeSegments())
			oc := cfg.withDefaults()
			oc.Tuning.NumSlots = oc.MaxConcurrent * oc.Tuning.PipelineDepth
			otr, err := ucx.New(ucx.Config{TLS: c.tls, NetDevices: c.dev, KeepaliveInterval: 200 * time.Millisecond,
				StagingBytes: int64(oc.Tuning.NumSlots) * oc.SlotBytes, CloseTimeout: 2 * time.Second, ServeEmulatedRMA: oc.Tuning.RMAWhereEmulated})
			require.NoError(t, err)
			oc.StagingMemory = otr.StagingMemory()
			old, err := newEngine(ucxContract(otr), oc, lacking(wire.FeatureLargeSegments))
			require.NoError(t, err)
			t.Cleanup(func() { _ = old.Close() })

			s := newUCXKV(t, dims, layout.BlockMajor, []int32{3, 9, 27}, 11)
			r := newUCXKV(t, dims, layout.BlockMajor, []int32{1, 2, 40}, 0)
			before := r.stream(t)
			hs, err := cur.e.Send(bg, Spec{ID: 1, Peer: otr.Self(), Plan: s.plan, Pool: s.mem})
			require.NoError(t, err)
			hr, err := old.Receive(bg, Spec{ID: 1, Peer: cur.tr.Self(), Plan: r.plan, Pool: r.mem})
			require.NoError(t, err)
			waitQuiesced(t, hr, 30*time.Second)
			waitQuiesced(t, hs, 30*time.Second)
			if !c.refused {
				requireState(t, hs, Completed)
				requireState(t, hr, Completed)
				require.Equal(t, s.stream(t), r.stream(t), "every byte")
				return
			}
			requireState(t, hs, Failed, ErrPeerLacksFeature)
			var fe *featureError
			require.True(t, errors.As(hs.Status().Err, &fe))
			require.Equal(t, wire.FeatureLargeSegments, fe.Feature)
			requireState(t, hr, Failed, ErrPeerAborted)
			require.Equal(t, before, r.stream(t), "no byte reached the older receiver")
		})
	}
}

// TestUCXTransport_ForgedHelloChangesNothing: a third engine puts on the wire control frames that
// name the receiver's worker address as their sender: hellos claiming large segments for an
// older receiver (wire 4 and wire 3), then a proof nobody asked for. The sender refuses the
// proof (counted), believes of the receiver only what the receiver proved, and over TCP, whose
// segments are 1 MiB, sends the older receiver nothing; over shared memory the transfer
// completes. Forged hellos claiming no features after the two met change nothing either.
func TestUCXTransport_ForgedHelloChangesNothing(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cfg := ucxTestConfig()
	cfg.TransferTimeout = time.Hour
	older := lacking(wire.FeatureLargeSegments)
	for _, c := range []struct {
		tls, dev string
		refused  bool
	}{{"tcp,self", "lo", true}, {"posix,cma,self", "", false}} {
		t.Run(c.tls, func(t *testing.T) {
			refusals := &refusalCounter{}
			scfg := cfg
			scfg.Observer = refusals
			src := newUCXEngine(t, c.tls, c.dev, scfg)
			if c.refused && !ucxOf(src.tr).SendsLargeSegments() {
				t.Skip("this process's UCX_TCP_TX_SEG_SIZE is at most 64 KiB (set in its environment)")
			}
			dst := newUCXEngineSpeaking(t, c.tls, c.dev, cfg, older)
			forger := newUCXEngine(t, c.tls, c.dev, cfg)
			refused := func() int { return refusals.count(helloRefusedUnsolicited) + refusals.count(helloRefusedMismatch) }
			// forge sends the messages "from" the receiver, then a proof nobody asked for, and
			// returns once the sender refused that proof: it has read every frame before it.
			forge := func(ms ...wire.Message) {
				before := refused()
				ms = append(ms, &wire.HelloProof{Min: wire.MinVersion, Max: wire.Version, Features: wire.KnownFeatures})
				for _, m := range ms {
					require.NoError(t, ucxhooks.Hooks.SendControlAs(forger.tr, src.tr.Self(), dst.tr.Self(), wire.Encode(m)))
				}
				eventually(t, func() bool { return refused() > before }, "the forged proof refused")
			}
			transfer := func(id RequestID) {
				s := newUCXKV(t, dims, layout.BlockMajor, []int32{3, 9, 27}, uint64(id))
				r := newUCXKV(t, dims, layout.BlockMajor, []int32{1, 2, 40}, 0)
				before := r.stream(t)
				hs, err := src.e.Send(bg, Spec{ID: id, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem})
				require.NoError(t, err)
				hr, err := dst.e.Receive(bg, Spec{ID: id, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem})
				require.NoError(t, err)
				waitQuiesced(t, hr, 30*time.Second)
				waitQuiesced(t, hs, 30*time.Second)
				if !c.refused {
					requireState(t, hs, Completed)
					requireState(t, hr, Completed)
					require.Equal(t, s.stream(t), r.stream(t), "every byte")
					return
				}
				requireState(t, hs, Failed, ErrPeerLacksFeature)
				var fe *featureError
				require.True(t, errors.As(hs.Status().Err, &fe))
				require.Equal(t, wire.FeatureLargeSegments, fe.Feature)
				requireState(t, hr, Failed, ErrPeerAborted)
				require.Equal(t, before, r.stream(t), "no byte reached the older receiver")
			}

			forge(&wire.Hello{Min: wire.MinVersion, Max: wire.Version, Features: wire.KnownFeatures},
				&wire.Hello{Min: 3, Max: 3, Features: wire.KnownFeatures})
			transfer(1)
			eventually(t, func() bool { return believed(src.e, dst.tr.Self()) == older.features }, "the sender believes what the receiver proved")

			forge(&wire.Hello{Min: wire.MinVersion, Max: wire.Version}, &wire.Hello{Min: 3, Max: 3})
			require.Equal(t, older.features, believed(src.e, dst.tr.Self()), "forged hellos changed nothing")
			transfer(2)
			require.Equal(t, older.features, believed(src.e, dst.tr.Self()))
		})
	}
}

// TestUCXTransport_ClusterKeys: over UCX (shared memory and TCP), two engines holding the same
// cluster key meet and transfer, every byte, their sealed handshake intact on the wire; a
// hello a third engine writes "from" the receiver without the key is refused before it is
// answered, counted as unsealed, and changes nothing.
func TestUCXTransport_ClusterKeys(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, c := range []struct{ tls, dev string }{{"tcp,self", "lo"}, {"posix,cma,self", ""}} {
		t.Run(c.tls, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.ClusterKeys = [][]byte{clusterKey(9)}
			refusals := &refusalCounter{}
			scfg := cfg
			scfg.Observer = refusals
			src := newUCXEngine(t, c.tls, c.dev, scfg)
			dst := newUCXEngine(t, c.tls, c.dev, cfg)
			forger := newUCXEngine(t, c.tls, c.dev, ucxTestConfig())
			s := newUCXKV(t, dims, layout.BlockMajor, []int32{3, 9, 27}, 5)
			r := newUCXKV(t, dims, layout.BlockMajor, []int32{1, 2, 40}, 0)
			hs, err := src.e.Send(bg, Spec{ID: 1, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem})
			require.NoError(t, err)
			hr, err := dst.e.Receive(bg, Spec{ID: 1, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem})
			require.NoError(t, err)
			waitQuiesced(t, hr, 30*time.Second)
			waitQuiesced(t, hs, 30*time.Second)
			requireState(t, hs, Completed)
			requireState(t, hr, Completed)
			require.Equal(t, s.stream(t), r.stream(t), "every byte")
			require.Zero(t, refusals.auth())
			proved := believed(src.e, dst.tr.Self())
			require.Equal(t, wire.KnownFeatures, proved)

			forged := wire.Encode(&wire.Hello{Min: 3, Max: 3})
			require.NoError(t, ucxhooks.Hooks.SendControlAs(forger.tr, src.tr.Self(), dst.tr.Self(), forged))
			eventually(t, func() bool { return refusals.auth("hello", "unsealed") == 1 }, "the unsealed hello refused")
			require.Equal(t, proved, believed(src.e, dst.tr.Self()), "the forgery changed nothing")
		})
	}
}

// TestL10_UCXForgedClaimLeavesTheSendToTheRealReceiver: over UCX (TCP and shared memory), a
// Send with a per-request secret and cluster keys refuses a request a third engine writes
// "from" its receiver with a made-up proof, and then its receiver's own request with the
// wrong secret (that Receive fails with ErrUnauthenticated), each counted; the Send frees and
// poisons nothing for them and completes with the receiver that holds the secret, every byte.
func TestL10_UCXForgedClaimLeavesTheSendToTheRealReceiver(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, c := range []struct{ tls, dev string }{{"tcp,self", "lo"}, {"posix,cma,self", ""}} {
		t.Run(c.tls, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.ClusterKeys = [][]byte{clusterKey(9)}
			refusals := &refusalCounter{}
			scfg := cfg
			scfg.Observer = refusals
			src := newUCXEngine(t, c.tls, c.dev, scfg)
			// The receiver resends a request its sender has not answered after RetryInterval
			// (50ms), and the sender counts each refused copy: under a loaded host the refusal
			// took longer, and three claims were counted (posix,cma,self). A resend is needed
			// only for a lost message, and one still fits in the waits below.
			dcfg := cfg
			dcfg.Tuning.RetryInterval = 10 * time.Second
			dst := newUCXEngine(t, c.tls, c.dev, dcfg)
			forger := newUCXEngine(t, c.tls, c.dev, ucxTestConfig())
			s := newUCXKV(t, dims, layout.BlockMajor, []int32{3, 9, 27}, 5)
			r := newUCXKV(t, dims, layout.BlockMajor, []int32{1, 2, 40}, 0)
			secret := NewClaimSecret()
			hs, err := src.e.Send(bg, Spec{ID: 1, Peer: dst.tr.Self(), Plan: s.plan, Pool: s.mem, Secret: secret})
			require.NoError(t, err)

			forged := wire.Encode(&wire.RequestInfo{Header: wire.Header{Request: 1, Nonce: 77}, Shape: kvplan.ShapeOf(r.plan),
				ChunkBytes: 4096, Depth: 2, Flags: wire.FlagClaim, Claim: wire.Claim{Incarnation: 1, Proof: [wire.ClaimProofBytes]byte{1}}})
			require.NoError(t, ucxhooks.Hooks.SendControlAs(forger.tr, src.tr.Self(), dst.tr.Self(), forged))
			eventually(t, func() bool { return refusals.auth("claim", "bad-mac") == 1 }, "the forged claim refused")

			h1, err := dst.e.Receive(bg, Spec{ID: 1, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem, Secret: NewClaimSecret()})
			require.NoError(t, err)
			waitQuiesced(t, h1, 30*time.Second)
			requireState(t, h1, Failed, ErrUnauthenticated)
			require.Equal(t, 2, refusals.auth("claim", "bad-mac"))
			require.NoError(t, h1.Release())
			select {
			case <-hs.Done():
				t.Fatalf("a refused claim ended the Send: %+v", hs.Status())
			default:
			}

			h2 := startOnceFree(t, func() (*Handle, error) {
				return dst.e.Receive(bg, Spec{ID: 1, Peer: src.tr.Self(), Plan: r.plan, Pool: r.mem, Secret: secret})
			})
			waitQuiesced(t, h2, 30*time.Second)
			waitQuiesced(t, hs, 30*time.Second)
			requireState(t, h2, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, s.stream(t), r.stream(t), "every byte")
			require.Equal(t, 2, refusals.auth(), "the two claims, nothing else")
		})
	}
}

// TestUCXTransport_UnprovenHelloAddressIsDropped: a third process puts on the wire a hello
// (wire 4 or wire 3) or a hello challenge that names another worker's address for its sender,
// a worker that never proves itself (here one of wire 3, which drops challenges). The engine
// answers, so its transport connects to that address; once PendingTTL passes with no proof,
// no transfer with the address and no request of it, the engine closes that connection and
// forgets the address, without counting it as a lost peer. A peer that proved its hello
// keeps its connection.
func TestUCXTransport_UnprovenHelloAddressIsDropped(t *testing.T) {
	wire3 := speech{min: 3, max: 3, features: wire.KnownFeatures}
	for _, tr := range []struct{ tls, dev string }{{"tcp,self", "lo"}, {"posix,cma,self", ""}} {
		for _, c := range []struct {
			desc string
			msg  wire.Message
		}{
			{"hello wire 4", &wire.Hello{Min: wire.MinVersion, Max: wire.Version, Features: wire.KnownFeatures}},
			{"hello wire 3", &wire.Hello{Min: 3, Max: 3, Features: wire.KnownFeatures}},
			{"challenge", &wire.HelloChallenge{}},
		} {
			t.Run(tr.tls+"/"+c.desc, func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.Tuning.PendingTTL = 300 * time.Millisecond
				lost := &lostCounter{}
				cfg.Observer = lost
				src := newUCXEngine(t, tr.tls, tr.dev, cfg)
				real := newUCXEngine(t, tr.tls, tr.dev, ucxTestConfig())
				victim := newUCXEngineSpeaking(t, tr.tls, tr.dev, ucxTestConfig(), wire3)
				forger := newUCXEngine(t, tr.tls, tr.dev, ucxTestConfig())
				endpoints := func(p Peer) int { return ucxhooks.Hooks.Endpoints(src.tr, p) }

				real.e.greet(src.tr.Self()) // an unsolicited hello too, from a worker that proves it
				eventually(t, func() bool {
					src.e.mu.Lock()
					defer src.e.mu.Unlock()
					ph := src.e.peers[real.tr.Self()]
					return ph != nil && ph.proven
				}, "the real peer proved its hello")

				require.NoError(t, ucxhooks.Hooks.SendControlAs(forger.tr, src.tr.Self(), victim.tr.Self(), wire.Encode(c.msg)))
				eventually(t, func() bool { return endpoints(victim.tr.Self()) > 0 }, "the engine answered the address the message named")
				eventually(t, func() bool { return endpoints(victim.tr.Self()) == 0 }, "the connection to the unproven address dropped")
				src.e.mu.Lock()
				_, known := src.e.peers[victim.tr.Self()]
				src.e.mu.Unlock()
				require.False(t, known, "the unproven address is forgotten")
				require.Positive(t, endpoints(real.tr.Self()), "the proven peer keeps its connection")
				require.NoError(t, src.e.PeerLost(victim.tr.Self()), "closing it is not a lost peer")
				require.Zero(t, lost.count(), "nor told as one")
			})
		}
	}
}

// lostCounter counts the peers the engine told lost.
type lostCounter struct {
	nopObserver
	n atomic.Int64
}

func (l *lostCounter) OnPeerLost(Peer, error) { l.n.Add(1) }
func (l *lostCounter) count() int             { return int(l.n.Load()) }
