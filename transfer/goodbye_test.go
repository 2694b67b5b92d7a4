// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// goodbyeSetup is a pair whose data hangs on the wire, so a transfer stays in flight with its
// operations busy until something ends it, on one path of the in-memory transport.
type goodbyeSetup struct {
	name string
	path Path
	make func(t *testing.T) (*pair, *kvPool, *kvPool)
}

var goodbyeSetups = []goodbyeSetup{
	{"staging", PathStaging, func(t *testing.T) (*pair, *kvPool, *kvPool) {
		p := newPair(t, fastConfig(), fastConfig())
		p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
		src, dst := pools(t, 3)
		return p, src, dst
	}},
	{"direct IOV messages", PathDirect, func(t *testing.T) (*pair, *kvPool, *kvPool) {
		src, dst := pools(t, 3)
		cfg := directConfig()
		cfg.DisableRMA = true
		p, w := directPair(t, cfg, cfg, src, dst)
		w.fault = mem.Fault{Hang: true}
		return p, src, dst
	}},
	{"RMA gets", PathRMA, func(t *testing.T) (*pair, *kvPool, *kvPool) {
		src, dst := rmaPools(t, 3)
		p, w := directPair(t, rmaConfig(), rmaConfig(), src, dst)
		w.fault = mem.Fault{Hang: true}
		return p, src, dst
	}},
}

// TestL9_GoodbyeEndsOnlyTheTransfersItNames: a departing peer's goodbye that names a transfer
// (its nonce, sub-transfer, and the departing side's role) ends it here as an acknowledged
// abort would: Done, then Quiesced once this side's operations, still busy on the wire, have
// their verdict from the connection the goodbye closed; nothing poisoned. A goodbye that names
// it wrongly, names a request this engine never had with that peer, or comes from another
// address ends nothing and closes nothing: someone else's message claiming the peer's address
// cannot know the nonce. Every path, this engine sending and receiving.
func TestL9_GoodbyeEndsOnlyTheTransfersItNames(t *testing.T) {
	cases := []struct {
		desc  string
		from  func(peer Peer) Peer
		entry func(e *wire.Ended)
		ends  bool
	}{
		{"the peer names it", nil, nil, true},
		{"another nonce", nil, func(e *wire.Ended) { e.Nonce++ }, false},
		{"another sub-transfer", nil, func(e *wire.Ended) { e.Sub++ }, false},
		{"the wrong role", nil, func(e *wire.Ended) { e.Role = 3 - e.Role }, false},
		{"a request this engine never had with the peer", nil, func(e *wire.Ended) { e.Request += 100 }, false},
		{"from another address", func(Peer) Peer { return "elsewhere" }, nil, false},
	}
	for _, s := range goodbyeSetups {
		for _, survivorSends := range []bool{true, false} {
			role := "survivor receives"
			if survivorSends {
				role = "survivor sends"
			}
			for _, c := range cases {
				t.Run(s.name+"/"+role+"/"+c.desc, func(t *testing.T) {
					p, src, dst := s.make(t)
					hs, hr := p.start(t, 1, src, dst)
					survivor, h, peer, departing := p.dst, hr, Peer("prefill"), wire.RoleSender
					if survivorSends {
						survivor, h, peer, departing = p.src, hs, "decode", wire.RoleReceiver
					}
					eventually(t, func() bool { return h.Path() == s.path && h.Status().State != Queued }, "transfer on its path")
					x := h.subs[0]
					eventually(t, func() bool { return x.ident.Load().nonce != 0 }, "the sender has the receiver's nonce")
					id := x.ident.Load()
					entry := wire.Ended{Request: h.ID(), Sub: id.sub, Nonce: id.nonce, Role: departing}
					if c.entry != nil {
						c.entry(&entry)
					}
					from := peer
					if c.from != nil {
						from = c.from(peer)
					}
					inbound{survivor}.OnControl(from, wire.Encode(&wire.Goodbye{Flags: wire.GoodbyeLast, Ended: []wire.Ended{entry}}))

					if !c.ends {
						require.Equal(t, int64(1), survivor.goodbye.refused.Load())
						require.False(t, x.farewell.Load(), "a transfer the goodbye does not name is not told")
						// Nor was the connection closed under it: once the wire moves again it completes.
						p.net.SetFault(func(mem.FaultPoint) mem.Fault { return mem.Fault{} })
						p.net.Resume()
						waitClosed(t, h.Done(), "done once the wire moves")
						requireState(t, h, Completed)
						return
					}
					require.Equal(t, int64(1), survivor.goodbye.matched.Load())
					waitClosed(t, h.Done(), "done on the goodbye")
					waitClosed(t, h.Quiesced(), "quiesced once its own operations ended")
					st := h.Status()
					require.Contains(t, []State{Failed, Cancelled}, st.State, "%v", st.Err)
					require.ErrorIs(t, st.Err, ErrPeerAborted)
					require.False(t, st.BlocksPoisoned)
					require.Zero(t, survivor.pool.Stats().Poisoned)
					require.Zero(t, survivor.Health().PoisonedBlocks)
				})
			}
		}
	}
}

// A goodbye goes only to a peer whose hello says it takes one (FeatureGoodbye) in wire 4: a
// wire-3 engine never gets a kind it would refuse as malformed. Close sends it to each peer
// it still has transfers with; an engine of this build receives it.
func TestGoodbyeOnlyToPeersThatTakeIt(t *testing.T) {
	old := speech{min: wire.MinVersion, max: 3, features: wire.KnownFeatures &^ wire.FeatureGoodbye}
	cases := []struct {
		desc  string
		peer  speech
		sends bool
	}{
		{"a peer of this build", buildSpeech(), true},
		{"a wire-3 peer", old, false},
		{"a wire-4 peer without the feature", speech{min: wire.MinVersion, max: wire.Version, features: wire.KnownFeatures &^ wire.FeatureGoodbye}, false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			n := mem.NewNetwork()
			n.SetFault(dataOnly(mem.Fault{Hang: true}))
			leaving, err := New(n.Transport("prefill"), fastConfig())
			require.NoError(t, err)
			staying, err := newEngine(n.Transport("decode"), fastConfig(), c.peer)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, staying.Close()) })
			p := &pair{net: n, src: leaving, dst: staying}
			src, dst := pools(t, 3)
			_, hr := p.start(t, 1, src, dst)
			eventually(t, func() bool { return hr.Status().State != Queued }, "advertised")
			require.NoError(t, leaving.Close())
			if c.sends {
				require.Equal(t, int64(1), leaving.goodbye.sent.Load())
			} else {
				require.Zero(t, leaving.goodbye.sent.Load())
			}
			n.Resume()
		})
	}
}
