// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// start runs one request between the pair and returns the sending and receiving handles.
func (p *pair) start(t testing.TB, id RequestID, src, dst *kvPool) (hs, hr *Handle) {
	t.Helper()
	hs, err := p.src.Send(bg, Spec{ID: id, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	hr, err = p.dst.Receive(bg, Spec{ID: id, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
	require.NoError(t, err)
	return hs, hr
}

// pools returns a filled source pool and an empty destination pool over 4 blocks: 2 KiB of
// stream, 3 chunks through 1 KiB slots.
func pools(t testing.TB, seed uint64) (src, dst *kvPool) {
	return newKVPool(t, testDims, layout.BlockMajor, nil, blocks(1, 2, 3, 4), seed),
		newKVPool(t, testDims, layout.LayerMajor, nil, blocks(5, 6, 7, 8), 0)
}

func dataOnly(f mem.Fault) func(mem.FaultPoint) mem.Fault {
	return func(fp mem.FaultPoint) mem.Fault {
		if fp.Kind == wire.KindData {
			return f
		}
		return mem.Fault{}
	}
}

func requireState(t testing.TB, h *Handle, want State, errs ...error) {
	t.Helper()
	st := h.Status()
	require.Equal(t, want, st.State, "err: %v", st.Err)
	for _, e := range errs {
		require.ErrorIs(t, st.Err, e)
	}
}

func TestL2_HandleAndSlotsOutliveCallerReferences(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig())
	p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
	src, dst := pools(t, 1)
	hs, hr := p.start(t, 1, src, dst)
	eventually(t, func() bool { return p.net.OnWire() > 0 }, "transfer on the wire")

	// The caller lets go of both handles while the transport holds their slots.
	require.NoError(t, hs.Release())
	require.NoError(t, hr.Release())
	require.ErrorIs(t, hr.Release(), ErrOverReleased)
	require.ErrorIs(t, hr.Retain(), ErrOverReleased)
	// The engine still holds its reference: the id is live, and a second Send is refused.
	_, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.ErrorIs(t, err, ErrDuplicate)
	require.NotZero(t, p.dst.pool.Stats().Leased, "slots stay leased while the transport holds them")

	p.net.SetFault(nil)
	p.net.Resume()
	require.NoError(t, p.src.Drain(bg))
	require.NoError(t, p.dst.Drain(bg))
	requireState(t, hr, Completed)
	require.Equal(t, src.stream(t), dst.stream(t))
	// Every reference is gone now, so the id is free again.
	h2, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	require.Equal(t, CancelledBeforeAdvertise, p.src.Cancel(1))
	require.NoError(t, h2.Retain())
	require.NoError(t, h2.Release())
	require.NoError(t, h2.Release())
	require.ErrorIs(t, h2.Release(), ErrOverReleased)
}

// TestL3_CancelIsObservedByEveryWaiter cancels a transfer in each phase and checks what L3
// promises there: every goroutine waiting on the handle (Done, Quiesced) wakes, the
// transfer's driver ends, every operation it had posted and that had not ended is cancelled
// in the transport, and the peer is told.
func TestL3_CancelIsObservedByEveryWaiter(t *testing.T) {
	type setup func(t *testing.T, p *pair, src, dst *kvPool) (canceller *Engine, h, peer *Handle)
	cases := []struct {
		desc   string
		cfg    func(*Config)
		dcfg   func(*Config) // the receiving engine's, when it differs
		fault  func(mem.FaultPoint) mem.Fault
		setup  setup
		want   CancelOutcome
		final  []State
		resume bool // hung operations end only when the network resumes
	}{
		{desc: "queued receiver: no slot free", cfg: func(c *Config) { c.MaxConcurrent, c.NumSlots, c.PipelineDepth = 1, 1, 1 },
			fault: dataOnly(mem.Fault{Hang: true}),
			setup: func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle, *Handle) {
				p.start(t, 1, src, dst) // holds both engines' only slot, hung
				eventually(t, func() bool { return p.net.OnWire() > 0 }, "the only slots hung")
				h, err := p.dst.Receive(bg, Spec{ID: 7, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				require.NoError(t, err)
				requireState(t, h, Queued)
				return p.dst, h, nil
			}, want: CancelledBeforeAdvertise, final: []State{Cancelled}, resume: true},
		{desc: "queued sender: the request came, no slot free", cfg: func(c *Config) { c.MaxConcurrent, c.NumSlots, c.PipelineDepth = 1, 1, 1 },
			dcfg:  func(c *Config) { c.MaxConcurrent, c.NumSlots, c.PipelineDepth = 2, 2, 1 },
			fault: dataOnly(mem.Fault{Hang: true}),
			setup: func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle, *Handle) {
				// Request 1 holds the sender's only slot; request 7's receiver has a slot of
				// its own (the receiving engine has two) and has asked.
				_, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
				require.NoError(t, err)
				_, err = p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				require.NoError(t, err)
				eventually(t, func() bool { return p.net.OnWire() > 0 }, "request 1 hung")
				hr, err := p.dst.Receive(bg, Spec{ID: 7, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				require.NoError(t, err)
				eventually(t, func() bool { return hr.Status().State == Advertised }, "request 7 asked")
				hs, err := p.src.Send(bg, Spec{ID: 7, Peer: "decode", Plan: src.plan, Pool: src.mem})
				require.NoError(t, err)
				quiet(t, p.net) // the sender holds the request, waiting for a slot
				requireState(t, hs, Queued)
				return p.src, hs, hr
			}, want: CancelledBeforeAdvertise, final: []State{Cancelled}, resume: true},
		{desc: "advertised receiver: its receives posted, no sender",
			setup: func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle, *Handle) {
				h, err := p.dst.Receive(bg, Spec{ID: 7, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				require.NoError(t, err)
				eventually(t, func() bool { return h.Status().State == Advertised }, "advertised")
				quiet(t, p.net)
				return p.dst, h, nil
			}, want: CancelRequestedInFlight, final: []State{Cancelled}},
		{desc: "in flight: a chunk moved, the next hung on the wire",
			fault: func(fp mem.FaultPoint) mem.Fault { return mem.Fault{Hang: fp.Kind == wire.KindData && fp.Tag.Seq == 1} },
			setup: func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle, *Handle) {
				hs, hr := p.start(t, 7, src, dst)
				eventually(t, func() bool { return hr.Status().State == InFlight && p.net.OnWire() > 0 }, "in flight")
				quiet(t, p.net)
				return p.dst, hr, hs
			}, want: CancelRequestedInFlight, final: []State{Cancelled}, resume: true},
		{desc: "in flight, cancelled by the sender",
			fault: func(fp mem.FaultPoint) mem.Fault { return mem.Fault{Hang: fp.Kind == wire.KindData && fp.Tag.Seq == 1} },
			setup: func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle, *Handle) {
				hs, hr := p.start(t, 7, src, dst)
				eventually(t, func() bool { return hs.Status().State == InFlight && p.net.OnWire() > 0 }, "in flight")
				quiet(t, p.net)
				return p.src, hs, hr
			}, want: CancelRequestedInFlight, final: []State{Cancelled}, resume: true},
		{desc: "quarantined: its deadline passed with a chunk hung",
			cfg:   func(c *Config) { c.TransferTimeout = 200 * time.Millisecond },
			fault: dataOnly(mem.Fault{Hang: true}),
			setup: func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle, *Handle) {
				hs, hr := p.start(t, 7, src, dst)
				waitClosed(t, hr.Done(), "quarantined")
				requireState(t, hr, Quarantined, ErrDeadline)
				return p.dst, hr, hs
			}, want: NotCancellable, final: []State{Failed}, resume: true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.QuarantineTimeout = 10 * time.Second // only the transport may end a hung operation
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			dcfg := cfg
			if c.dcfg != nil {
				c.dcfg(&dcfg)
			}
			n := mem.NewNetwork()
			var told sync.Map // sender -> kinds of the control messages it sent
			n.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind != wire.KindData {
					told.Store([2]any{fp.From, fp.Kind}, true)
				}
				if c.fault != nil {
					return c.fault(fp)
				}
				return mem.Fault{}
			})
			rt := map[Peer]*recTransport{"prefill": newRecTransport(n.Transport("prefill")), "decode": newRecTransport(n.Transport("decode"))}
			a, err := New(rt["prefill"], cfg)
			require.NoError(t, err)
			b, err := New(rt["decode"], dcfg)
			require.NoError(t, err)
			p := &pair{net: n, src: a, dst: b}
			t.Cleanup(func() {
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
				requireSlotsAccounted(t, a)
				requireSlotsAccounted(t, b)
			})
			src, dst := pools(t, 4)
			e, h, peer := c.setup(t, p, src, dst)
			me, other := Peer("prefill"), Peer("decode")
			if e == p.dst {
				me, other = other, me
			}

			var woke atomic.Int32
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					ch := h.Done()
					if i%2 == 1 {
						ch = h.Quiesced()
					}
					select {
					case <-ch:
						woke.Add(1)
					case <-time.After(10 * time.Second):
					}
				})
			}
			open := rt[me].open(h.ID()) // operations posted and not ended when the cancel came
			told.Delete([2]any{me, wire.KindAbort})

			require.Equal(t, c.want, e.Cancel(h.ID()))
			if c.want != NotCancellable {
				quiet(t, n) // the driver handled the cancel
				for _, op := range open {
					require.True(t, rt[me].cancelledOrEnded(op), "operation %d was neither cancelled nor ended", op)
				}
			}
			if c.resume {
				n.Resume()
			}
			wg.Wait()
			require.Equal(t, int32(8), woke.Load(), "every waiter must see the cancel")
			eventually(t, func() bool { // the driver's goroutine, the last waiter, ended too
				h.mu.Lock()
				defer h.mu.Unlock()
				return h.exited == len(h.subs)
			}, "the driver ended")
			require.Contains(t, c.final, h.Status().State)
			if c.want == CancelRequestedInFlight || c.want == CancelledBeforeAdvertise {
				require.ErrorIs(t, h.Status().Err, ErrCancelled)
			}
			if c.want == NotCancellable {
				return // the deadline told the peer, not the cancel
			}
			if peer != nil {
				waitClosed(t, peer.Quiesced(), "the peer ended")
				requireState(t, peer, Failed, ErrPeerAborted)
			} else if c.want != CancelledBeforeAdvertise || e == p.src {
				_, ok := told.Load([2]any{me, wire.KindAbort})
				require.True(t, ok, "the peer %s was not told", other)
			}
		})
	}
}

// recTransport records the operations an engine posts, which of them the engine cancelled,
// and which got their final completion.
type recTransport struct {
	*mem.Transport
	mu        sync.Mutex
	byReq     map[RequestID][]OpID
	cancelled map[OpID]bool
	ended     map[OpID]bool
	ids       map[*int]OpID // by a key made per post (a pointer to a zero-size value would not do)
}

func newRecTransport(m *mem.Transport) *recTransport {
	return &recTransport{Transport: m, byReq: map[RequestID][]OpID{}, cancelled: map[OpID]bool{}, ended: map[OpID]bool{}, ids: map[*int]OpID{}}
}

func (r *recTransport) post(tag Tag, done func(Completion), post func(func(Completion)) (OpID, error)) (OpID, error) {
	r.mu.Lock() // held across the post so the callback cannot run before the id is known
	defer r.mu.Unlock()
	ref := new(int)
	id, err := post(func(c Completion) {
		if c.Memory != MemoryBusy {
			r.mu.Lock()
			r.ended[r.ids[ref]] = true
			r.mu.Unlock()
		}
		done(c)
	})
	if err == nil {
		r.ids[ref] = id
		r.byReq[tag.Request] = append(r.byReq[tag.Request], id)
	}
	return id, err
}

func (r *recTransport) PostSend(to Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error) {
	return r.post(tag, done, func(cb func(Completion)) (OpID, error) { return r.Transport.PostSend(to, tag, buf, cb) })
}

func (r *recTransport) PostRecv(from Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error) {
	return r.post(tag, done, func(cb func(Completion)) (OpID, error) { return r.Transport.PostRecv(from, tag, buf, cb) })
}

func (r *recTransport) Cancel(id OpID) {
	r.mu.Lock()
	r.cancelled[id] = true
	r.mu.Unlock()
	r.Transport.Cancel(id)
}

// open lists request id's operations without a final completion yet.
func (r *recTransport) open(id RequestID) []OpID {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ops []OpID
	for _, op := range r.byReq[id] {
		if !r.ended[op] {
			ops = append(ops, op)
		}
	}
	return ops
}

func (r *recTransport) cancelledOrEnded(op OpID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancelled[op] || r.ended[op]
}

func TestL4_StatusNeverBlocksAndBlockingCallsAreBounded(t *testing.T) {
	t.Run("Status answers while the handle's lock is held; Drain honours its context", func(t *testing.T) {
		p := newPair(t, fastConfig(), fastConfig())
		p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
		src, dst := pools(t, 1)
		hs, hr := p.start(t, 1, src, dst)
		eventually(t, func() bool { return p.net.OnWire() > 0 }, "hung on the wire")

		// Status reads atomics only: it answers even while the handle's lock is held.
		hr.mu.Lock()
		returnsAtOnce(t, "Status with the handle's lock held", func() { require.Equal(t, Advertised, hr.Status().State) })
		hr.mu.Unlock()

		// Drain is the only blocking call, and it honours its context.
		ctx, cancel := context.WithTimeout(bg, 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		require.ErrorIs(t, p.dst.Drain(ctx), context.DeadlineExceeded)
		require.Less(t, time.Since(start), 5*time.Second)
		p.net.SetFault(nil)
		p.net.Resume()
		waitClosed(t, hs.Quiesced(), "sender quiesced")
		waitClosed(t, hr.Quiesced(), "receiver quiesced")
	})

	// Cancel, Status, Health and Path must answer while whatever drives the transfer is stuck:
	// each case holds one part stuck, calls them all, and only then lets it go. (A stuck observer
	// made Cancel wait until the observer moved off the handle's lock.)
	t.Run("Cancel returns while the sender's goroutine is stuck gathering", func(t *testing.T) {
		p := newPair(t, fastConfig(), fastConfig())
		src, dst := pools(t, 1)
		m := &stuckMover{Mover: HostMover(src.mem), gate: newGate(t), gather: true}
		hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Mover: m})
		require.NoError(t, err)
		hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		require.NoError(t, err)
		waitClosed(t, m.entered, "the sender gathering its first chunk")
		requireAnswersAtOnce(t, p.src, hs, CancelRequestedInFlight)
		require.False(t, isClosed(hs.Done()), "Cancel waited for the transfer to end")
		m.let()
		waitClosed(t, hs.Quiesced(), "sender quiesced")
		waitClosed(t, hr.Quiesced(), "receiver quiesced")
		requireState(t, hs, Cancelled, ErrCancelled)
		requireState(t, hr, Failed, ErrPeerAborted)
	})
	t.Run("Cancel returns while the receiver's goroutine is stuck scattering", func(t *testing.T) {
		p := newPair(t, fastConfig(), fastConfig())
		src, dst := pools(t, 1)
		m := &stuckMover{Mover: HostMover(dst.mem), gate: newGate(t)}
		hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
		require.NoError(t, err)
		hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Mover: m})
		require.NoError(t, err)
		waitClosed(t, m.entered, "the receiver scattering its first chunk")
		requireAnswersAtOnce(t, p.dst, hr, CancelRequestedInFlight)
		require.False(t, isClosed(hr.Done()), "Cancel waited for the transfer to end")
		m.let()
		waitClosed(t, hr.Quiesced(), "receiver quiesced")
		waitClosed(t, hs.Quiesced(), "sender quiesced")
		require.Contains(t, []State{Cancelled, Completed}, hr.Status().State) // the last chunk may win
	})
	t.Run("Cancel returns while the transport's Cancel is stuck", func(t *testing.T) {
		n := mem.NewNetwork()
		n.SetFault(dataOnly(mem.Fault{Hang: true}))
		cfg := fastConfig()
		a, err := New(n.Transport("prefill"), cfg)
		require.NoError(t, err)
		var b *Engine
		t.Cleanup(func() {
			require.NoError(t, a.Close())
			require.NoError(t, b.Close())
		})
		st := &stuckCancel{Transport: n.Transport("decode"), gate: newGate(t)}
		b, err = New(st, cfg)
		require.NoError(t, err)
		p := &pair{net: n, src: a, dst: b}
		src, dst := pools(t, 1)
		hs, hr := p.start(t, 1, src, dst)
		eventually(t, func() bool { return n.OnWire() > 0 }, "hung on the wire")
		returnsAtOnce(t, "the first Cancel", func() { require.Equal(t, CancelRequestedInFlight, b.Cancel(1)) })
		waitClosed(t, st.entered, "the receiver cancelling its operations in the transport")
		requireAnswersAtOnce(t, b, hr, CancelRequestedInFlight)
		st.let()
		n.Resume()
		waitClosed(t, hr.Quiesced(), "receiver quiesced")
		waitClosed(t, hs.Quiesced(), "sender quiesced")
		requireState(t, hr, Cancelled, ErrCancelled)
	})
	t.Run("Cancel returns while the observer is stuck in a transition", func(t *testing.T) {
		obs := &stuckObserver{gate: &gate{entered: make(chan struct{}), release: make(chan struct{})}}
		cfg := fastConfig()
		cfg.Observer = obs
		p := newPair(t, fastConfig(), cfg)
		t.Cleanup(obs.let) // before the engines close
		_, dst := pools(t, 1)
		hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem}) // no sender: it stays advertised
		require.NoError(t, err)
		waitClosed(t, obs.entered, "the observer hearing the receiver's advertise")
		requireAnswersAtOnce(t, p.dst, hr, CancelRequestedInFlight)
		obs.let()
		waitClosed(t, hr.Quiesced(), "receiver quiesced")
		requireState(t, hr, Cancelled, ErrCancelled)
	})
	t.Run("Send and Receive return at once with every slot taken", func(t *testing.T) {
		cfg := fastConfig()
		cfg.MaxConcurrent, cfg.NumSlots, cfg.PipelineDepth = 1, 1, 1
		p := newPair(t, cfg, cfg)
		p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
		src, dst := pools(t, 1)
		hs, hr := p.start(t, 1, src, dst)
		eventually(t, func() bool { return p.net.OnWire() > 0 }, "the only slots hung on the wire")
		var h2, h3 *Handle
		returnsAtOnce(t, "Receive with no slot free", func() {
			var err error
			h2, err = p.dst.Receive(bg, Spec{ID: 2, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
		})
		returnsAtOnce(t, "Send with no slot free", func() {
			var err error
			h3, err = p.src.Send(bg, Spec{ID: 3, Peer: "decode", Plan: src.plan, Pool: src.mem})
			require.NoError(t, err)
		})
		requireState(t, h2, Queued)
		require.Equal(t, CancelledBeforeAdvertise, p.dst.Cancel(2))
		require.Equal(t, CancelledBeforeAdvertise, p.src.Cancel(3))
		p.net.SetFault(nil)
		p.net.Resume()
		for _, h := range []*Handle{hs, hr, h2, h3} {
			waitClosed(t, h.Quiesced(), "quiesced")
		}
	})
}

// returnsAtOnce fails the test if f has not returned within 5 s. The callers hold whatever f
// might wrongly wait on until after this returns, so a call that waits never returns here:
// the bound only decides how long a failure takes to show.
func returnsAtOnce(t testing.TB, what string, f func()) {
	t.Helper()
	if !callReturns(f) {
		t.Fatalf("%s blocked", what)
	}
}

func callReturns(f func()) bool {
	ret := make(chan struct{})
	go func() {
		defer close(ret)
		f()
	}()
	select {
	case <-ret:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

func requireAnswersAtOnce(t testing.TB, e *Engine, h *Handle, want CancelOutcome) {
	t.Helper()
	var got CancelOutcome
	returnsAtOnce(t, "Status, Path, Health and Cancel", func() {
		_ = h.Status()
		_ = h.Path()
		_ = e.Health()
		got = e.Cancel(h.ID())
	})
	require.Equal(t, want, got)
}

// gate holds the first caller of stick until let; entered closes when it arrives.
type gate struct {
	once, letOnce sync.Once
	entered       chan struct{}
	release       chan struct{}
}

func newGate(t testing.TB) *gate {
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(g.let) // before the engines close, also when the test failed
	return g
}

func (g *gate) stick() {
	g.once.Do(func() {
		close(g.entered)
		<-g.release
	})
}

func (g *gate) let() { g.letOnce.Do(func() { close(g.release) }) }

// stuckMover is a Mover whose first Gather (gather) or Scatter blocks at its gate.
type stuckMover struct {
	Mover
	*gate
	gather bool
}

func (m *stuckMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	if m.gather {
		m.stick()
	}
	return m.Mover.Gather(p, off, dst)
}

func (m *stuckMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	if !m.gather {
		m.stick()
	}
	return m.Mover.Scatter(p, src, off)
}

// stuckCancel is a transport whose first Cancel blocks at its gate, as a transport that
// waits on its worker would.
type stuckCancel struct {
	*mem.Transport
	*gate
}

func (s *stuckCancel) Cancel(id OpID) {
	s.stick()
	s.Transport.Cancel(id)
}

// stuckObserver blocks, at its gate, when it hears the first advertise of a sub-transfer.
type stuckObserver struct {
	NopObserver
	*gate
}

func (o *stuckObserver) OnTransition(id RequestID, sub int, from, to State, ev Event) {
	if sub >= 0 && ev == EvAdvertise {
		o.stick()
	}
}

// TestL5_EverySlotLeaseEndsInReleaseOrPoison runs transfers under random faults and cancels.
// The pool's own counters move in pairs under one lock, so their sum proves little; the test
// checks L5 from outside instead: a ledger in the transport sees every staging slot handed to
// the wire and flags a slot posted while an earlier operation on it is still live (a lease
// ended before the transport let go) or posted after it was poisoned; a sampler reads the
// pools' public Stats while the transfers churn (the sum, and poisoned slots never coming
// back); and at the end every slot the pool calls free can be leased, once, and none of them
// is a poisoned one.
func TestL5_EverySlotLeaseEndsInReleaseOrPoison(t *testing.T) {
	t.Run("under random faults and cancels", testSlotsUnderChurn)
	t.Run("the ledger catches a lease that ends while the transport holds the slot", func(t *testing.T) {
		// A deliberately wrong pool user: it releases its slot with a receive still posted
		// in it, and the next lease of that slot posts again.
		n := mem.NewNetwork()
		mem := make([]byte, 1024)
		pool, err := buffer.New(mem, buffer.Config{SlotBytes: 1024})
		require.NoError(t, err)
		tr := newSlotLedger(n.Transport("decode"), mem, 1024)
		tr.pool = pool
		peer := n.Transport("prefill")
		t.Cleanup(func() {
			require.NoError(t, tr.Close(true))
			require.NoError(t, peer.Close(true))
		})
		for seq := range 2 {
			s, err := pool.Lease(bg)
			require.NoError(t, err)
			_, err = tr.PostRecv("prefill", Tag{Request: 1, Seq: uint32(seq)}, s.Bytes(), func(Completion) {})
			require.NoError(t, err)
			require.NoError(t, s.Release()) // wrong: the receive may still write the slot
		}
		require.Len(t, tr.findings(), 1)
		require.Contains(t, tr.findings()[0], "slot 0 posted while request 1 chunk 0 still holds it")
	})
}

func testSlotsUnderChurn(t *testing.T) {
	cfg := fastConfig()
	cfg.TransferTimeout = 150 * time.Millisecond
	cfg.QueueTimeout = 300 * time.Millisecond
	cfg.QuarantineTimeout = 100 * time.Millisecond
	cfg.MaxConcurrent, cfg.NumSlots = 4, 6
	n := mem.NewNetwork()
	var ledgers []*slotLedger
	var engines []*Engine
	for _, name := range []Peer{"prefill", "decode"} {
		c := cfg
		c.StagingMemory = make([]byte, int64(c.NumSlots)*c.SlotBytes)
		l := newSlotLedger(n.Transport(name), c.StagingMemory, c.SlotBytes)
		e, err := New(l, c)
		require.NoError(t, err)
		l.pool = e.pool
		ledgers, engines = append(ledgers, l), append(engines, e)
	}
	p := &pair{net: n, src: engines[0], dst: engines[1]}
	t.Cleanup(func() {
		require.NoError(t, p.src.Close())
		require.NoError(t, p.dst.Close())
		requireSlotsAccounted(t, p.src)
		requireSlotsAccounted(t, p.dst)
	})
	r := rand.New(rand.NewPCG(5, 5))
	var fmu sync.Mutex
	faults := map[RequestID]mem.Fault{}
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		fmu.Lock()
		defer fmu.Unlock()
		f := faults[fp.Tag.Request]
		if fp.Kind != wire.KindData {
			return mem.Fault{Drop: f.Drop, Duplicate: f.Duplicate}
		}
		return f
	})
	choices := []mem.Fault{{}, {}, {Delay: 5 * time.Millisecond}, {FailAfter: 50}, {Hang: true}, {Hang: true, NeverQuiesce: true},
		{Delay: 300 * time.Millisecond, IgnoreCancel: true}, {Duplicate: true}}

	// The sampler reads what a caller can: each pool's public Stats.
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	var bad atomic.Value
	var samples atomic.Int64
	sampler.Go(func() {
		maxPoisoned := make([]int, len(engines))
		for {
			select {
			case <-stop:
				return
			default:
			}
			for i, e := range engines {
				s := e.pool.Stats()
				switch {
				case s.Free+s.Leased+s.Poisoned != s.Total || s.Free < 0 || s.Leased < 0:
					bad.Store(fmt.Sprintf("inconsistent %+v", s))
				case s.Poisoned < maxPoisoned[i]:
					bad.Store(fmt.Sprintf("a poisoned slot came back: %d poisoned after %d", s.Poisoned, maxPoisoned[i]))
				}
				maxPoisoned[i] = max(maxPoisoned[i], s.Poisoned)
			}
			samples.Add(1)
			runtime.Gosched()
		}
	})

	var hs []*Handle
	src, dst := pools(t, 3)
	for i := range 40 {
		id := RequestID(1000 + i)
		fmu.Lock()
		faults[id] = choices[r.IntN(len(choices))]
		fmu.Unlock()
		a, b := p.start(t, id, src, newKVPool(t, testDims, layout.LayerMajor, nil, dst.plan.Blocks(), 0))
		hs = append(hs, a, b)
		if r.IntN(4) == 0 {
			if r.IntN(2) == 0 {
				eventually(t, func() bool { return b.Status().State != Queued || isClosed(b.Done()) }, "started")
			}
			e := p.src
			if r.IntN(2) == 0 {
				e = p.dst
			}
			e.Cancel(id)
		}
		if i%10 == 9 {
			p.net.Resume()
		}
	}
	ctx, cancel := context.WithTimeout(bg, 20*time.Second)
	defer cancel()
	for {
		p.net.Resume()
		if p.src.liveDrivers.Load() == 0 && p.dst.liveDrivers.Load() == 0 {
			break
		}
		require.NoError(t, ctx.Err(), "transfers did not all end")
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	sampler.Wait()
	require.Nil(t, bad.Load())
	require.Greater(t, samples.Load(), int64(10))
	for _, l := range ledgers {
		require.Empty(t, l.findings())
	}
	for _, h := range hs {
		require.True(t, isClosed(h.Done()) && isClosed(h.Quiesced()), "request %d", h.ID())
		require.True(t, h.Status().State.Terminal())
	}
	poisoned := 0
	for _, e := range engines {
		requireEveryFreeSlotLeasable(t, e.pool)
		poisoned += e.pool.Stats().Poisoned
	}
	t.Logf("%d slots poisoned, %d samples", poisoned, samples.Load())
}

// requireEveryFreeSlotLeasable leases every slot the pool calls free: each comes once, none
// is poisoned, and then none is left; it hands them back.
func requireEveryFreeSlotLeasable(t testing.TB, pool *buffer.Pool) {
	t.Helper()
	st := pool.Stats()
	require.Zero(t, st.Leased, "a lease outlived every transfer")
	bad := map[int]bool{}
	for _, rec := range pool.Poisoned() {
		require.False(t, bad[rec.Slot], "slot %d poisoned twice", rec.Slot)
		bad[rec.Slot] = true
	}
	require.Len(t, bad, st.Poisoned)
	var got []*buffer.Slot
	seen := map[int]bool{}
	for {
		s, err := pool.TryLease()
		if err != nil {
			require.ErrorIs(t, err, buffer.ErrNoSlot)
			break
		}
		require.False(t, seen[s.Index()], "slot %d leased twice at once", s.Index())
		require.False(t, bad[s.Index()], "poisoned slot %d leased again", s.Index())
		seen[s.Index()] = true
		got = append(got, s)
		require.LessOrEqual(t, len(got), st.Total, "more slots leased than the pool has")
	}
	require.Len(t, got, st.Free, "the pool said %d free", st.Free)
	for _, s := range got {
		require.NoError(t, s.Release())
	}
}

// slotLedger wraps a transport and keeps, per staging slot, the operation the transport
// holds in it, from its post to its final completion. Posting into a slot that still holds a
// live operation (its lease ended too early and it was leased again) or into a poisoned
// slot is a finding.
type slotLedger struct {
	Transport
	base, size, slotBytes uintptr
	pool                  *buffer.Pool // set before the first post

	mu       sync.Mutex
	live     map[int]Tag // slot -> the operation the transport holds in it
	problems []string
}

func newSlotLedger(tr Transport, staging []byte, slotBytes int64) *slotLedger {
	return &slotLedger{Transport: tr, base: uintptr(unsafe.Pointer(unsafe.SliceData(staging))), size: uintptr(len(staging)),
		slotBytes: uintptr(slotBytes), live: map[int]Tag{}}
}

func (l *slotLedger) post(tag Tag, buf []byte, done func(Completion), post func(func(Completion)) (OpID, error)) (OpID, error) {
	at := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if at < l.base || at >= l.base+l.size {
		return post(done) // a direct operation: not a slot
	}
	slot := int((at - l.base) / l.slotBytes)
	l.mu.Lock()
	defer l.mu.Unlock() // held across the post so the completion is recorded after it
	if old, ok := l.live[slot]; ok {
		l.problems = append(l.problems, fmt.Sprintf("slot %d posted while request %d chunk %d still holds it (request %d chunk %d)",
			slot, old.Request, old.Seq, tag.Request, tag.Seq))
	}
	for _, rec := range l.pool.Poisoned() {
		if rec.Slot == slot {
			l.problems = append(l.problems, fmt.Sprintf("slot %d posted after it was poisoned (request %d chunk %d)", slot, tag.Request, tag.Seq))
		}
	}
	id, err := post(func(c Completion) {
		if c.Memory == MemoryDone { // MemoryUnknown: the slot is poisoned and keeps its op
			l.mu.Lock()
			if l.live[slot] == tag {
				delete(l.live, slot)
			}
			l.mu.Unlock()
		}
		done(c)
	})
	if err == nil {
		l.live[slot] = tag
	}
	return id, err
}

func (l *slotLedger) PostSend(to Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error) {
	return l.post(tag, buf, done, func(cb func(Completion)) (OpID, error) { return l.Transport.PostSend(to, tag, buf, cb) })
}

func (l *slotLedger) PostRecv(from Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error) {
	return l.post(tag, buf, done, func(cb func(Completion)) (OpID, error) { return l.Transport.PostRecv(from, tag, buf, cb) })
}

func (l *slotLedger) findings() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.problems...)
}

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
		{"direct IOV messages", func() Config { c := directConfig(); c.DisableRMA = true; return c }, true, pools,
			[]string{"IOV send", "IOV receive"}, PathDirect},
		{"RMA gets", rmaConfig, true, rmaPools, []string{"get"}, PathRMA},
	}
	for _, pc := range paths {
		t.Run(pc.name, func(t *testing.T) {
			cfg := pc.cfg()
			cfg.TransferTimeout = 150 * time.Millisecond
			cfg.QuarantineTimeout = 5 * time.Second // Close, not the timer, must end the hung ones
			cfg.QueueTimeout = 300 * time.Millisecond
			n := mem.NewNetwork()
			mt := map[Peer]*mem.Transport{"prefill": n.Transport("prefill"), "decode": n.Transport("decode")}
			led := map[Peer]*opLedger{"prefill": newOpLedger(mt["prefill"]), "decode": newOpLedger(mt["decode"])}
			a, err := New(led["prefill"], cfg)
			require.NoError(t, err)
			b, err := New(led["decode"], cfg)
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
		cfg.RetryInterval = time.Millisecond
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
			cfg.TransferTimeout = 300 * time.Millisecond
			cfg.QuarantineTimeout = 100 * time.Millisecond
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
	cfg.QuarantineTimeout = 50 * time.Millisecond
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
	cfg.QuarantineTimeout = 10 * time.Second
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
	require.Equal(t, int64(1), p.dst.Health().Quarantined)

	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hr, Failed, ErrDeadline)
	requireState(t, hs, Failed, ErrPeerAborted)
	require.Zero(t, p.dst.pool.Stats().Poisoned, "proven done: released, not poisoned")
	require.Zero(t, p.dst.Health().Quarantined)
	require.Equal(t, make([]byte, dst.plan.Bytes()), dst.stream(t), "the engine wrote caller memory after giving up")
}

func TestL11_NoWaitWithoutABound(t *testing.T) {
	cfg := fastConfig()
	cfg.QueueTimeout = 50 * time.Millisecond
	cfg.TransferTimeout = 50 * time.Millisecond
	cfg.MaxConcurrent, cfg.NumSlots, cfg.PipelineDepth = 1, 1, 1
	p := newPair(t, cfg, cfg)
	src, dst := pools(t, 1)

	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 2, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
	require.NoError(t, err)
	// The only slot is taken by request 2, so request 3 waits in the queue, bounded too.
	eventually(t, func() bool { return hr.Status().State == Advertised }, "request 2 holds the slot")
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
		require.Less(t, time.Since(start), cfg.ProgressDeadline+time.Second)
		h := p.dst.Health()
		require.Contains(t, h.Reason, "no transfer progressed")
		require.Equal(t, int64(1), h.InFlight)
		require.Greater(t, h.SinceProgress, cfg.ProgressDeadline)

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
		for id := RequestID(1); !unhealthy && time.Since(start) < 2*time.Second; id++ {
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
		cfg.MaxConcurrent, cfg.NumSlots = 4, 8
		cfg.ProgressDeadline = 150 * time.Millisecond
		cfg.TransferTimeout = 10 * time.Second
		p := newPair(t, cfg, cfg)
		p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
		src, dst := pools(t, 1)
		hs, hr := p.start(t, 1, src, dst)
		eventually(t, func() bool { return hr.Status().State == Advertised || hr.Status().State == InFlight }, "stuck transfer advertised")
		start := time.Now()
		unhealthy := false
		for id := RequestID(100); time.Since(start) < cfg.ProgressDeadline+time.Second && !unhealthy; id++ {
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
		cfg.QuarantineBudget = None // zero would take the default
		cfg.TransferTimeout = 300 * time.Millisecond
		cfg.QuarantineTimeout = 10 * time.Second
		p := newPair(t, cfg, cfg)
		p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
		src, dst := pools(t, 1)
		_, h1 := p.start(t, 1, src, dst)
		waitClosed(t, h1.Done(), "quarantined")
		h := p.dst.Health()
		require.False(t, h.Healthy)
		require.Zero(t, h.QuarantineBudget)
		require.Contains(t, h.Reason, "1 transfers quarantined, over the budget of 0")
		p.net.Resume()
		waitClosed(t, h1.Quiesced(), "resolved")
		require.True(t, p.dst.Health().Healthy, p.dst.Health().Reason)
	})
	t.Run("poisoned slots leave too few", func(t *testing.T) {
		cfg := fastConfig()
		cfg.MaxConcurrent, cfg.NumSlots = 2, 2
		cfg.TransferTimeout = 300 * time.Millisecond
		cfg.QuarantineTimeout = 30 * time.Millisecond
		p := newPair(t, cfg, cfg)
		p.net.SetFault(dataOnly(mem.Fault{Hang: true, NeverQuiesce: true}))
		src, dst := pools(t, 1)
		_, hr := p.start(t, 1, src, dst)
		waitClosed(t, hr.Quiesced(), "poisoned")
		h := p.dst.Health()
		require.False(t, h.Healthy)
		require.Contains(t, h.Reason, "staging slots poisoned")
		require.Equal(t, 2, h.PoisonedSlots)
	})
}

func TestL13_PoolBelowConcurrencyIsRefused(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxConcurrent, cfg.NumSlots = 8, 5
	tr := mem.NewNetwork().Transport("x")
	defer func() { require.NoError(t, tr.Close(true)) }() // a failed New leaves the transport with its caller
	_, err := New(tr, cfg)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorIs(t, err, buffer.ErrUndersized)
	require.Contains(t, err.Error(), "needs at least 8 slots")
}

// activeSubs counts an engine's sub-transfers past Queued and not yet ended, and the most it
// ever saw at once.
type activeSubs struct {
	NopObserver
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
			cfg.MaxConcurrent, cfg.NumSlots, cfg.PipelineDepth = maxConc, 8, 1
			cfg.DirectChunkBytes = 512
			cfg.DisableDirect = !direct
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
	cfg.MaxConcurrent, cfg.NumSlots = 1, 2
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
	require.NoError(t, HostMover(src.mem).Gather(src.plan, 0, want)) // checked against the reference in TestHostMoverMatchesReference
	require.NoError(t, HostMover(dst.mem).Gather(dst.plan, 0, got))
	require.True(t, bytes.Equal(want, got), "the streamed request arrived corrupted")
}

// TestL14_MultiPeerRequestIsTerminalOnlyWhenEverySubIs has a TP=1 decode rank receive its four
// heads from two TP=2 prefill ranks, two heads each.
func TestL14_MultiPeerRequestIsTerminalOnlyWhenEverySubIs(t *testing.T) {
	half := testDims
	half.NumHeads = 2
	setup := func(t *testing.T, obs Observer) (*mem.Network, [2]*Engine, *Engine, [2]*kvPool, *kvPool, [2]layout.Selection) {
		cfg := fastConfig()
		cfg.CancelGrace = 50 * time.Millisecond
		cfg.QuarantineTimeout = 10 * time.Second
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
			require.NoError(t, layout.ReferenceGather(plan, dst.mem, got))
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
	NopObserver
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

func TestCancelInEachStateGivesItsOutcomeAndMemoryRule(t *testing.T) {
	type setup func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle)
	cases := []struct {
		desc     string
		cfg      func(*Config)
		setup    setup
		want     CancelOutcome
		final    State
		freeNow  bool
		finalErr error
	}{
		{"unknown id", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) { return p.dst, nil },
			NotFound, 0, true, nil},
		{"queued sender, no request yet", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			h, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
			require.NoError(t, err)
			return p.src, h
		}, CancelledBeforeAdvertise, Cancelled, true, ErrCancelled},
		{"advertised receiver", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			h, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			eventually(t, func() bool { return h.Status().State == Advertised }, "advertised")
			return p.dst, h
		}, CancelRequestedInFlight, Cancelled, false, ErrCancelled},
		{"in flight, chunk on the wire", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind == wire.KindData && fp.Tag.Seq == 1 {
					return mem.Fault{Delay: 100 * time.Millisecond}
				}
				return mem.Fault{}
			})
			_, h := p.start(t, 1, src, dst)
			eventually(t, func() bool { return h.Status().State == InFlight }, "in flight")
			return p.dst, h
		}, CancelRequestedInFlight, Failed, false, nil}, // quarantined for CancelGrace, then resolved
		{"completed", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			_, h := p.start(t, 1, src, dst)
			waitClosed(t, h.Quiesced(), "completed")
			return p.dst, h
		}, AlreadyComplete, Completed, true, nil},
		{"quarantined", nil, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
			_, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem})
			require.NoError(t, err)
			h, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Timeout: 300 * time.Millisecond})
			require.NoError(t, err)
			waitClosed(t, h.Done(), "quarantined")
			return p.dst, h
		}, NotCancellable, Failed, false, ErrDeadline},
		{"backend unhealthy", func(c *Config) { c.ProgressDeadline = 20 * time.Millisecond }, func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle) {
			p.net.SetFault(dataOnly(mem.Fault{Hang: true}))
			_, h := p.start(t, 1, src, dst)
			eventually(t, func() bool { return !p.dst.Health().Healthy }, "unhealthy")
			return p.dst, h
		}, BackendUnhealthy, Cancelled, false, ErrCancelled},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.CancelGrace = 10 * time.Millisecond
			cfg.QuarantineTimeout = 200 * time.Millisecond
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			p := newPair(t, cfg, cfg)
			src, dst := pools(t, 4)
			e, h := c.setup(t, p, src, dst)
			got := e.Cancel(1)
			require.Equal(t, c.want, got)
			require.Equal(t, c.freeNow, got.FreeNow())
			if h == nil {
				return
			}
			if got.FreeNow() {
				require.True(t, isClosed(h.Quiesced()), "%v must leave the memory quiescent on return", got)
			}
			p.net.Resume()
			waitClosed(t, h.Quiesced(), "quiesced")
			if c.final == Failed && c.finalErr == nil { // cancel raced the last chunk or the wire
				s := h.Status().State
				require.True(t, s == Cancelled || s == Completed || s == Failed, "%v", s)
			} else {
				requireState(t, h, c.final)
				if c.finalErr != nil {
					require.ErrorIs(t, h.Status().Err, c.finalErr)
				}
			}
			require.Equal(t, map[bool]CancelOutcome{true: AlreadyComplete, false: NotFound}[true], e.Cancel(1))
		})
	}
}

func TestBadInputGivesTypedErrors(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig())
	src, dst := pools(t, 1)
	other := newKVPool(t, testDims, layout.BlockMajor, nil, blocks(1, 2, 3), 1)
	cases := []struct {
		desc    string
		receive bool
		spec    Spec
		want    error
		field   string
	}{
		{"nil plan", false, Spec{ID: 1, Peer: "decode", Pool: src.mem}, ErrInvalidSpec, "Plan"},
		{"empty peer", false, Spec{ID: 1, Plan: src.plan, Pool: src.mem}, ErrInvalidSpec, "Plan.Peer"},
		{"pool smaller than the layout", false, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem[:10]}, layout.ErrBufferTooSmall, "Pool"},
		{"negative timeout", true, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Timeout: -1}, ErrInvalidSpec, "Timeout"},
		{"subs on a send", false, Spec{ID: 1, Subs: []SubSpec{{Peer: "decode", Plan: src.plan}}, Pool: src.mem}, ErrInvalidSpec, "Subs"},
		{"subs and peer", true, Spec{ID: 1, Peer: "x", Subs: []SubSpec{{Peer: "prefill", Plan: dst.plan}}, Pool: dst.mem}, ErrInvalidSpec, "Subs"},
		{"one peer twice", true, Spec{ID: 1, Subs: []SubSpec{{Peer: "a", Plan: dst.plan}, {Peer: "a", Plan: dst.plan}}, Pool: dst.mem}, ErrInvalidSpec, "Subs[1].Peer"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			var err error
			if c.receive {
				_, err = p.dst.Receive(bg, c.spec)
			} else {
				_, err = p.src.Send(bg, c.spec)
			}
			require.ErrorIs(t, err, c.want)
			require.ErrorIs(t, err, ErrInvalidSpec)
			var se *SpecError
			require.ErrorAs(t, err, &se)
			require.Equal(t, c.field, se.Field)
		})
	}

	t.Run("receiver layout the sender cannot produce", func(t *testing.T) {
		hs, err := p.src.Send(bg, Spec{ID: 50, Peer: "decode", Plan: other.plan, Pool: other.mem})
		require.NoError(t, err)
		hr, err := p.dst.Receive(bg, Spec{ID: 50, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		require.NoError(t, err)
		waitClosed(t, hs.Quiesced(), "sender")
		waitClosed(t, hr.Quiesced(), "receiver")
		requireState(t, hs, Failed, ErrIncompatible, layout.ErrIncompatible)
		requireState(t, hr, Failed, ErrIncompatible, ErrPeerAborted)
		require.Contains(t, hr.Status().Err.Error(), "Blocks = 4: receiver has 4, sender has 3")
	})

	t.Run("malformed control messages are counted and dropped", func(t *testing.T) {
		tr := p.net.Transport("vandal")
		require.NoError(t, tr.Bind(inbound{p.dst}))
		require.NoError(t, tr.SendControl("decode", []byte("not a message at all")))
		eventually(t, func() bool { return p.dst.Health().MalformedControl == 1 }, "counted")
		require.NoError(t, tr.Close(true))
	})

	t.Run("calls after Close", func(t *testing.T) {
		n := mem.NewNetwork()
		e, err := New(n.Transport("solo"), fastConfig())
		require.NoError(t, err)
		h, err := e.Send(bg, Spec{ID: 3, Peer: "nobody", Plan: src.plan, Pool: src.mem})
		require.NoError(t, err)
		require.NoError(t, e.Close())
		require.NoError(t, e.Close(), "Close is idempotent")
		_, err = e.Send(bg, Spec{ID: 4, Peer: "nobody", Plan: src.plan, Pool: src.mem})
		require.ErrorIs(t, err, ErrClosed)
		_, err = e.Receive(bg, Spec{ID: 4, Peer: "nobody", Plan: src.plan, Pool: src.mem})
		require.ErrorIs(t, err, ErrClosed)
		requireState(t, h, Failed, ErrClosed)
		require.Equal(t, AlreadyComplete, e.Cancel(3))
		require.False(t, e.Health().Healthy)
		require.Contains(t, e.Health().Reason, "closed")
		require.NoError(t, e.Drain(bg))
		require.NoError(t, h.Release())
		require.ErrorIs(t, h.Release(), ErrOverReleased)
	})
}

func TestFaultsEndEveryTransferCleanly(t *testing.T) {
	cases := []struct {
		desc   string
		fault  func(mem.FaultPoint) mem.Fault
		lose   bool
		state  State
		errs   []error
		sender []error
	}{
		{"first request-info dropped, retry recovers", dropFirst(wire.KindRequestInfo), false, Completed, nil, nil},
		{"done message dropped: sender fails at its deadline, memory quiescent", dropAll(wire.KindDone), false, Completed, nil, []error{ErrDeadline}},
		{"chunks delayed", dataOnly(mem.Fault{Delay: 5 * time.Millisecond}), false, Completed, nil, nil},
		{"chunk fails after 100 bytes", dataOnly(mem.Fault{FailAfter: 100}), false, Failed, []error{mem.ErrInjected}, []error{mem.ErrInjected}},
		{"peer lost mid-transfer", dataOnly(mem.Fault{Hang: true}), true, Failed, []error{ErrPeerLost}, []error{ErrPeerLost}},
		{"chunk completes late, after the deadline", dataOnly(mem.Fault{Delay: 600 * time.Millisecond, IgnoreCancel: true}), false, Failed, []error{ErrDeadline}, nil},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.TransferTimeout = 300 * time.Millisecond
			cfg.QuarantineTimeout = 5 * time.Second
			p := newPair(t, cfg, cfg)
			p.net.SetFault(c.fault)
			src, dst := pools(t, 1)
			hs, hr := p.start(t, 1, src, dst)
			if c.lose {
				eventually(t, func() bool { return p.net.OnWire() > 0 }, "on the wire")
				p.net.LosePeer("decode")
			}
			waitClosed(t, hr.Quiesced(), "receiver")
			waitClosed(t, hs.Quiesced(), "sender")
			requireState(t, hr, c.state, c.errs...)
			if c.state == Completed {
				require.Equal(t, src.stream(t), dst.stream(t))
			}
			if c.sender != nil {
				requireState(t, hs, Failed, c.sender...)
			}
			require.Zero(t, p.src.pool.Stats().Poisoned+p.dst.pool.Stats().Poisoned, "every failure here is provably quiescent")
		})
	}
}

func dropFirst(k wire.Kind) func(mem.FaultPoint) mem.Fault {
	var dropped atomic.Bool
	return func(fp mem.FaultPoint) mem.Fault {
		if fp.Kind == k && dropped.CompareAndSwap(false, true) {
			return mem.Fault{Drop: true}
		}
		return mem.Fault{}
	}
}

func dropAll(k wire.Kind) func(mem.FaultPoint) mem.Fault {
	return func(fp mem.FaultPoint) mem.Fault { return mem.Fault{Drop: fp.Kind == k} }
}

func TestConfigIsValidatedOnceWithTheFieldNamed(t *testing.T) {
	cases := []struct {
		desc  string
		mut   func(*Config)
		field string
	}{
		{"slot no larger than the header", func(c *Config) { c.SlotBytes = DataHeaderBytes }, "SlotBytes"},
		{"negative concurrency", func(c *Config) { c.MaxConcurrent = -1 }, "MaxConcurrent"},
		{"negative depth", func(c *Config) { c.PipelineDepth = -2 }, "PipelineDepth"},
		{"negative quarantine budget", func(c *Config) { c.QuarantineBudget = -2 }, "QuarantineBudget"},
		{"negative poisoned-block budget", func(c *Config) { c.PoisonedBlockBudget = -3 }, "PoisonedBlockBudget"},
		{"negative retries", func(c *Config) { c.MaxRetries = -2 }, "MaxRetries"},
		{"negative deadline", func(c *Config) { c.ProgressDeadline = -time.Second }, "ProgressDeadline"},
		{"staging memory too small", func(c *Config) { c.StagingMemory = make([]byte, 100); c.NumSlots = 4 }, "StagingMemory"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			c.mut(&cfg)
			tr := mem.NewNetwork().Transport("x")
			defer func() { require.NoError(t, tr.Close(true)) }()
			_, err := New(tr, cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, c.field, ce.Field)
		})
	}
	_, err := New(nil, Config{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	z := Config{QuarantineBudget: None, PoisonedBlockBudget: None, MaxRetries: None}.withDefaults()
	require.Zero(t, z.QuarantineBudget, "None sets zero")
	require.Zero(t, z.PoisonedBlockBudget, "None sets zero")
	require.Zero(t, z.MaxRetries, "None sets zero")
	require.NoError(t, z.validate())
	d := Config{}.withDefaults()
	require.Equal(t, DefaultQuarantineBudget, d.QuarantineBudget)
	require.Equal(t, DefaultPoisonedBlocks, d.PoisonedBlockBudget)
	require.Equal(t, DefaultMaxRetries, d.MaxRetries)
	require.Equal(t, int64(DefaultSlotBytes), d.SlotBytes)
	require.Equal(t, DefaultMaxConcurrent*DefaultPipelineDepth, d.NumSlots)
	require.True(t, strings.Contains((&ConfigError{Field: "F", Value: 1, Reason: "r"}).Error(), "F = 1: r"))
	require.True(t, errors.Is(&SpecError{}, ErrInvalidSpec))
}

// MaxRetries: None sends a receiver's request once; zero takes the default of six resends.
func TestMaxRetriesNoneSendsTheRequestOnce(t *testing.T) {
	for _, c := range []struct {
		desc    string
		retries int
		want    func(t *testing.T, sent int)
	}{
		{"None: once", None, func(t *testing.T, sent int) { require.Equal(t, 1, sent) }},
		{"zero: the default", 0, func(t *testing.T, sent int) { require.Greater(t, sent, 1) }},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cfg := fastConfig()
			cfg.MaxRetries = c.retries
			cfg.TransferTimeout = 200 * time.Millisecond // ten retry intervals
			p := newPair(t, cfg, cfg)                    // the prefill engine never sends
			var requests atomic.Int64
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind == wire.KindRequestInfo {
					requests.Add(1)
				}
				return mem.Fault{}
			})
			_, dst := pools(t, 1)
			h, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
			require.NoError(t, err)
			waitClosed(t, h.Quiesced(), "timed out")
			requireState(t, h, Failed, ErrDeadline)
			c.want(t, int(requests.Load()))
		})
	}
}

func TestSenderCancelledBeforeTheRequestTellsTheReceiver(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig())
	src, dst := pools(t, 1)
	hs, err := p.src.Send(bg, Spec{ID: 3, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	require.Equal(t, CancelledBeforeAdvertise, p.src.Cancel(3))
	require.NoError(t, p.src.Drain(bg))
	require.NoError(t, hs.Release())

	start := time.Now()
	hr, err := p.dst.Receive(bg, Spec{ID: 3, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
	require.NoError(t, err)
	waitClosed(t, hr.Quiesced(), "receiver told")
	requireState(t, hr, Failed, ErrPeerAborted)
	require.Less(t, time.Since(start), fastConfig().TransferTimeout, "the receiver waited for its deadline")

	// A new Send for the id clears the record: the next request is served.
	hs, err = p.src.Send(bg, Spec{ID: 3, Peer: "decode", Plan: src.plan, Pool: src.mem})
	require.NoError(t, err)
	require.NoError(t, hr.Release())
	eventually(t, func() bool {
		_, err := p.dst.Receive(bg, Spec{ID: 3, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
		return err == nil
	}, "id free again")
	waitClosed(t, hs.Quiesced(), "sent")
	requireState(t, hs, Completed)
}
