// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// TestL6_EveryOperationCompletesExactlyOnce runs engines over the in-memory network on each
// path (staging slots, the direct path's IOV messages, its RMA gets) through completions,
// injected failures, cancels in flight, operations hung until Close, and operations that never
// quiesce, with an opLedger under each engine: every operation posted, of every kind, gets
// exactly one final completion and nothing after it. TestL6_UCX... runs the same over UCX.
func TestL6_EveryOperationCompletesExactlyOnce(t *testing.T) {
	paths := []struct {
		name   string
		cfg    func() Config
		direct bool
		pools  func(t testing.TB, seed uint64) (*kvPool, *kvPool)
		kinds  []string
		path   Path
	}{
		{"staging", fastConfig, false, pools, []string{"send", "receive"}, PathStaging},
		{"direct IOV messages", func() Config { c := directConfig(); c.Tuning.DisableRMA = true; return c }, true, pools,
			[]string{"IOV send", "IOV receive"}, PathDirect},
		{"RMA gets", rmaConfig, true, rmaPools, []string{"get", "generation read"}, PathRMA},
		{"staging pull", pullConfig, false, pools, []string{"get", "generation read"}, PathStaging},
	}
	for _, pc := range paths {
		t.Run(pc.name, func(t *testing.T) {
			cfg := pc.cfg()
			cfg.TransferTimeout = 150 * time.Millisecond
			cfg.Tuning.QuarantineTimeout = 5 * time.Second // Close, not the timer, must end the hung ones
			cfg.QueueTimeout = 300 * time.Millisecond
			n := mem.NewNetwork()
			mt := map[Peer]*mem.Transport{"prefill": n.Transport("prefill"), "decode": n.Transport("decode")}
			led := map[Peer]*opLedger{"prefill": newOpLedger(mt["prefill"]), "decode": newOpLedger(mt["decode"])}
			acfg, bcfg := cfg, cfg
			if pc.name == "staging pull" { // staging memory the transport may expose (newPullPair)
				acfg.StagingMemory = make([]byte, int64(cfg.Tuning.NumSlots)*cfg.SlotBytes)
				bcfg.StagingMemory = make([]byte, int64(cfg.Tuning.NumSlots)*cfg.SlotBytes)
				mt["prefill"].AllowDirect(acfg.StagingMemory)
				mt["decode"].AllowDirect(bcfg.StagingMemory)
			}
			a, err := New(led["prefill"], acfg)
			require.NoError(t, err)
			b, err := New(led["decode"], bcfg)
			require.NoError(t, err)
			closed := false
			t.Cleanup(func() {
				if !closed {
					_ = a.Close()
					_ = b.Close()
				}
			})
			p := &pair{net: n, src: a, dst: b}
			// Requests by id % 5: complete, hang until Close, fail, never quiesce, cancelled
			// in flight with a chunk delayed.
			n.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind != wire.KindData {
					return mem.Fault{}
				}
				switch fp.Tag.Request % 5 {
				case 1:
					return mem.Fault{Hang: true}
				case 2:
					return mem.Fault{FailAfter: 10}
				case 3:
					return mem.Fault{Hang: true, NeverQuiesce: true}
				case 4:
					return mem.Fault{Delay: 100 * time.Millisecond}
				}
				return mem.Fault{}
			})
			var ended, hung []*Handle
			for id := range RequestID(10) {
				src, dst := pc.pools(t, uint64(id+1))
				if pc.direct {
					mt["prefill"].AllowDirect(src.mem)
					mt["decode"].AllowDirect(dst.mem)
				}
				hs, hr := p.start(t, id, src, dst)
				switch id % 5 {
				case 1, 3:
					hung = append(hung, hs, hr)
				case 4:
					eventually(t, func() bool { return p.net.OnWire() > 0 || isClosed(hr.Done()) }, "on the wire")
					p.dst.Cancel(id)
					fallthrough
				default:
					ended = append(ended, hs, hr)
				}
				if id%5 == 0 {
					waitClosed(t, hr.Quiesced(), "completed")
					requireState(t, hr, Completed)
					require.Equal(t, pc.path, hr.Path())
					require.Equal(t, src.stream(t), dst.stream(t))
				}
			}
			for _, h := range ended {
				waitClosed(t, h.Quiesced(), fmt.Sprintf("request %d ended", h.ID()))
			}
			for _, h := range hung {
				waitClosed(t, h.Done(), fmt.Sprintf("request %d failed", h.ID()))
			}
			require.NotZero(t, led["prefill"].open()+led["decode"].open(), "no operation was left hanging for Close")
			require.NoError(t, a.Close())
			require.NoError(t, b.Close())
			closed = true
			require.Zero(t, n.Pending(), "operations left without a final verdict")
			posted := map[string]int{}
			for name, l := range led {
				require.Empty(t, l.check(), name)
				for k, v := range l.posted() {
					posted[k] += v
				}
			}
			for _, k := range pc.kinds {
				require.NotZero(t, posted[k], "no %s posted: %v", k, posted)
			}
			t.Logf("posted %v", posted)
		})
	}
}

func TestL8_DuplicatesNeverStartASecondTransfer(t *testing.T) {
	t.Run("duplicate Send and Receive for a live id", func(t *testing.T) {
		p := newPair(t, fastConfig(), fastConfig())
		src, dst := pools(t, 1)
		_, err := p.dst.Receive(bg, Spec{ID: 5, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		require.NoError(t, err)
		_, err = p.dst.Receive(bg, Spec{ID: 5, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		require.ErrorIs(t, err, ErrDuplicate)
		_, err = p.dst.Send(bg, Spec{ID: 5, Peer: "prefill", Plan: src.plan, Pool: src.mem})
		require.ErrorIs(t, err, ErrDuplicate)
		hs, err := p.src.Send(bg, Spec{ID: 5, Peer: "decode", Plan: src.plan, Pool: src.mem})
		require.NoError(t, err)
		_, err = p.src.Send(bg, Spec{ID: 5, Peer: "decode", Plan: src.plan, Pool: src.mem})
		require.ErrorIs(t, err, ErrDuplicate)
		waitClosed(t, hs.Quiesced(), "sent")
		requireState(t, hs, Completed)
		require.Equal(t, src.stream(t), dst.stream(t))
	})
	t.Run("every control message delivered twice, requests retried", func(t *testing.T) {
		cfg := fastConfig()
		cfg.Tuning.RetryInterval = time.Millisecond
		p := newPair(t, cfg, cfg)
		p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
			if fp.Kind == wire.KindData {
				return mem.Fault{Delay: 10 * time.Millisecond} // let the retries pile up
			}
			return mem.Fault{Duplicate: true}
		})
		src, dst := pools(t, 2)
		hs, hr := p.start(t, 9, src, dst)
		waitClosed(t, hs.Quiesced(), "sent")
		waitClosed(t, hr.Quiesced(), "received")
		requireState(t, hs, Completed)
		requireState(t, hr, Completed)
		require.Equal(t, src.plan.Bytes(), hs.Status().Bytes, "bytes counted once")
		require.Equal(t, src.plan.Bytes(), hr.Status().Bytes, "bytes counted once")
		require.Equal(t, src.stream(t), dst.stream(t))
	})
}

func TestL9_UnknownQuiescenceMeansPoisonNeverRelease(t *testing.T) {
	cases := []struct {
		desc  string
		fault mem.Fault
		lose  bool
	}{
		{"cancelled op never reports again", mem.Fault{Hang: true, NeverQuiesce: true}, false},
		{"lost peer leaves the memory unknown", mem.Fault{Hang: true, NeverQuiesce: true}, true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			// The deadline must come after both chunks are on the wire: 300 ms raced their
			// posting on a loaded host.
			cfg.TransferTimeout = 2 * time.Second
			cfg.Tuning.QuarantineTimeout = 100 * time.Millisecond
			if c.lose {
				cfg.TransferTimeout = 10 * time.Second
			}
			p := newPair(t, cfg, cfg)
			p.net.SetFault(dataOnly(c.fault))
			src, dst := pools(t, 1)
			hs, hr := p.start(t, 1, src, dst)
			eventually(t, func() bool { return p.net.OnWire() >= 4 }, "two chunks hung on the wire")
			if c.lose {
				p.net.LosePeer("prefill")
			}
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			for _, e := range []*Engine{p.src, p.dst} {
				st := e.pool.Stats()
				require.Equal(t, 2, st.Poisoned, "both hung slots poisoned, never released")
				require.Zero(t, st.Leased)
			}
			requireState(t, hr, Failed)
			p.net.Resume() // nothing may come back from a poisoned slot
			quiet(t, p.net)
			require.Equal(t, 2, p.dst.pool.Stats().Poisoned)
			require.False(t, p.dst.Health().Healthy == (p.dst.pool.Stats().Total-2 < cfg.MaxConcurrent))
		})
	}
}

func TestL9_LateCompletionAfterPoisonNeverReturnsTheSlot(t *testing.T) {
	cfg := fastConfig()
	cfg.TransferTimeout = 300 * time.Millisecond
	cfg.Tuning.QuarantineTimeout = 50 * time.Millisecond
	p := newPair(t, cfg, cfg)
	p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
	src, dst := pools(t, 1)
	hs, hr := p.start(t, 1, src, dst)
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	before := p.dst.pool.Stats()
	require.Equal(t, 2, before.Poisoned)
	require.NotZero(t, p.net.Pending(), "the hung operations are still out there")

	p.net.Resume() // the transport completes late, successfully
	eventually(t, func() bool { return p.net.Pending() == 0 }, "late completions delivered")
	quiet(t, p.net)
	require.Equal(t, before, p.dst.pool.Stats(), "a late completion put a poisoned slot back")
	require.Equal(t, make([]byte, dst.plan.Bytes()), dst.stream(t), "a late chunk was scattered into caller memory")
}

func TestL10_QuiescedClosesOnceAndOnlyWhenTheTransportLetsGo(t *testing.T) {
	cfg := fastConfig()
	cfg.Tuning.QuarantineTimeout = 10 * time.Second
	dcfg := cfg
	dcfg.TransferTimeout = 300 * time.Millisecond
	p := newPair(t, cfg, dcfg)
	p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
	src, dst := pools(t, 1)
	hs, hr := p.start(t, 1, src, dst)

	waitClosed(t, hr.Done(), "receiver done")
	requireState(t, hr, Quarantined, ErrQuarantined, ErrDeadline)
	require.Equal(t, NotCancellable, p.dst.Cancel(1))
	quiet(t, p.net)
	require.False(t, isClosed(hr.Quiesced()), "quiesced while the transport still holds the slot")
	require.NotZero(t, p.dst.pool.Stats().Leased)
	require.Equal(t, int64(1), p.dst.Health().Numbers.Quarantined)

	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hr, Failed, ErrDeadline)
	requireState(t, hs, Failed, ErrPeerAborted)
	require.Zero(t, p.dst.pool.Stats().Poisoned, "proven done: released, not poisoned")
	require.Zero(t, p.dst.Health().Numbers.Quarantined)
	require.Equal(t, make([]byte, dst.plan.Bytes()), dst.stream(t), "the engine wrote caller memory after giving up")
}

func TestL11_NoWaitWithoutABound(t *testing.T) {
	cfg := fastConfig()
	cfg.QueueTimeout = 50 * time.Millisecond
	cfg.TransferTimeout = 50 * time.Millisecond
	cfg.MaxConcurrent, cfg.Tuning.NumSlots, cfg.Tuning.PipelineDepth = 1, 1, 1
	p := newPair(t, cfg, cfg)
	src, dst := pools(t, 1)

	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 2, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
	require.NoError(t, err)
	// The only slot is taken by request 2, so request 3 waits in the queue, bounded too.
	// Request 2 took it once it left Queued: Advertised, or already Failed at its 50ms
	// deadline when a loaded host's stall outlasted it (then waiting for Advertised never ends).
	eventually(t, func() bool { return hr.Status().State != Queued }, "request 2 holds the slot")
	hq, err := p.dst.Receive(bg, Spec{ID: 3, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	hc, err := p.src.Send(ctx, Spec{ID: 4, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)

	for _, h := range []*Handle{hs, hr, hq, hc} {
		waitClosed(t, h.Quiesced(), "bounded wait")
	}
	requireState(t, hs, Failed, ErrQueueTimeout) // no receiver ever asked
	requireState(t, hr, Failed, ErrDeadline)     // no sender ever answered
	requireState(t, hc, Failed, ErrQueueTimeout, context.DeadlineExceeded)
	require.True(t, hq.Status().State == Failed || hq.Status().State == Completed)
}
