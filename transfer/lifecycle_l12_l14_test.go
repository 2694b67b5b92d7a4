// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

func TestL12_HealthTellsTheTruth(t *testing.T) {
	t.Run("a hung transport turns unhealthy within the progress deadline and recovers", func(t *testing.T) {
		cfg := fastConfig()
		cfg.ProgressDeadline = 100 * time.Millisecond
		cfg.TransferTimeout = 10 * time.Second
		p := newPair(t, cfg, cfg)
		p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
		src, dst := pools(t, 1)
		hs, hr := p.start(t, 1, src, dst)
		require.True(t, p.dst.Health().Healthy)
		start := time.Now()
		eventually(t, func() bool { return !p.dst.Health().Healthy }, "unhealthy")
		// Within the deadline, with room for a loaded host's stall of the polling goroutine
		// (a 1s margin was not); SinceProgress below says it was the deadline that passed.
		require.Less(t, time.Since(start), cfg.ProgressDeadline+5*time.Second)
		h := p.dst.Health()
		require.Contains(t, h.Reason, "no transfer progressed")
		require.Equal(t, int64(1), h.Numbers.InFlight)
		require.Greater(t, h.Numbers.SinceProgress, cfg.ProgressDeadline)

		p.net.SetFault(nil)
		p.net.Resume()
		waitClosed(t, hr.Quiesced(), "received")
		waitClosed(t, hs.Quiesced(), "sent")
		requireState(t, hr, Completed)
		require.True(t, p.dst.Health().Healthy, p.dst.Health().Reason)
	})
	t.Run("requests one after another to a silent peer turn unhealthy", func(t *testing.T) {
		// A worker whose every request times out, one at a time: the in-flight count keeps
		// dropping to zero between them, and no byte moves. Each new request used to restart
		// the progress clock, so /health said 200 for as long as the requests kept failing.
		cfg := fastConfig()
		cfg.TransferTimeout = 100 * time.Millisecond
		cfg.ProgressDeadline = 200 * time.Millisecond
		p := newPair(t, cfg, cfg) // the prefill engine never sends: a silent peer
		_, dst := pools(t, 1)
		start := time.Now()
		unhealthy, samples := false, 0
		// The loop ends once unhealthy (a few requests); its 10s bound only ends a failing
		// run: 2s could pass in a loaded host's stall with the last failure a deadline old.
		for id := RequestID(1); !unhealthy && time.Since(start) < 10*time.Second; id++ {
			h, err := p.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			for !isClosed(h.Quiesced()) && !unhealthy {
				unhealthy = !p.dst.Health().Healthy
				samples++
				time.Sleep(time.Millisecond)
			}
			waitClosed(t, h.Quiesced(), "timed out")
			st := h.Status()
			require.Equal(t, Failed, st.State, "%v", st.Err)
			require.Zero(t, st.Bytes)
			require.NoError(t, h.Release())
			unhealthy = unhealthy || !p.dst.Health().Healthy
		}
		h := p.dst.Health()
		require.True(t, unhealthy, "healthy for %v (%d samples) while every request timed out: %+v", time.Since(start), samples, h)
	})
	t.Run("churn of cancelled transfers is no sign of progress", func(t *testing.T) {
		// One transfer is stuck on a hung wire while others come and go (leased, advertised,
		// cancelled): the engine is still wedged, and must say so within the deadline. A lease
		// or a cancel used to count as progress, which kept a frozen peer looking healthy.
		cfg := fastConfig()
		cfg.MaxConcurrent, cfg.Tuning.NumSlots = 4, 8
		cfg.ProgressDeadline = 150 * time.Millisecond
		cfg.TransferTimeout = 10 * time.Second
		p := newPair(t, cfg, cfg)
		p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
		src, dst := pools(t, 1)
		hs, hr := p.start(t, 1, src, dst)
		eventually(t, func() bool { return hr.Status().State == Advertised || hr.Status().State == InFlight }, "stuck transfer advertised")
		start := time.Now()
		unhealthy := false
		for id := RequestID(100); time.Since(start) < 10*time.Second && !unhealthy; id++ { // ends once unhealthy
			h, err := p.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			eventually(t, func() bool { return h.Status().State != Queued }, "churn transfer advertised")
			p.dst.Cancel(id)
			waitClosed(t, h.Quiesced(), "churn transfer quiesced")
			h.Release()
			unhealthy = !p.dst.Health().Healthy
		}
		require.True(t, unhealthy, "healthy %v after the stall began, with churn: %+v", time.Since(start), p.dst.Health())
		p.net.SetFault(nil)
		p.net.Resume()
		waitClosed(t, hr.Quiesced(), "received")
		waitClosed(t, hs.Quiesced(), "sent")
		requireState(t, hr, Completed)
	})
	t.Run("quarantines over budget", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Tuning.QuarantineBudget = tuning.None // zero would take the default
		cfg.TransferTimeout = 300 * time.Millisecond
		cfg.Tuning.QuarantineTimeout = 10 * time.Second
		p := newPair(t, cfg, cfg)
		p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
		src, dst := pools(t, 1)
		_, h1 := p.start(t, 1, src, dst)
		waitClosed(t, h1.Done(), "quarantined")
		h := p.dst.Health()
		require.False(t, h.Healthy)
		require.Zero(t, h.Numbers.QuarantineBudget)
		require.Contains(t, h.Reason, "1 transfers quarantined, over the budget of 0")
		p.net.Resume()
		waitClosed(t, h1.Quiesced(), "resolved")
		require.True(t, p.dst.Health().Healthy, p.dst.Health().Reason)
	})
	t.Run("poisoned slots leave too few", func(t *testing.T) {
		cfg := fastConfig()
		cfg.MaxConcurrent, cfg.Tuning.NumSlots = 2, 2
		cfg.TransferTimeout = 300 * time.Millisecond
		cfg.Tuning.QuarantineTimeout = 30 * time.Millisecond
		p := newPair(t, cfg, cfg)
		p.net.SetFault(dataOnly(mem.Fault{Hang: true, NeverQuiesce: true}))
		src, dst := pools(t, 1)
		_, hr := p.start(t, 1, src, dst)
		waitClosed(t, hr.Quiesced(), "poisoned")
		h := p.dst.Health()
		require.False(t, h.Healthy)
		require.Contains(t, h.Reason, "staging slots poisoned")
		require.Equal(t, 2, h.Numbers.PoisonedSlots)
	})
}

func TestL13_PoolBelowConcurrencyIsRefused(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxConcurrent, cfg.Tuning.NumSlots = 8, 5
	tr := mem.NewNetwork().Transport("x")
	defer func() { require.NoError(t, tr.Close(true)) }() // a failed New leaves the transport with its caller
	_, err := New(tr, cfg)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorIs(t, err, buffer.ErrUndersized)
	require.Contains(t, err.Error(), "needs at least 8 slots")
	// The error speaks of the fields the caller set, not the staging pool's own names.
	require.Contains(t, err.Error(), "MaxConcurrent = 8")
	require.Contains(t, err.Error(), "lower MaxConcurrent")
	require.NotContains(t, err.Error(), "Concurrency = ")
}

// activeSubs counts an engine's sub-transfers past Queued and not yet ended, and the most it
// ever saw at once.
type activeSubs struct {
	nopObserver
	now, most atomic.Int64
}

func (a *activeSubs) OnTransition(_ RequestID, sub int, from, to State, _ Event) {
	if sub < 0 {
		return
	}
	if from == Queued && to != Queued && !to.Terminal() {
		n := a.now.Add(1)
		for m := a.most.Load(); n > m && !a.most.CompareAndSwap(m, n); m = a.most.Load() {
		}
	} else if from != Queued && (to.Terminal() || to == Quarantined) && from != Quarantined {
		a.now.Add(-1)
	}
}

// L13: MaxConcurrent is the most transfers past Queued at once on the real engine, whether
// they hold staging slots (here fewer than the pool has) or none (the one-copy path); the
// others wait queued and all complete.
func TestL13_MaxConcurrentIsEnforced(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			const maxConc, requests = 2, 6
			cfg := fastConfig()
			cfg.MaxConcurrent, cfg.Tuning.NumSlots, cfg.Tuning.PipelineDepth = maxConc, 8, 1
			cfg.Tuning.DirectChunkBytes = 512
			cfg.Tuning.DisableDirect = !direct
			rcv, snd := &activeSubs{}, &activeSubs{}
			scfg, rcfg := cfg, cfg
			scfg.Observer, rcfg.Observer = snd, rcv
			p := newPair(t, scfg, rcfg)
			// Every chunk takes 20 ms on the wire, so requests that were let through would
			// all be in flight together.
			p.net.SetFault(dataOnly(mem.Fault{Delay: 20 * time.Millisecond}))
			var hs []*Handle
			for id := RequestID(1); id <= requests; id++ {
				src, dst := pools(t, uint64(id))
				if direct {
					p.net.Endpoint("prefill").AllowDirect(src.mem)
					p.net.Endpoint("decode").AllowDirect(dst.mem)
				}
				s, r := p.start(t, id, src, dst)
				hs = append(hs, s, r)
			}
			for _, h := range hs {
				waitClosed(t, h.Quiesced(), "transfer")
				requireState(t, h, Completed)
				require.Equal(t, direct, h.Path() != PathStaging, "path %v", h.Path())
			}
			require.Equal(t, int64(maxConc), rcv.most.Load(), "receiving engine")
			require.Equal(t, int64(maxConc), snd.most.Load(), "sending engine")
		})
	}
}

// TestL13_RequestLargerThanTheStagingPoolStreams moves a 64k-token request through two 4 MiB
// slots per side: it must complete, and allocate a small fraction of its size.
func TestL13_RequestLargerThanTheStagingPoolStreams(t *testing.T) {
	d := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 16, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 4096}
	cfg := fastConfig()
	cfg.SlotBytes = 4 << 20
	cfg.MaxConcurrent, cfg.Tuning.NumSlots = 1, 2
	cfg.TransferTimeout = 60 * time.Second
	p := newPair(t, cfg, cfg)
	src := newKVPool(t, d, layout.BlockMajor, nil, seqBlocks(0, 4096), 11)
	dst := newKVPool(t, d, layout.LayerMajor, nil, seqBlocks(0, 4096), 0)
	require.Greater(t, src.plan.Bytes(), 3*cfg.SlotBytes, "the request must be larger than both slots")

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	hs, hr := p.start(t, 1, src, dst)
	waitClosed(t, hr.Quiesced(), "received")
	waitClosed(t, hs.Quiesced(), "sent")
	runtime.ReadMemStats(&after)
	requireState(t, hr, Completed)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(src.plan.Bytes()/8), "streaming allocated like a copy of the request")
	want, got := make([]byte, src.plan.Bytes()), make([]byte, dst.plan.Bytes())
	require.NoError(t, newHostMover(src.mem).Gather(src.plan, 0, want)) // checked against the reference in TestHostMoverMatchesReference
	require.NoError(t, newHostMover(dst.mem).Gather(dst.plan, 0, got))
	require.True(t, bytes.Equal(want, got), "the streamed request arrived corrupted")
}

// TestL14_MultiPeerRequestIsTerminalOnlyWhenEverySubIs has a TP=1 decode rank receive its four
// heads from two TP=2 prefill ranks, two heads each.
func TestL14_MultiPeerRequestIsTerminalOnlyWhenEverySubIs(t *testing.T) {
	half := testDims
	half.NumHeads = 2
	setup := func(t *testing.T, obs Observer) (*mem.Network, [2]*Engine, *Engine, [2]*kvPool, *kvPool, [2]layout.Selection) {
		cfg := fastConfig()
		cfg.Tuning.CancelGrace = 50 * time.Millisecond
		cfg.Tuning.QuarantineTimeout = 10 * time.Second
		n := mem.NewNetwork()
		var senders [2]*Engine
		var srcs [2]*kvPool
		for i := range 2 {
			e, err := New(n.Transport(Peer(fmt.Sprintf("prefill-%d", i))), cfg)
			require.NoError(t, err)
			senders[i] = e
			srcs[i] = newKVPool(t, half, layout.BlockMajor, nil, blocks(1, 2, 3), uint64(10+i))
		}
		dcfg := cfg
		dcfg.Observer = obs
		recv, err := New(n.Transport("decode"), dcfg)
		require.NoError(t, err)
		t.Cleanup(func() {
			for _, e := range append(senders[:], recv) {
				require.NoError(t, e.Close())
				requireSlotsAccounted(t, e)
			}
		})
		dst := newKVPool(t, testDims, layout.LayerMajorNHD, nil, blocks(4, 5, 6), 0)
		sels := [2]layout.Selection{{LayerEnd: 2, HeadBegin: 0, HeadEnd: 2}, {LayerEnd: 2, HeadBegin: 2, HeadEnd: 4}}
		return n, senders, recv, srcs, dst, sels
	}
	receive := func(t *testing.T, recv *Engine, dst *kvPool, sels [2]layout.Selection) *Handle {
		var subs []SubSpec
		for i, s := range sels {
			plan, err := layout.NewPlan(dst.l, s, dst.plan.Blocks())
			require.NoError(t, err)
			subs = append(subs, SubSpec{Peer: Peer(fmt.Sprintf("prefill-%d", i)), Plan: plan})
		}
		h, err := recv.Receive(bg, Spec{ID: 77, Subs: subs, Pool: dst.mem})
		require.NoError(t, err)
		return h
	}

	t.Run("both halves arrive", func(t *testing.T) {
		_, senders, recv, srcs, dst, sels := setup(t, nil)
		h := receive(t, recv, dst, sels)
		for i, e := range senders {
			_, err := e.Send(bg, Spec{ID: 77, Peer: "decode", Plan: srcs[i].plan, Pool: srcs[i].mem})
			require.NoError(t, err)
		}
		waitClosed(t, h.Quiesced(), "received")
		requireState(t, h, Completed)
		require.Equal(t, srcs[0].plan.Bytes()+srcs[1].plan.Bytes(), h.Status().Bytes)
		for i, s := range sels {
			plan, err := layout.NewPlan(dst.l, s, dst.plan.Blocks())
			require.NoError(t, err)
			got := make([]byte, plan.Bytes())
			require.NoError(t, layouttest.ReferenceGather(plan, dst.mem, got))
			require.Equal(t, srcs[i].stream(t), got, "half %d", i)
		}
	})

	t.Run("a first error waits for the sibling that may still write", func(t *testing.T) {
		obs := &terminalProbe{}
		n, senders, recv, srcs, dst, sels := setup(t, obs)
		n.SetFault(func(fp mem.FaultPoint) mem.Fault {
			switch {
			case fp.Kind != wire.KindData:
				return mem.Fault{}
			case fp.From == "prefill-0":
				return mem.Fault{FailAfter: 8}
			}
			return mem.Fault{Hang: true}
		})
		h := receive(t, recv, dst, sels)
		obs.h.Store(h)
		// Sub 1 first, so its chunks are on the wire, hung, before sub 0 fails.
		_, err := senders[1].Send(bg, Spec{ID: 77, Peer: "decode", Plan: srcs[1].plan, Pool: srcs[1].mem})
		require.NoError(t, err)
		eventually(t, func() bool { return n.OnWire() >= 2 }, "sub 1 hung")
		_, err = senders[0].Send(bg, Spec{ID: 77, Peer: "decode", Plan: srcs[0].plan, Pool: srcs[0].mem})
		require.NoError(t, err)

		waitClosed(t, h.Done(), "decided")
		require.True(t, obs.sawSub0Fail.Load(), "sub 0 never failed")
		require.False(t, obs.doneAtSub0Fail.Load(), "the handle was done while sub 1 was still running")
		requireState(t, h, Quarantined, ErrQuarantined, mem.ErrInjected)
		quiet(t, n)
		require.False(t, isClosed(h.Quiesced()), "quiesced while sub 1's slot may still be written")

		n.Resume()
		waitClosed(t, h.Quiesced(), "resolved")
		requireState(t, h, Failed, mem.ErrInjected)
	})
}

// terminalProbe records, at the moment sub 0 fails, whether the handle was already done.
type terminalProbe struct {
	nopObserver
	h              atomic.Pointer[Handle]
	sawSub0Fail    atomic.Bool
	doneAtSub0Fail atomic.Bool
}

func (o *terminalProbe) OnTransition(id RequestID, sub int, from, to State, ev Event) {
	if sub == 0 && to == Failed {
		o.sawSub0Fail.Store(true)
		if h := o.h.Load(); h != nil && isClosed(h.Done()) {
			o.doneAtSub0Fail.Store(true)
		}
	}
}

// L14 with L12: a multi-peer handle counts against the quarantine budget once it is
// quarantined, and as settled (BlocksPoisoned) only then. A sub-transfer whose blocks are
// poisoned for good while its sibling still runs made the handle count as settled before it
// counted as quarantined: the budget's count went negative and hid another handle's
// quarantine. Every order of the siblings' ends keeps the count whole.
func TestL14_PoisonedSubNeverHidesAQuarantineFromTheBudget(t *testing.T) {
	half := testDims
	half.NumHeads = 2
	cases := []struct {
		desc    string
		sibling mem.Fault // on sub 0's data (from prefill-0); sub 1's hang until prefill-1 is lost, memory unknown
		first   bool      // the sibling ends before sub 1 is poisoned
	}{
		{desc: "the sibling completed, then sub 1 poisoned", first: true},
		{desc: "the sibling failed, then sub 1 poisoned", sibling: mem.Fault{FailAfter: 8}, first: true},
		{desc: "sub 1 poisoned while the sibling still runs", sibling: mem.Fault{Hang: true, IgnoreCancel: true}},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := directConfig()
			n := mem.NewNetwork()
			var senders [2]*Engine
			var srcs [2]*kvPool
			for i := range 2 {
				name := Peer(fmt.Sprintf("prefill-%d", i))
				e, err := New(n.Transport(name), cfg)
				require.NoError(t, err)
				senders[i] = e
				srcs[i] = newKVPool(t, half, layout.BlockMajor, nil, blocks(1, 2, 3), uint64(10+i))
				n.Endpoint(name).AllowDirect(srcs[i].mem)
			}
			dcfg := cfg
			dcfg.Tuning.QuarantineBudget = tuning.None
			dcfg.TransferTimeout, dcfg.Tuning.QuarantineTimeout, dcfg.Tuning.CancelGrace = time.Minute, time.Minute, time.Minute
			dcfg.ProgressDeadline = time.Minute
			recv, err := New(n.Transport("decode"), dcfg)
			require.NoError(t, err)
			t.Cleanup(func() {
				for _, e := range append(senders[:], recv) {
					require.NoError(t, e.Close())
				}
			})
			dst := newKVPool(t, testDims, layout.LayerMajorNHD, nil, blocks(4, 5, 6), 0)
			other := newKVPool(t, half, layout.BlockMajor, nil, blocks(1, 2, 3), 0)
			n.Endpoint("decode").AllowDirect(dst.mem)
			n.Endpoint("decode").AllowDirect(other.mem)
			var sub1Sent, sub0Sent atomic.Bool
			n.SetFault(func(fp mem.FaultPoint) mem.Fault {
				switch {
				case fp.Kind != wire.KindData:
					return mem.Fault{}
				case fp.Tag.Request == 88:
					return mem.Fault{Hang: true}
				case fp.From == "prefill-1":
					sub1Sent.Store(true)
					return mem.Fault{Hang: true, NeverQuiesce: true}
				}
				sub0Sent.Store(true)
				return c.sibling
			})
			health := func(what string) Health {
				h := recv.Health()
				require.GreaterOrEqual(t, h.Numbers.Quarantined, h.Numbers.BlocksPoisoned, "%s: settled transfers counted that are not quarantined: %+v", what, h.Numbers)
				return h
			}

			var subs []SubSpec
			for i, s := range []layout.Selection{{LayerEnd: 2, HeadBegin: 0, HeadEnd: 2}, {LayerEnd: 2, HeadBegin: 2, HeadEnd: 4}} {
				plan, err := layout.NewPlan(dst.l, s, dst.plan.Blocks())
				require.NoError(t, err)
				subs = append(subs, SubSpec{Peer: Peer(fmt.Sprintf("prefill-%d", i)), Plan: plan})
			}
			h, err := recv.Receive(bg, Spec{ID: 77, Subs: subs, Pool: dst.mem})
			require.NoError(t, err)
			// Sub 1 first, so its data hangs on the wire before its sibling ends.
			for _, i := range []int{1, 0} {
				_, err := senders[i].Send(bg, Spec{ID: 77, Peer: "decode", Plan: srcs[i].plan, Pool: srcs[i].mem})
				require.NoError(t, err)
				if i == 1 {
					eventually(t, func() bool { return sub1Sent.Load() && n.OnWire() >= 1 }, "sub 1's data hung")
				}
			}
			eventually(t, sub0Sent.Load, "the sibling's data sent")
			if c.first {
				eventually(t, func() bool { return h.subs[0].m.load().Terminal() }, "the sibling ended")
			}
			n.LosePeer("prefill-1")
			eventually(t, func() bool { return h.Status().BlocksPoisoned }, "sub 1's blocks poisoned")
			health("sub 1 poisoned")

			// Another transfer quarantined: over a budget of none, whatever else is settled.
			_, err = senders[0].Send(bg, Spec{ID: 88, Peer: "decode", Plan: srcs[0].plan, Pool: srcs[0].mem})
			require.NoError(t, err)
			h88, err := recv.Receive(bg, Spec{ID: 88, Peer: "prefill-0", Plan: other.plan, Pool: other.mem, Timeout: 100 * time.Millisecond})
			require.NoError(t, err)
			waitClosed(t, h88.Done(), "the other transfer's deadline")
			requireState(t, h88, Quarantined, ErrDeadline)
			hl := health("another quarantined")
			require.False(t, hl.Healthy, "a quarantined transfer over a budget of none: %+v", hl.Numbers)
			require.Contains(t, hl.Reason, "quarantined, over the budget")

			n.Resume() // the sibling's hung data ends: the handle quarantines, settled for good
			waitClosed(t, h.Done(), "the multi-peer handle decided")
			requireState(t, h, Quarantined)
			eventually(t, func() bool { return recv.Health().Numbers.BlocksPoisoned == 1 }, "the handle settled")
			waitClosed(t, h88.Quiesced(), "the other transfer resolved")
			hl = health("the other resolved")
			require.True(t, hl.Healthy, "only the settled handle is left: %s", hl.Reason)
			require.False(t, isClosed(h.Quiesced()))
		})
	}
}
