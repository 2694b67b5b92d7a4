// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// wireBytes counts the data bytes a network carries, so a test can tell the direct path
// (bare stream bytes) from staging (each chunk behind a DataHeaderBytes header).
type wireBytes struct {
	mu     sync.Mutex
	bytes  int
	chunks int
	fault  mem.Fault
}

func (w *wireBytes) judge(fp mem.FaultPoint) mem.Fault {
	if fp.Kind != wire.KindData || fp.Generation {
		return mem.Fault{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.bytes += fp.Bytes
	w.chunks++
	return w.fault
}

func (w *wireBytes) total() (bytes, chunks int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bytes, w.chunks
}

func directConfig() Config {
	cfg := fastConfig()
	cfg.Tuning.DirectChunkBytes = 512
	return cfg
}

// directPair is newPair with both pools allowed on the direct path.
func directPair(t *testing.T, src, dst Config, srcPool, dstPool *kvPool) (*pair, *wireBytes) {
	t.Helper()
	p := newPair(t, src, dst)
	w := &wireBytes{}
	p.net.SetFault(w.judge)
	if srcPool != nil {
		p.net.Endpoint("prefill").AllowDirect(srcPool.mem)
	}
	if dstPool != nil {
		p.net.Endpoint("decode").AllowDirect(dstPool.mem)
	}
	return p, w
}

func TestDirectMovesTheReferenceBytesAcrossLayouts(t *testing.T) {
	cases := []struct {
		desc       string
		srcOrder   layout.Order
		dstOrder   layout.Order
		chunk      int64
		held       []int
		stream     bool
		wantChunks int
	}{
		{"block-major to layer-major, 512-byte chunks", layout.BlockMajor, layout.LayerMajor, 512, nil, false, 8},
		{"layer-major to NHD, one chunk", layout.LayerMajor, layout.LayerMajorNHD, 1 << 20, nil, false, 1},
		{"chunks that cut rows", layout.BlockMajor, layout.BlockMajor, 10, nil, false, 410},
		{"partial: two blocks held", layout.BlockMajor, layout.LayerMajor, 512, []int{0, 2}, false, 4},
		{"layer-cut chunks for a streaming receiver", layout.BlockMajor, layout.LayerMajor, 1 << 20, nil, true, 2},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			src := newKVPool(t, testDims, c.srcOrder, nil, blocks(1, 2, 3, 4), 9)
			dst := newKVPool(t, testDims, c.dstOrder, nil, blocks(5, 6, 7, 8), 0)
			cfg := directConfig()
			cfg.Tuning.DirectChunkBytes = c.chunk
			p, w := directPair(t, cfg, cfg, src, dst)
			hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Held: c.held, Stream: c.stream})
			require.NoError(t, err)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)

			want, got := src.stream(t), dst.stream(t)
			if len(c.held) > 0 {
				sp, err := kvplan.WithoutPositions(src.plan, c.held)
				require.NoError(t, err)
				dp, err := kvplan.WithoutPositions(dst.plan, c.held)
				require.NoError(t, err)
				want, got = make([]byte, sp.Bytes()), make([]byte, dp.Bytes())
				require.NoError(t, layouttest.ReferenceGather(sp, src.mem, want))
				require.NoError(t, layouttest.ReferenceGather(dp, dst.mem, got))
				require.Equal(t, make([]byte, dst.plan.Bytes()-dp.Bytes()), func() []byte {
					kept, err := kvplan.WithoutPositions(dst.plan, notIn(c.held, len(dst.plan.Blocks())))
					require.NoError(t, err)
					b := make([]byte, kept.Bytes())
					require.NoError(t, layouttest.ReferenceGather(kept, dst.mem, b))
					return b
				}(), "a held block was written")
			}
			require.Equal(t, want, got)
			bytes, chunks := w.total()
			require.Equal(t, len(want), bytes, "direct chunks carry bare stream bytes, no header")
			require.Equal(t, c.wantChunks, chunks)
			require.Equal(t, hr.Status().Total, hr.Status().Bytes)
			require.False(t, hr.Status().BlocksPoisoned)
		})
	}
}

// notIn lists the positions in [0, n) not in held.
func notIn(held []int, n int) []int {
	var out []int
	for i := range n {
		found := false
		for _, h := range held {
			found = found || h == i
		}
		if !found {
			out = append(out, i)
		}
	}
	return out
}

// TP=2 senders to a TP=1 receiver: each half of the heads goes straight into its place.
func TestDirectMultiPeerSubsLandInPlace(t *testing.T) {
	half := testDims
	half.NumHeads = 2
	cfg := directConfig()
	n := mem.NewNetwork()
	var senders [2]*Engine
	var srcs [2]*kvPool
	for i := range 2 {
		tr := n.Transport(Peer(fmt.Sprintf("prefill-%d", i)))
		e, err := New(tr, cfg)
		require.NoError(t, err)
		senders[i] = e
		srcs[i] = newKVPool(t, half, layout.BlockMajor, nil, blocks(1, 2, 3), uint64(20+i))
		tr.AllowDirect(srcs[i].mem)
	}
	rtr := n.Transport("decode")
	recv, err := New(rtr, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, e := range append(senders[:], recv) {
			require.NoError(t, e.Close())
			requireSlotsAccounted(t, e)
		}
	})
	dst := newKVPool(t, testDims, layout.LayerMajorNHD, nil, blocks(4, 5, 6), 0)
	rtr.AllowDirect(dst.mem)
	w := &wireBytes{}
	n.SetFault(w.judge)
	sels := [2]layout.Selection{{LayerEnd: 2, HeadBegin: 0, HeadEnd: 2}, {LayerEnd: 2, HeadBegin: 2, HeadEnd: 4}}
	var subs []SubSpec
	for i, s := range sels {
		plan, err := layout.NewPlan(dst.l, s, dst.plan.Blocks())
		require.NoError(t, err)
		subs = append(subs, SubSpec{Peer: Peer(fmt.Sprintf("prefill-%d", i)), Plan: plan})
		hs, err := senders[i].Send(bg, Spec{ID: 7, Peer: "decode", Plan: srcs[i].plan, Pool: srcs[i].mem})
		require.NoError(t, err)
		defer func() { waitClosed(t, hs.Quiesced(), "sender quiesced"); requireState(t, hs, Completed) }()
	}
	hr, err := recv.Receive(bg, Spec{ID: 7, Subs: subs, Pool: dst.mem})
	require.NoError(t, err)
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	requireState(t, hr, Completed)
	for i, s := range subs {
		want, got := srcs[i].stream(t), make([]byte, s.Plan.Bytes())
		require.NoError(t, layouttest.ReferenceGather(s.Plan, dst.mem, got))
		require.Equal(t, want, got, "sub %d", i)
	}
	bytes, _ := w.total()
	require.Equal(t, int(dst.plan.Bytes()), bytes, "every chunk went direct")
}

func TestDirectFallsBackToStagingOrRefusesClearly(t *testing.T) {
	cases := []struct {
		desc              string
		allowSrc, allowDs bool
		disableOnReceiver bool
		senderMover       bool
		wantDirect        bool
		wantErr           error
	}{
		{"both pools direct-capable: direct", true, true, false, false, true, nil},
		{"receiver's pool not direct-capable: staging", true, false, false, false, false, nil},
		{"receiver disables direct: staging", true, true, true, false, false, nil},
		{"neither: staging", false, false, false, false, false, nil},
		{"sender's pool not direct-capable: refused as incompatible", false, true, false, false, false, ErrIncompatible},
		{"sender moves through a Mover: refused as incompatible", true, true, false, true, false, ErrIncompatible},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			src, dst := pools(t, 3)
			dcfg := directConfig()
			dcfg.Tuning.DisableDirect = c.disableOnReceiver
			var sp, dp *kvPool
			if c.allowSrc {
				sp = src
			}
			if c.allowDs {
				dp = dst
			}
			p, w := directPair(t, directConfig(), dcfg, sp, dp)
			spec := Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem}
			if c.senderMover {
				spec.Mover = newHostMover(src.mem)
			}
			hs, err := p.src.Send(bg, spec)
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			if c.wantErr != nil {
				requireState(t, hr, Failed, c.wantErr)
				requireState(t, hs, Failed, c.wantErr)
				require.Contains(t, hs.Status().Err.Error(), "direct")
				return
			}
			requireState(t, hr, Completed)
			require.Equal(t, src.stream(t), dst.stream(t))
			bytes, chunks := w.total()
			if c.wantDirect {
				require.Equal(t, int(src.plan.Bytes()), bytes)
			} else {
				require.Equal(t, int(src.plan.Bytes())+chunks*transport.DataHeaderBytes, bytes, "staged chunks carry headers")
			}
		})
	}
}

func TestDirectCancelInFlightWaitsForQuiescence(t *testing.T) {
	src, dst := pools(t, 4)
	cfg := directConfig()
	cfg.Tuning.QuarantineTimeout = 10 * time.Second
	p, w := directPair(t, cfg, cfg, src, dst)
	w.fault = mem.Fault{Hang: true}
	hs, hr := p.start(t, 1, src, dst)
	eventually(t, func() bool { return p.net.OnWire() >= 2 }, "a direct chunk hung on the wire")

	require.Equal(t, CancelRequestedInFlight, p.dst.Cancel(1))
	waitClosed(t, hr.Done(), "receiver done")
	quiet(t, p.net)
	require.False(t, isClosed(hr.Quiesced()), "quiesced while the transport may still write the caller's blocks")
	require.Zero(t, p.dst.pool.Stats().Leased, "a direct transfer holds no slot")

	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hr, Cancelled)
	require.False(t, hr.Status().BlocksPoisoned)
	require.Zero(t, p.dst.Health().Numbers.Quarantined)
}

func TestL9_DirectUnknownQuiescenceNeverQuiescesTheCallersBlocks(t *testing.T) {
	cases := []struct {
		desc  string
		close bool // the engine closes (force) instead of waiting for the quarantine timeout
	}{
		{"quarantine timeout", false},
		{"engine closed", true},
	}
	// Each case has its own network and engines, and waits for its quarantine and Close: both at once.
	rows := newRowGroup(t, len(cases))
	defer rows.wait()
	for _, c := range cases {
		rows.run(c.desc, func(t *testing.T) {
			src, dst := pools(t, 5)
			cfg := directConfig()
			dcfg := cfg
			dcfg.TransferTimeout = 200 * time.Millisecond
			dcfg.Tuning.QuarantineTimeout = 100 * time.Millisecond
			if c.close {
				dcfg.Tuning.QuarantineTimeout = time.Minute
			}
			dcfg.Tuning.QuarantineBudget = 1
			p, w := directPair(t, cfg, dcfg, src, dst)
			src2, dst2 := pools(t, 6)
			p.net.Endpoint("prefill").AllowDirect(src2.mem)
			p.net.Endpoint("decode").AllowDirect(dst2.mem)
			w.fault = mem.Fault{Hang: true, NeverQuiesce: true}
			_, hr := p.start(t, 1, src, dst)
			_, hr2 := p.start(t, 2, src2, dst2)
			waitClosed(t, hr.Done(), "receiver done")
			waitClosed(t, hr2.Done(), "second receiver done")
			requireState(t, hr, Quarantined, ErrQuarantined, ErrDeadline)
			if c.close {
				require.NoError(t, p.dst.Close())
			}
			eventually(t, func() bool { return hr.Status().BlocksPoisoned }, "blocks reported poisoned")
			require.NoError(t, p.dst.Drain(bg), "the transfer's goroutine ended")
			quiet(t, p.net)
			require.False(t, isClosed(hr.Quiesced()), "unknown quiescence told the caller to free its blocks")
			requireState(t, hr, Quarantined)
			require.True(t, hr2.Status().BlocksPoisoned)
			require.False(t, isClosed(hr2.Quiesced()))
			if !c.close {
				eventually(t, func() bool { return p.dst.Health().Numbers.BlocksPoisoned == 2 }, "both settled")
				h := p.dst.Health()
				require.Equal(t, int64(2), h.Numbers.Quarantined, "quarantined for good")
				require.True(t, h.Healthy, "settled transfers leave the quarantine budget (L12): %s", h.Reason)
			}
			require.Zero(t, p.dst.pool.Stats().Poisoned, "no slot was involved")
		})
	}
}

// A streaming Send on the direct path sends each layer as it is marked ready, straight from
// the pool, and the receiver sees the layers land in order.
func TestDirectStreamingSendWaitsForReadyLayers(t *testing.T) {
	src, dst := pools(t, 8)
	cfg := directConfig()
	cfg.Tuning.DirectChunkBytes = 1 << 20 // one chunk per layer with the layer cut
	p, w := directPair(t, cfg, cfg, src, dst)
	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Stream: true})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Stream: true})
	require.NoError(t, err)

	quiet(t, p.net) // the sender holds the request and waits for the model
	_, chunks := w.total()
	require.Zero(t, chunks, "nothing sent before a layer is ready")
	require.NoError(t, hs.MarkLayersReady(1))
	eventually(t, func() bool { return hr.LayersReady() == 1 }, "layer 0 landed")
	require.False(t, isClosed(hr.Done()))
	require.NoError(t, hs.MarkLayersReady(2))
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hr, Completed)
	require.Equal(t, 2, hr.LayersReady())
	require.Equal(t, src.stream(t), dst.stream(t))
	bytes, chunks := w.total()
	require.Equal(t, int(src.plan.Bytes()), bytes, "direct: bare stream bytes")
	require.Equal(t, 2, chunks)
}

// L2 with L9: a handle whose caller's blocks are not quiescent is never forgotten, whatever the
// caller released. Cancel still finds it and says to wait, and a new transfer can take neither
// its id nor its blocks until it quiesces; one poisoned for good never does.
func TestL2_NoHandleForgottenWhileNotQuiescent(t *testing.T) {
	cases := []struct {
		desc     string
		fault    mem.Fault
		poisoned bool // quiescence unknown: blocks poisoned for good
	}{
		{"blocks poisoned for good", mem.Fault{Hang: true, NeverQuiesce: true}, true},
		{"quarantined, the transport still holding the blocks", mem.Fault{Hang: true}, false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			src, dst := pools(t, 7)
			cfg := directConfig()
			dcfg := cfg
			dcfg.TransferTimeout = 100 * time.Millisecond
			dcfg.Tuning.QuarantineTimeout = 50 * time.Millisecond
			if !c.poisoned {
				dcfg.Tuning.QuarantineTimeout = time.Minute
			}
			p, w := directPair(t, cfg, dcfg, src, dst)
			w.fault = c.fault
			_, hr := p.start(t, 1, src, dst)
			waitClosed(t, hr.Done(), "receiver done")
			requireState(t, hr, Quarantined, ErrDeadline)
			if c.poisoned {
				eventually(t, func() bool { return hr.Status().BlocksPoisoned }, "blocks poisoned")
				require.NoError(t, p.dst.Drain(bg), "the transfer's goroutine ended")
			}
			require.NoError(t, hr.Release())
			require.Equal(t, int64(1), p.dst.Health().Numbers.Remembered, "released but not quiescent")

			out := p.dst.Cancel(1)
			require.Equal(t, NotCancellable, out)
			require.False(t, out.FreeNow())
			_, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.ErrorIs(t, err, ErrDuplicate, "a new transfer took the id of one not quiescent")

			overlap, err := layout.NewPlan(dst.l, dst.l.All(), blocks(30, 8, 31))
			require.NoError(t, err)
			for _, s := range []struct {
				desc string
				try  func() (*Handle, error)
			}{
				{"receive over the same blocks", func() (*Handle, error) {
					return p.dst.Receive(bg, Spec{ID: 2, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				}},
				{"receive over one block of them", func() (*Handle, error) {
					return p.dst.Receive(bg, Spec{ID: 3, Peer: "prefill", Plan: overlap, Pool: dst.mem})
				}},
				{"send of the same blocks", func() (*Handle, error) {
					return p.dst.Send(bg, Spec{ID: 4, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				}},
			} {
				_, err := s.try()
				require.ErrorIs(t, err, ErrBlocksBusy, s.desc)
				var be *blocksBusyError
				require.ErrorAs(t, err, &be, s.desc)
				require.Equal(t, RequestID(1), be.Holder, s.desc)
				require.Equal(t, c.poisoned, be.Poisoned, s.desc)
			}

			// Other blocks of the same pool, or the same block ids in another pool, are free.
			w.mu.Lock()
			w.fault = mem.Fault{}
			w.mu.Unlock()
			other, err := layout.NewPlan(dst.l, dst.l.All(), blocks(20, 21))
			require.NoError(t, err)
			h, err := p.dst.Receive(bg, Spec{ID: 5, Peer: "prefill", Plan: other, Pool: dst.mem})
			require.NoError(t, err)
			require.Contains(t, []CancelOutcome{CancelledBeforeAdvertise, CancelRequestedInFlight}, p.dst.Cancel(5))
			_, dst2 := pools(t, 8)
			h2, err := p.dst.Receive(bg, Spec{ID: 6, Peer: "prefill", Plan: dst2.plan, Pool: dst2.mem})
			require.NoError(t, err)
			require.Contains(t, []CancelOutcome{CancelledBeforeAdvertise, CancelRequestedInFlight}, p.dst.Cancel(6))
			waitClosed(t, h.Quiesced(), "receive over other blocks cancelled")
			waitClosed(t, h2.Quiesced(), "receive over another pool cancelled")

			if c.poisoned {
				require.False(t, isClosed(hr.Quiesced()))
				return
			}
			p.net.Resume()
			waitClosed(t, hr.Quiesced(), "the transport let go")
			require.Zero(t, p.dst.Health().Numbers.Remembered)
			// Quiesced closes before the transfer's goroutine has ended and let the handle go.
			eventually(t, func() bool { return p.dst.Cancel(1) == NotFound }, "quiescent and released: forgotten")
			h, err = p.dst.Receive(bg, Spec{ID: 2, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err, "quiescent blocks are the caller's again")
			require.Contains(t, []CancelOutcome{CancelledBeforeAdvertise, CancelRequestedInFlight}, p.dst.Cancel(2))
			waitClosed(t, h.Quiesced(), "cancelled")
		})
	}
}

// Close poisons only what the force-closed transport never proved done. Completions it
// delivered while closing are proof: a transfer must take them before it gives up, or a
// direct transfer whose operations all ended cleanly is left with its caller's blocks
// poisoned for good. One goroutine makes the race between the queued completions and the
// closing signal likely; before the fix 45 to 51 of 600 such handles ended poisoned.
func TestCloseTakesQueuedCompletionsBeforePoisoning(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const rounds, perRound = 20, 30
	poisoned := 0
	for round := range rounds {
		src, dst := pools(t, uint64(round+1))
		cfg := directConfig()
		cfg.TransferTimeout, cfg.Tuning.QuarantineTimeout = time.Minute, time.Minute
		// Close waits an eighth of CloseTimeout for operations to end before it closes the
		// connections (settleBeforeGoodbye), and these never end: 30 s made each round 3.8 s,
		// 8 s 1 s. 4 s leaves Close's end share (the handles' verdicts after the force close)
		// more than 3 s.
		cfg.CloseTimeout = 4 * time.Second
		cfg.MaxConcurrent = perRound
		p, w := directPair(t, cfg, cfg, src, dst)
		w.fault = mem.Fault{Hang: true} // on the wire until the force close ends it, memory done
		var hrs, hss []*Handle
		for i := range perRound {
			hs, hr := p.start(t, RequestID(i+1), src, dst)
			hss, hrs = append(hss, hs), append(hrs, hr)
		}
		eventually(t, func() bool { return p.net.OnWire() >= perRound }, "every transfer hung on the wire")
		require.NoError(t, p.dst.Close())
		require.NoError(t, p.src.Close())
		for _, h := range append(hrs, hss...) {
			waitClosed(t, h.Done(), "outcome")
			if h.Status().BlocksPoisoned {
				poisoned++
			}
		}
	}
	require.Zero(t, poisoned, "handles of %d poisoned for good although the transport reported every operation done", rounds*perRound*2)
}
