// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
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
	require.ErrorIs(t, hr.Release(), errOverReleased)
	require.ErrorIs(t, hr.Retain(), errOverReleased)
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
	require.ErrorIs(t, h2.Release(), errOverReleased)
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
		{desc: "queued receiver: no slot free", cfg: func(c *Config) { c.MaxConcurrent, c.Tuning.NumSlots, c.Tuning.PipelineDepth = 1, 1, 1 },
			fault: dataOnly(mem.Fault{Hang: true}),
			setup: func(t *testing.T, p *pair, src, dst *kvPool) (*Engine, *Handle, *Handle) {
				p.start(t, 1, src, dst) // holds both engines' only slot, hung
				eventually(t, func() bool { return p.net.OnWire() > 0 }, "the only slots hung")
				h, err := p.dst.Receive(bg, Spec{ID: 7, Peer: "prefill", Plan: dst.plan, Pool: dst.mem})
				require.NoError(t, err)
				requireState(t, h, Queued)
				return p.dst, h, nil
			}, want: CancelledBeforeAdvertise, final: []State{Cancelled}, resume: true},
		{desc: "queued sender: the request came, no slot free", cfg: func(c *Config) { c.MaxConcurrent, c.Tuning.NumSlots, c.Tuning.PipelineDepth = 1, 1, 1 },
			dcfg:  func(c *Config) { c.MaxConcurrent, c.Tuning.NumSlots, c.Tuning.PipelineDepth = 2, 2, 1 },
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
			cfg.Tuning.QuarantineTimeout = 10 * time.Second // only the transport may end a hung operation
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
				peerWant := Failed // a receiver whose sender cancelled did not get its blocks
				if e == p.dst {
					peerWant = Cancelled // a sender whose receiver withdrew its request failed nothing
				}
				requireState(t, peer, peerWant, ErrPeerAborted)
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
	byReq     map[RequestID][]transport.OpID
	cancelled map[transport.OpID]bool
	ended     map[transport.OpID]bool
	ids       map[*int]transport.OpID // by a key made per post (a pointer to a zero-size value would not do)
}

func newRecTransport(m *mem.Transport) *recTransport {
	return &recTransport{Transport: m, byReq: map[RequestID][]transport.OpID{}, cancelled: map[transport.OpID]bool{}, ended: map[transport.OpID]bool{}, ids: map[*int]transport.OpID{}}
}

func (r *recTransport) post(tag transport.Tag, done func(transport.Completion), post func(func(transport.Completion)) (transport.OpID, error)) (transport.OpID, error) {
	r.mu.Lock() // held across the post so the callback cannot run before the id is known
	defer r.mu.Unlock()
	ref := new(int)
	id, err := post(func(c transport.Completion) {
		if c.Memory != transport.MemoryBusy {
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

func (r *recTransport) PostSend(to Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return r.post(tag, done, func(cb func(transport.Completion)) (transport.OpID, error) {
		return r.Transport.PostSend(to, tag, buf, cb)
	})
}

func (r *recTransport) PostRecv(from Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return r.post(tag, done, func(cb func(transport.Completion)) (transport.OpID, error) {
		return r.Transport.PostRecv(from, tag, buf, cb)
	})
}

func (r *recTransport) Cancel(id transport.OpID) {
	r.mu.Lock()
	r.cancelled[id] = true
	r.mu.Unlock()
	r.Transport.Cancel(id)
}

// open lists request id's operations without a final completion yet.
func (r *recTransport) open(id RequestID) []transport.OpID {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ops []transport.OpID
	for _, op := range r.byReq[id] {
		if !r.ended[op] {
			ops = append(ops, op)
		}
	}
	return ops
}

func (r *recTransport) cancelledOrEnded(op transport.OpID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancelled[op] || r.ended[op]
}
