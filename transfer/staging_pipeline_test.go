// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// overlapMover holds every Gather (gather) or Scatter at a gate and closes both once two of
// them are inside at once: the staging pipeline moves chunks on the mover workers, not on the
// transfer's loop one at a time.
type overlapMover struct {
	Mover
	gather  bool
	inside  atomic.Int32
	both    chan struct{}
	once    sync.Once
	release chan struct{}
}

func (m *overlapMover) hold() {
	if m.inside.Add(1) >= 2 {
		m.once.Do(func() { close(m.both) })
	}
	<-m.release
	m.inside.Add(-1)
}

func (m *overlapMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	if m.gather {
		m.hold()
	}
	return m.Mover.Gather(p, off, dst)
}

func (m *overlapMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	if !m.gather {
		m.hold()
	}
	return m.Mover.Scatter(p, src, off)
}

func pipelineConfig() Config {
	c := fastConfig()
	c.Tuning.PipelineDepth = 4
	c.Tuning.NumSlots = 16
	return c
}

// TestStagingPipeline_ChunksMoveConcurrently: two gathers (sender) or two scatters (receiver)
// of one transfer run at once, and every byte arrives.
func TestStagingPipeline_ChunksMoveConcurrently(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs GOMAXPROCS >= 2: the mover workers are as many as the cores allowed")
	}
	for _, gather := range []bool{true, false} {
		name := "scatter"
		if gather {
			name = "gather"
		}
		t.Run(name, func(t *testing.T) {
			p := newPair(t, pipelineConfig(), pipelineConfig())
			src, dst := pools(t, 21)
			m := &overlapMover{gather: gather, both: make(chan struct{}), release: make(chan struct{})}
			var once sync.Once
			let := func() { once.Do(func() { close(m.release) }) }
			t.Cleanup(let) // runs before newPair's cleanup: the engines close with the gate open
			sspec := Spec{ID: 4, Peer: "decode", Plan: src.plan, Pool: src.mem}
			rspec := Spec{ID: 4, Peer: "prefill", Plan: dst.plan, Pool: dst.mem}
			if gather {
				m.Mover, sspec.Mover = newHostMover(src.mem), m
			} else {
				m.Mover, rspec.Mover = newHostMover(dst.mem), m
			}
			hs, err := p.src.Send(bg, sspec)
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, rspec)
			require.NoError(t, err)
			waitClosed(t, m.both, "two copies of one transfer inside the mover at once")
			let()
			waitClosed(t, hr.Done(), "receive done")
			waitClosed(t, hs.Done(), "send done")
			require.NoError(t, hr.Status().Err)
			require.NoError(t, hs.Status().Err)
			require.Equal(t, src.stream(t), dst.stream(t))
		})
	}
}

// TestStagingPipeline_CancelWithChunksInEveryStage cancels a receive while one chunk is in
// the mover (its scatter held), others are posted or on the wire: the abort reaches the
// sender at once, yet the handle does not quiesce and the slot stays leased while the scatter
// runs; once it returns, every slot ends free or poisoned, none leased.
func TestStagingPipeline_CancelWithChunksInEveryStage(t *testing.T) {
	p := newPair(t, pipelineConfig(), pipelineConfig())
	src, dst := pools(t, 22)
	g := newGate(t)
	m := &stuckMover{Mover: newHostMover(dst.mem), gate: g}
	hs, err := p.src.Send(bg, Spec{ID: 5, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 5, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Mover: m})
	require.NoError(t, err)
	waitClosed(t, g.entered, "a scatter held in the mover")
	p.dst.Cancel(5)
	// The receiver's loop handles the cancel while the scatter is held: it tells the sender.
	waitClosed(t, hs.Done(), "the sender heard the receiver's abort")
	require.ErrorIs(t, hs.Status().Err, ErrPeerAborted)
	require.False(t, isClosed(hr.Quiesced()), "quiesced while the mover still held a chunk")
	require.NotZero(t, p.dst.pool.Stats().Leased, "the held chunk's slot went back while the mover had it")
	g.let()
	waitClosed(t, hr.Quiesced(), "receive quiesced once the scatter returned")
	require.ErrorIs(t, hr.Status().Err, ErrCancelled)
	st := p.dst.pool.Stats()
	require.Zero(t, st.Leased)
	require.Equal(t, st.Total, st.Free+st.Poisoned)
}

// failingMover fails its nth copy with an ordinary error (the copy ended).
type failingMover struct {
	Mover
	gather bool
	n      int32
	calls  atomic.Int32
}

var errCopy = errors.New("copy failed")

func (m *failingMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	if m.gather && m.calls.Add(1) == m.n {
		return errCopy
	}
	return m.Mover.Gather(p, off, dst)
}

func (m *failingMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	if !m.gather && m.calls.Add(1) == m.n {
		return errCopy
	}
	return m.Mover.Scatter(p, src, off)
}

// TestStagingPipeline_MoverErrorMidPipeline: a copy that fails with other chunks in flight
// fails the transfer with that error, and every slot goes back.
func TestStagingPipeline_MoverErrorMidPipeline(t *testing.T) {
	for _, gather := range []bool{true, false} {
		name := "scatter"
		if gather {
			name = "gather"
		}
		t.Run(name, func(t *testing.T) {
			p := newPair(t, pipelineConfig(), pipelineConfig())
			src, dst := pools(t, 23)
			m := &failingMover{gather: gather, n: 3}
			sspec := Spec{ID: 6, Peer: "decode", Plan: src.plan, Pool: src.mem}
			rspec := Spec{ID: 6, Peer: "prefill", Plan: dst.plan, Pool: dst.mem}
			h, eng := (*Handle)(nil), p.dst
			if gather {
				m.Mover, sspec.Mover, eng = newHostMover(src.mem), m, p.src
			} else {
				m.Mover, rspec.Mover = newHostMover(dst.mem), m
			}
			hs, err := p.src.Send(bg, sspec)
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, rspec)
			require.NoError(t, err)
			h = hr
			if gather {
				h = hs
			}
			waitClosed(t, h.Quiesced(), "the failed side quiesced")
			require.ErrorIs(t, h.Status().Err, errCopy)
			waitClosed(t, hs.Done(), "send done")
			waitClosed(t, hr.Done(), "receive done")
			st := eng.pool.Stats()
			require.Zero(t, st.Leased)
			require.Zero(t, st.Poisoned)
		})
	}
}

// BenchmarkStagingPipeline is one 4 MiB staging transfer over the in-memory transport: its
// allocations per op (-benchmem) are the pipeline's per-chunk cost times the chunk count.
func BenchmarkStagingPipeline(b *testing.B) {
	d := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	cfg := Config{SlotBytes: 256 << 10, MaxConcurrent: 2, Tuning: tuning.Config{PipelineDepth: 4}}
	p := newPair(b, cfg, cfg)
	src := newKVPool(b, d, layout.BlockMajor, nil, seqBlocks(0, 64), 1)
	dst := newKVPool(b, d, layout.LayerMajor, nil, seqBlocks(0, 64), 0)
	b.SetBytes(src.plan.Bytes())
	b.ReportAllocs()
	for i := range b.N {
		id := RequestID(i + 1)
		hs, err := p.src.Send(bg, Spec{ID: id, Peer: "decode", Plan: src.plan, Pool: src.mem, Mover: newHostMover(src.mem)})
		require.NoError(b, err)
		hr, err := p.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Mover: newHostMover(dst.mem)})
		require.NoError(b, err)
		<-hr.Done()
		<-hs.Done()
		require.NoError(b, hr.Status().Err)
		_ = hs.Release()
		_ = hr.Release()
	}
}

// TestStagingPipeline_TP2To1EveryByte: two senders' halves (heads 0-1 and 2-3, block-major)
// into one layer-major pool over the staging path, the receiver's scatters of both subs on
// the mover workers at once; every byte checked.
func TestStagingPipeline_TP2To1EveryByte(t *testing.T) {
	half := testDims
	half.NumHeads = 2
	cfg := pipelineConfig()
	cfg.Tuning.DisableDirect = true
	n := mem.NewNetwork()
	var senders [2]*Engine
	var srcs [2]*kvPool
	for i := range 2 {
		e, err := New(n.Transport(Peer(fmt.Sprintf("prefill-%d", i))), cfg)
		require.NoError(t, err)
		senders[i] = e
		srcs[i] = newKVPool(t, half, layout.BlockMajor, nil, seqBlocks(1, 12), uint64(30+i))
	}
	recv, err := New(n.Transport("decode"), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, e := range append(senders[:], recv) {
			require.NoError(t, e.Close())
			requireSlotsAccounted(t, e)
		}
	})
	dst := newKVPool(t, testDims, layout.LayerMajor, nil, seqBlocks(20, 12), 0)
	sels := [2]layout.Selection{{LayerEnd: 2, HeadBegin: 0, HeadEnd: 2}, {LayerEnd: 2, HeadBegin: 2, HeadEnd: 4}}
	var subs []SubSpec
	for i, s := range sels {
		plan, err := layout.NewPlan(dst.l, s, dst.plan.Blocks())
		require.NoError(t, err)
		subs = append(subs, SubSpec{Peer: Peer(fmt.Sprintf("prefill-%d", i)), Plan: plan})
	}
	h, err := recv.Receive(bg, Spec{ID: 78, Subs: subs, Pool: dst.mem})
	require.NoError(t, err)
	for i, e := range senders {
		_, err := e.Send(bg, Spec{ID: 78, Peer: "decode", Plan: srcs[i].plan, Pool: srcs[i].mem})
		require.NoError(t, err)
	}
	waitClosed(t, h.Quiesced(), "received")
	require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
	require.Equal(t, PathStaging, h.Path())
	for i, s := range sels {
		plan, err := layout.NewPlan(dst.l, s, dst.plan.Blocks())
		require.NoError(t, err)
		got := make([]byte, plan.Bytes())
		require.NoError(t, layouttest.ReferenceGather(plan, dst.mem, got))
		require.Equal(t, srcs[i].stream(t), got, "half %d", i)
	}
}
