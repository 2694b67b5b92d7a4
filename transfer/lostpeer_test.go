// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// L11 for a peer already gone: a Receive from a peer the transport reported lost fails at once
// with a *PeerLostError naming it (matching ErrPeerLost), as one already waiting when the loss
// comes does (within a second of the report), and nothing is sent to it (no hello,
// no request: over UCX each would retry a connection to an address nobody answers), instead of
// waiting out QueueTimeout (a Send: TestL11_ASendToALostPeerFailsAtOnceOnEveryPath). The
// engine forgets the loss when the peer speaks again (a false alarm) or after LostPeerTTL, and
// remembers at most MaxPending peers.
func TestL11_ARequestToALostPeerFailsAtOnce(t *testing.T) {
	cases := []struct {
		desc string
		// lose reports the peer lost to the engine that will ask, and returns that engine
		// and the peer's name.
		lose    func(p *pair) (*Engine, Peer)
		request func(p *pair, src, dst *kvPool) (*Handle, error)
		// waiting: the request is made first, and waits (for a Send the sender never makes)
		// when the loss comes.
		waiting bool
	}{
		{"a Receive from a sender that died",
			func(p *pair) (*Engine, Peer) { p.net.LosePeer("prefill"); return p.dst, "prefill" },
			func(p *pair, _, dst *kvPool) (*Handle, error) {
				return p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			}, false},
		{"a Receive waiting when its sender dies",
			func(p *pair) (*Engine, Peer) { p.net.LosePeer("prefill"); return p.dst, "prefill" },
			func(p *pair, _, dst *kvPool) (*Handle, error) {
				return p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			}, true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.QueueTimeout = 30 * time.Second
			p := newPair(t, cfg, cfg)
			src, dst := pools(t, 1)
			var h *Handle
			if c.waiting {
				var err error
				h, err = c.request(p, src, dst)
				require.NoError(t, err)
				eventually(t, func() bool { return h.Status().State != Queued }, "the request sent")
			}
			e, peer := c.lose(p)
			eventually(t, func() bool { return e.PeerLost(peer) != nil }, "the loss reported")
			var toPeer atomic.Int64
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.To == peer {
					toPeer.Add(1)
				}
				return mem.Fault{}
			})
			start := time.Now()
			if !c.waiting {
				var err error
				h, err = c.request(p, src, dst)
				require.NoError(t, err)
			}
			select {
			case <-h.Done():
			case <-time.After(time.Second):
				t.Fatalf("not done %v after a request to a lost peer (QueueTimeout %v): %+v", time.Since(start), cfg.QueueTimeout, h.Status())
			}
			t.Logf("failed %v after the request: %v", time.Since(start), h.Status().Err)
			st := h.Status()
			require.Equal(t, Failed, st.State, "%v", st.Err)
			require.ErrorIs(t, st.Err, ErrPeerLost)
			var pl *PeerLostError
			require.True(t, errors.As(st.Err, &pl), "%v", st.Err)
			require.Equal(t, peer, pl.Peer)
			require.Contains(t, st.Err.Error(), string(peer))
			waitClosed(t, h.Quiesced(), "quiesced")
			require.Zero(t, toPeer.Load(), "messages went to the lost peer")
		})
	}
}

// A false alarm (the transport reported a live peer lost) ends with the peer's next message:
// requests with it then run as before; a loss is forgotten after LostPeerTTL; and at most
// MaxPending lost peers are remembered, the oldest going first.
func TestLostPeersAreForgottenAndBounded(t *testing.T) {
	alarm := fmt.Errorf("%w: false alarm", ErrPeerLost)
	t.Run("the peer speaks again", func(t *testing.T) {
		p := newPair(t, fastConfig(), fastConfig())
		p.net.ReportPeerLost(p.net.Endpoint("decode"), "prefill", alarm)
		eventually(t, func() bool { return p.dst.PeerLost("prefill") != nil }, "the false alarm reported")
		// The prefill engine greets decode (a Receive of its own): decode hears it.
		src, dst := pools(t, 2)
		back, err := p.src.Receive(bg, Spec{ID: 50, Peer: "decode", Plan: dst.plan, Pool: dst.mem})
		require.NoError(t, err)
		eventually(t, func() bool { return p.dst.PeerLost("prefill") == nil }, "the loss forgotten")
		p.src.Cancel(50)
		waitClosed(t, back.Quiesced(), "the greeting receive ended")
		hs, hr := p.start(t, 1, src, dst)
		waitClosed(t, hr.Quiesced(), "received")
		waitClosed(t, hs.Quiesced(), "sent")
		requireState(t, hr, Completed)
		require.Equal(t, src.stream(t), dst.stream(t))
	})
	t.Run("a Send refused during a false alarm", func(t *testing.T) {
		// The sender refuses a Send to the receiver it believes lost; the live receiver's
		// request ends the alarm and is answered at once (no wait for its deadline), and the
		// next Send runs.
		cfg := fastConfig()
		cfg.TransferTimeout, cfg.QueueTimeout = 30*time.Second, 30*time.Second
		p := newPair(t, cfg, cfg)
		p.net.ReportPeerLost(p.net.Endpoint("prefill"), "decode", alarm)
		eventually(t, func() bool { return p.src.PeerLost("decode") != nil }, "the false alarm reported")
		src, dst := pools(t, 3)
		// The Send is refused before the Receive starts: the transfer's goroutine checks the
		// loss, and a loaded host could run the receiver's hello (which ends the alarm) first;
		// the Send then ran, and completed.
		hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
		require.NoError(t, err)
		waitClosed(t, hs.Quiesced(), "the refused Send quiesced")
		requireState(t, hs, Failed, ErrPeerLost)
		hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		require.NoError(t, err)
		const bound = 10 * time.Second // far short of the 30s deadlines it would wait otherwise
		select {
		case <-hr.Quiesced():
		case <-time.After(bound):
			t.Fatalf("the receiver waits %v for a Send refused during a false alarm: %+v", bound, hr.Status())
		}
		requireState(t, hr, Failed, ErrPeerAborted)
		require.NoError(t, p.src.PeerLost("decode"), "the receiver's request ended the alarm")
		hs, hr = p.start(t, 2, src, dst)
		waitClosed(t, hr.Quiesced(), "received")
		waitClosed(t, hs.Quiesced(), "sent")
		requireState(t, hr, Completed)
		require.Equal(t, src.stream(t), dst.stream(t))
	})
	t.Run("this side's own endpoint retired", func(t *testing.T) {
		// The UCX transport replacing a wedged worker closes its endpoints: their transfers
		// fail, but the peers may be alive, and requests with them must not be refused.
		p := newPair(t, fastConfig(), fastConfig())
		p.net.ReportPeerLost(p.net.Endpoint("decode"), "prefill", fmt.Errorf("%w: %w", ErrPeerLost, transport.ErrEndpointRetired))
		p.net.ReportPeerLost(p.net.Endpoint("decode"), "other", alarm) // delivered after the first
		eventually(t, func() bool { return p.dst.PeerLost("other") != nil }, "the reports delivered")
		require.NoError(t, p.dst.PeerLost("prefill"))
	})
	t.Run("after LostPeerTTL", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Tuning.LostPeerTTL = 50 * time.Millisecond
		p := newPair(t, cfg, cfg)
		p.net.ReportPeerLost(p.net.Endpoint("decode"), "prefill", alarm)
		eventually(t, func() bool { return p.dst.PeerLost("prefill") != nil }, "the loss reported")
		eventually(t, func() bool { return p.dst.PeerLost("prefill") == nil }, "the loss forgotten")
	})
	t.Run("at most MaxPending", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Tuning.MaxPending = 4
		p := newPair(t, cfg, cfg)
		for i := range 10 {
			p.net.ReportPeerLost(p.net.Endpoint("decode"), Peer(fmt.Sprintf("gone-%d", i)), alarm)
		}
		eventually(t, func() bool { return p.dst.PeerLost("gone-9") != nil }, "the last loss reported")
		p.dst.mu.Lock()
		n := len(p.dst.lost)
		p.dst.mu.Unlock()
		require.Equal(t, cfg.Tuning.MaxPending, n)
		for i := range 6 {
			require.NoError(t, p.dst.PeerLost(Peer(fmt.Sprintf("gone-%d", i))), "gone-%d outlived newer losses", i)
		}
	})
}

// L11 for a Send whose receiver is gone, on every sending path: no request to a known dead
// peer waits more than a second. A Send to a peer the transport already reported lost fails
// at once, and one already queued when the loss is reported (waiting for its receiver's
// request, for one of MaxConcurrent, or for a staging slot) fails when it is, each with an
// error matching ErrPeerLost, a *PeerLostError naming the peer, instead of waiting out
// QueueTimeout (30 s here). It loses nothing: Done and Quiesced close, no slot or block is poisoned, nothing is
// quarantined, and the failure counts for Health as a queued one does.
func TestL11_ASendToALostPeerFailsAtOnceOnEveryPath(t *testing.T) {
	const bound = time.Second
	type queued struct {
		desc string
		// hold keeps the Send queued once it has its request (nil: it waits for the request).
		hold    func(t *testing.T, e *Engine)
		staging bool // only a path that leases staging slots waits for one (not after a decline: memPath.declined)
		before  bool // the loss is reported before the Send is made
	}
	holdAdmission := func(t *testing.T, e *Engine) {
		for range e.cfg.MaxConcurrent { // as transfers with other peers would
			e.admission <- struct{}{}
		}
		t.Cleanup(func() {
			for range e.cfg.MaxConcurrent {
				<-e.admission
			}
		})
	}
	holdSlots := func(t *testing.T, e *Engine) {
		var held []*buffer.Slot
		for {
			s, err := e.pool.TryLease()
			if err != nil {
				break
			}
			held = append(held, s)
		}
		t.Cleanup(func() { releaseAll(held) })
	}
	cases := []queued{
		{desc: "known lost before the Send", before: true},
		{desc: "lost while the Send waits for its request"},
		{desc: "lost while the Send waits for admission", hold: holdAdmission},
		{desc: "lost while the Send waits for a staging slot", hold: holdSlots, staging: true},
	}
	for _, mp := range memPaths() {
		for _, c := range cases {
			staged := mp.want == PathStaging && !mp.declined
			if c.staging && !staged {
				continue
			}
			t.Run(mp.name+"/"+c.desc, func(t *testing.T) {
				cfg := fastConfig()
				cfg.QueueTimeout = 30 * time.Second
				cfg.TransferTimeout = 30 * time.Second
				p, start := mp.setup(t, cfg, cfg)
				var infos atomic.Int64
				p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
					if fp.From == "decode" && fp.Kind == wire.KindRequestInfo {
						infos.Add(1)
						return mem.Fault{Drop: c.hold == nil} // the Send waits for its request
					}
					return mem.Fault{}
				})
				if c.hold != nil {
					c.hold(t, p.src)
				}
				if c.before {
					p.net.LosePeer("decode")
					eventually(t, func() bool { return p.src.PeerLost("decode") != nil }, "the loss reported")
				}
				asked := time.Now().UnixNano()
				hs, hr := start(1)
				if !c.before {
					eventually(t, func() bool { return infos.Load() > 0 }, "the receiver's request sent")
					if c.hold != nil { // the Send took it, and waits for what hold keeps
						eventually(t, func() bool { return hs.subs[0].ident.Load().nonce != 0 }, "the Send took its request")
					}
					require.Equal(t, Queued, hs.Status().State)
					p.net.LosePeer("decode")
				}
				lost := time.Now()
				select {
				case <-hs.Done():
				case <-time.After(bound):
					t.Fatalf("the Send is not done %v after its peer was lost (QueueTimeout %v): %+v", time.Since(lost), cfg.QueueTimeout, hs.Status())
				}
				t.Logf("the Send failed %v after the loss", time.Since(lost))
				st := hs.Status()
				require.Equal(t, Failed, st.State, "%v", st.Err)
				require.ErrorIs(t, st.Err, ErrPeerLost)
				require.Contains(t, st.Err.Error(), "decode")
				var pl *PeerLostError // whether the loss came before the Send or while it waited
				require.True(t, errors.As(st.Err, &pl), "%v", st.Err)
				require.Equal(t, Peer("decode"), pl.Peer)
				waitClosed(t, hs.Quiesced(), "the Send quiesced")
				waitClosed(t, hr.Quiesced(), "the Receive quiesced")
				require.False(t, st.BlocksPoisoned)
				require.Zero(t, p.src.pool.Stats().Poisoned)
				require.Zero(t, p.src.Health().Numbers.Quarantined)
				require.GreaterOrEqual(t, p.src.lastFailure.Load(), asked, "the failure counts for Health")
			})
		}
	}
}
