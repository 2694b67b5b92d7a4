// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// closeSpy is a mem transport that notes, when its Close begins, how many copies of the
// engine's mover workers were running: a transport may unmap memory they touch in Close
// (UCX unmaps its staging slots, the pools it allocated and the peers' slots mapped here).
type closeSpy struct {
	*mem.Transport
	copying *atomic.Int32
	atClose atomic.Int32
	once    sync.Once
	closing chan struct{}
}

func (s *closeSpy) Close(force bool) error {
	s.once.Do(func() {
		s.atClose.Store(s.copying.Load())
		close(s.closing)
	})
	return s.Transport.Close(force)
}

// countingStuckMover is stuckMover that also counts the copies running.
type countingStuckMover struct {
	stuckMover
	copying *atomic.Int32
}

func (m *countingStuckMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	m.copying.Add(1)
	defer m.copying.Add(-1)
	return m.stuckMover.Gather(p, off, dst)
}

func (m *countingStuckMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	m.copying.Add(1)
	defer m.copying.Add(-1)
	return m.stuckMover.Scatter(p, src, off)
}

// ScatterReadsAnyHostMemory implements anySourceScatterer, as the host mover it wraps does: the
// pull wire's chunks are then scattered out of the sender's slot mapped here.
func (m *countingStuckMover) ScatterReadsAnyHostMemory() bool { return true }

// TestL2_CloseUnmapsNothingUnderACopy: Engine.Close force-closes the transport, which may unmap
// the memory a mover worker is copying into or out of (the process died of it over UCX). With
// a copy stuck on a mover worker of the engine that closes, the transport's Close must not
// begin until the copy has returned; then every handle ends and no slot is lost.
func TestL2_CloseUnmapsNothingUnderACopy(t *testing.T) {
	cases := []struct {
		desc   string
		cfg    func() Config
		pull   bool // staging memory exposed, the peer's slots mapped: the pull wire, read in place
		gather bool // the sender's gather is stuck, else the receiver's scatter
		// pastBound: the copy stays stuck past CloseTimeout: Close returns, saying so, and
		// the transport closes only once the copy returns.
		pastBound bool
	}{
		{"staging: the closing sender's gather", fastConfig, false, true, false},
		{"staging: the closing receiver's scatter", fastConfig, false, false, false},
		{"pull wire: the closing sender's gather", inPlaceConfig, true, true, false},
		{"pull wire: the closing receiver's scatter out of the sender's mapped slot", inPlaceConfig, true, false, false},
		{"staging: the closing sender's gather, past CloseTimeout", fastConfig, false, true, true},
		{"pull wire: the closing receiver's scatter, past CloseTimeout", inPlaceConfig, true, false, true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			cfg := c.cfg()
			if c.pastBound {
				cfg.CloseTimeout = 300 * time.Millisecond
			}
			var copying atomic.Int32
			n := mem.NewNetwork()
			spies := map[Peer]*closeSpy{}
			engines := map[Peer]*Engine{}
			for _, name := range []Peer{"prefill", "decode"} {
				ecfg := cfg
				tr := n.Transport(name)
				if c.pull {
					ecfg.StagingMemory = make([]byte, int64(ecfg.Tuning.NumSlots)*ecfg.SlotBytes)
					tr.AllowDirect(ecfg.StagingMemory)
					n.Endpoint(name).MapPeers(true)
				}
				spies[name] = &closeSpy{Transport: tr, copying: &copying, closing: make(chan struct{})}
				e, err := New(spies[name], ecfg)
				require.NoError(t, err)
				engines[name] = e
				t.Cleanup(func() { _ = e.Close() })
			}
			src, dst := pools(t, 1)
			closing := Peer("decode")
			sm := &countingStuckMover{stuckMover: stuckMover{Mover: newHostMover(src.mem), gate: newGate(t), gather: true}, copying: &copying}
			rm := &countingStuckMover{stuckMover: stuckMover{Mover: newHostMover(dst.mem), gate: newGate(t)}, copying: &copying}
			stuck := rm.gate
			if c.gather {
				closing, stuck = "prefill", sm.gate
				rm.let()
			} else {
				sm.let()
			}
			hs, err := engines["prefill"].Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Pool: src.mem, Mover: sm})
			require.NoError(t, err)
			hr, err := engines["decode"].Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Pool: dst.mem, Mover: rm})
			require.NoError(t, err)
			waitClosed(t, stuck.entered, "a copy stuck on a mover worker")
			stuckSide := hr
			if c.gather {
				stuckSide = hs // it answered the pull before its first gather; the receiver hears later
			}
			require.Equal(t, c.pull, stuckSide.Pulled(), "the wire the case is about")

			closed := make(chan error, 1)
			go func() { closed <- engines[closing].Close() }()
			if c.pastBound {
				select {
				case err := <-closed:
					require.ErrorIs(t, err, ErrQuiescenceUnknown, "Close says a copy still ran")
				case <-time.After(10 * time.Second):
					t.Fatal("Close waited for the copy past CloseTimeout")
				}
				require.False(t, isClosed(spies[closing].closing), "the transport's Close began while the copy ran")
				stuck.let()
				waitClosed(t, spies[closing].closing, "the transport closed once the copy returned")
			} else {
				select {
				case <-spies[closing].closing:
					t.Errorf("the transport's Close began while the copy ran")
				case <-time.After(cfg.Tuning.CancelGrace + time.Second): // Close waits for the copy as long as CloseTimeout
				}
				stuck.let()
				select {
				case err := <-closed:
					require.NoError(t, err)
				case <-time.After(10 * time.Second):
					t.Fatal("Close did not return once the copy had")
				}
			}
			require.Zero(t, spies[closing].atClose.Load(), "copies running when the transport's Close began")
			other := engines["prefill"]
			if closing == "prefill" {
				other = engines["decode"]
			}
			require.NoError(t, other.Close())
			for _, h := range []*Handle{hs, hr} {
				// Quiesced: past the bound the stuck one was quarantined until its copy returned.
				waitClosed(t, h.Quiesced(), "quiesced")
				require.True(t, h.Status().State.Terminal(), "request %d: %+v", h.ID(), h.Status())
			}
			for _, e := range engines {
				requireSlotsAccounted(t, e)
			}
		})
	}
}

// closeSide is an engine with transfers, for closeMidTransfer: kv makes a pool over some of its
// blocks (filled from seed when seed != 0) that its transport can move on the path under test.
type closeSide struct {
	e     *Engine
	self  Peer                                  // its name to the other engine
	mover func(id RequestID, pool []byte) Mover // the Mover of the Spec of request id, or nil for none
	kv    func(t testing.TB, blocks []int32, seed uint64) ([]byte, *layout.Plan)
	// device registers a pool from kv as device memory of the side's transport (a fakeDevice
	// over mem): its Specs name it as Spec.Device. Nil: the pool is host memory, Spec.Pool.
	device func(pool []byte) DevicePool
	// deviceHolds counts the device registrations its transfers hold now (HoldDevice, taken
	// on a transport with device gets only); nil where none are taken.
	deviceHolds func() int64
}

// requireDeviceHolds checks, on a side whose transfers hold their device registrations, that
// exactly the handles hs of that side not yet quiescent hold theirs: a handle lets go of its
// device memory when Quiesced closes, and never while it may still be written (L9, L10).
func requireDeviceHolds(t testing.TB, side closeSide, hs ...*Handle) {
	t.Helper()
	if side.deviceHolds == nil {
		return
	}
	open := func() (n int64) {
		for _, h := range hs {
			if !isClosed(h.Quiesced()) {
				n++
			}
		}
		return n
	}
	eventually(t, func() bool { return side.deviceHolds() == open() }, "a device registration held while, and only while, its handle is not quiescent")
}

// spec is s with the side's pool (from kv) in it, as Spec.Pool or, on a device side,
// Spec.Device, and the side's Mover for it, if it has one.
func (c closeSide) spec(s Spec, pool []byte) Spec {
	if c.device != nil {
		s.Device = c.device(pool)
	} else {
		s.Pool = pool
	}
	if c.mover != nil {
		s.Mover = c.mover(s.ID, pool)
	}
	return s
}

// closePath is one path closeMidTransfer runs on: cfg adds what picks it (over the transport's
// own base configuration), in: the receiver reads the sender's memory where it is mapped;
// device: the pools are device memory (Spec.Device) of a fakeDevice over mem, moved by its
// device gets (path RMA) or, on a transport without them, staged through the Specs' Movers;
// declined: only the receivers' transports have device gets (the sender is the side named
// "prefill" in every test of the table), so the sender declines the rma route and both stage.
type closePath struct {
	name     string
	cfg      func(*Config)
	path     Path
	pull     bool
	in       bool
	device   bool
	declined bool
}

// closePaths are the paths a Close may find transfers on: the staging slots with the chunks as
// messages or pulled (with gets, or read in place out of the sender's slot mapped here), the
// one-copy paths (IOV messages, RMA gets, RMA ranges read in place), and device pools (device
// gets, staged through their Movers, or staged after the sender declined the gets). The device
// rows run over mem only (memPathSide): a real device needs a GPU, and the UCX tables skip them.
var closePaths = []closePath{
	{name: "staging", cfg: func(c *Config) { c.Tuning.DisableDirect, c.Tuning.DisablePull = true, true }, path: PathStaging},
	{name: "pull", cfg: func(c *Config) { c.Tuning.DisableDirect, c.Tuning.DisableInPlaceReads = true, true }, path: PathStaging, pull: true},
	{name: "pull in place", cfg: func(c *Config) { c.Tuning.DisableDirect = true }, path: PathStaging, pull: true, in: true},
	{name: "direct", cfg: func(c *Config) { c.Tuning.DisableRMA = true }, path: PathDirect},
	{name: "RMA", cfg: func(c *Config) { c.Tuning.DisableInPlaceReads = true }, path: PathRMA},
	{name: "RMA in place", cfg: func(*Config) {}, path: PathRMA, in: true},
	{name: "device gets", cfg: func(*Config) {}, path: PathRMA, device: true},
	{name: "device staging", cfg: func(c *Config) { c.Tuning.DisablePull = true }, path: PathStaging, device: true},
	{name: "device staging after a decline", cfg: func(c *Config) { c.Tuning.DisablePull = true }, path: PathStaging, device: true, declined: true},
}

// closeMidTransfer starts transfers from src to dst, waits until the bytes of one of them move
// on the path, closes one engine (the sender's when closeSender) at once, then the other, and
// checks what Close promises: the process lives (no copy or transport operation touches memory
// the transport unmapped), every handle ends (Done closed; terminal, or quarantined for good
// with its blocks poisoned, L9), and no staging slot is lost (free + leased + poisoned = total,
// none leased). It also checks that Close is what ended them, so that a path on which every
// transfer fails by itself cannot pass (closeEndedBy): a handle done before Close began
// completed; at least one was not done, on the path, with bytes moved; and each one not done
// then either completed before Close stopped it or ended with a reason that names the close.
// It returns the handles.
func closeMidTransfer(t *testing.T, src, dst closeSide, pc closePath, closeSender bool, nBlocks int32) []*Handle {
	t.Helper()
	const transfers = 6
	type pools struct {
		smem, dmem   []byte
		splan, dplan *layout.Plan
	}
	var ps []pools // all made first: the transfers start close together, none ends while the next one's pools are filled
	for i := range int32(transfers) {
		var p pools
		p.smem, p.splan = src.kv(t, seqBlocks(i*nBlocks%64, nBlocks), uint64(i+1))
		p.dmem, p.dplan = dst.kv(t, seqBlocks(64-nBlocks, nBlocks), 0)
		ps = append(ps, p)
	}
	var hs, sent, received []*Handle // hs: each Send, then its Receive
	for i, p := range ps {
		id := RequestID(500 + i)
		s, err := src.e.Send(bg, src.spec(Spec{ID: id, Peer: dst.self, Plan: p.splan}, p.smem))
		require.NoError(t, err)
		r, err := dst.e.Receive(bg, dst.spec(Spec{ID: id, Peer: src.self, Plan: p.dplan}, p.dmem))
		require.NoError(t, err)
		hs, sent, received = append(hs, s, r), append(sent, s), append(received, r)
	}
	onPath := func(h *Handle) bool { return h.Path() == pc.path && (!pc.pull || h.Pulled()) }
	first, second, closer := dst.e, src.e, dst.self
	if closeSender {
		first, second, closer = src.e, dst.e, src.self
	}
	at, caught := catchMoving(hs, onPath)
	if caught {
		require.NoError(t, first.Close())
	}
	var moving, moved int
	for i, h := range hs {
		switch c := at[i]; {
		case c.done:
			// Ended before Close: nothing stopped it, so it must have completed. A failure here
			// is the path's own (a broken setup, a path not really taken), not Close's doing.
			require.Equal(t, Completed, c.st.State, "request %d (%s) ended before Close began, not completed: the path failed by itself: %v",
				h.ID(), map[bool]string{true: "receive", false: "send"}[h.receive], c.st.Err)
		case c.moved:
			moving, moved = moving+1, moved+1
		default:
			moving++
		}
	}
	require.True(t, caught, "no transfer seen with its bytes moving on the path, not done, within 10s")
	require.NotZero(t, moved, "no transfer on the path, not done, with bytes moved when Close began")
	t.Logf("%d of %d handles not done when Close began, %d of them on the path with bytes moved", moving, len(hs), moved)
	require.NoError(t, second.Close())
	ended := 0
	for i, h := range hs {
		select {
		case <-h.Done():
		case <-time.After(20 * time.Second):
			t.Fatalf("request %d not done after its engines closed: %+v", h.ID(), h.Status())
		}
		st := h.Status()
		require.True(t, st.State.Terminal() || st.State == Quarantined && st.BlocksPoisoned,
			"request %d ends terminal, or quarantined for good with its blocks poisoned: %+v", h.ID(), st)
		if h.Path() != PathUndecided { // a pull may be cut short before the sender answered it
			require.Equal(t, pc.path, h.Path(), "request %d", h.ID())
		}
		require.Equal(t, pc.device, h.subs[0].dev.set(), "request %d: a device pool", h.ID())
		if at[i].done || st.State == Completed { // done before Close, or completed before it stopped it
			continue
		}
		ended++
		pair := hs[i^1] // hs holds each Send, then its Receive
		require.True(t, closeEndedBy(st.Err, h.eng == first, closer, pair.Status().Err),
			"request %d (on the engine closed %s), not done when Close began, ends %v for a reason that does not name the close: %v",
			h.ID(), map[bool]string{true: "first", false: "second"}[h.eng == first], st.State, st.Err)
	}
	require.NotZero(t, ended, "Close ended none of the %d transfers not done when it began: each completed first", moving)
	for _, e := range []*Engine{src.e, dst.e} {
		requireSlotsAccounted(t, e)
	}
	requireDeviceHolds(t, src, sent...)
	requireDeviceHolds(t, dst, received...)
	return hs
}

// closeSeen is one handle as closeMidTransfer saw it just before Close: done (Done closed), and
// moved (not done, on the path, and some of its bytes moved).
type closeSeen struct {
	st          Status
	done, moved bool
}

// catchMoving looks at hs every millisecond, for up to 10s, until one of them is not done, on
// the path (onPath), with bytes moved (in flight), and returns what it saw of each then, and
// true; or, when they all ended first or the time ran out, what it saw last, and false. The
// tables keep their transfers moving far longer than a millisecond: mem's network holds every
// message and get, the UCX staging rows' copies take 20 ms each, and the UCX rows whose bytes
// move in a few milliseconds hold some completions until Close (heldCompletions).
func catchMoving(hs []*Handle, onPath func(*Handle) bool) ([]closeSeen, bool) {
	at := make([]closeSeen, len(hs))
	deadline := time.Now().Add(10 * time.Second)
	for {
		caught, allDone := false, true
		for i, h := range hs {
			c := closeSeen{done: isClosed(h.Done()), st: h.Status()}
			c.moved = !c.done && onPath(h) && (c.st.Bytes > 0 || c.st.State == InFlight)
			at[i] = c
			caught, allDone = caught || c.moved, allDone && c.done
		}
		if caught || allDone || time.Now().After(deadline) {
			return at, caught
		}
		time.Sleep(time.Millisecond)
	}
}

// closeEndedBy reports whether err, the reason a transfer failed or was cancelled, names an
// engine's Close, as the engine reports it: on the engine closed first (onFirst), ErrClosed,
// which Close stops each transfer with; on the other, ErrClosed (its own Close, second), the
// loss of the peer that closed (closer: its transport's close ends the connection), its
// abort for the close (ErrPeerAborted with code AbortClosed, as sent or as its goodbye says
// it), or another word of the peer's that it stopped (ErrPeerAborted: an RMA receiver's
// release, which may arrive ahead of its abort) where the peer's own handle of the pair
// (pairErr) ended with ErrClosed.
func closeEndedBy(err error, onFirst bool, closer Peer, pairErr error) bool {
	if errors.Is(err, ErrClosed) {
		return true
	}
	if onFirst {
		return false
	}
	var pl *PeerLostError
	switch {
	case errors.Is(err, ErrPeerAborted):
		return strings.Contains(err.Error(), fmt.Sprintf("(code %d)", wire.AbortClosed)) || errors.Is(pairErr, ErrClosed)
	case errors.As(err, &pl):
		return pl.Peer == closer
	}
	return false
}

// TestL1_CloseWithTransfersInFlightOnEveryPath closes an engine, the sender's or the receiver's,
// with transfers moving on each path (mem transport; ucx_close_test.go runs it over UCX shared
// memory and TCP): every handle ends and no slot is lost (closeMidTransfer).
func TestL1_CloseWithTransfersInFlightOnEveryPath(t *testing.T) {
	for _, pc := range closePaths {
		for _, closeSender := range []bool{true, false} {
			side := map[bool]string{true: "sender", false: "receiver"}[closeSender]
			t.Run(pc.name+"/close the "+side, func(t *testing.T) {
				cfg := pipelineConfig()
				cfg.Tuning.DirectChunkBytes, cfg.Tuning.RMAMinRegionBytes = 2048, 512
				cfg.Tuning.QuarantineTimeout = 10 * time.Second // Close, not the timer, ends what is left
				n := mem.NewNetwork()
				// Every message and get held a while: the transfers are still moving at Close.
				n.SetFault(func(mem.FaultPoint) mem.Fault { return mem.Fault{Delay: 10 * time.Millisecond} })
				mk := func(name Peer) closeSide { return memPathSide(t, n, name, pc, cfg) }
				closeMidTransfer(t, mk("prefill"), mk("decode"), pc, closeSender, 16)
			})
		}
	}
}

// memPathSide is an engine named name on n, configured from cfg to run on path pc, whose pools
// the transport can move on it.
func memPathSide(t *testing.T, n *mem.Network, name Peer, pc closePath, cfg Config) closeSide {
	return memPathSideOver(t, n, name, pc, cfg, nil)
}

// memPathSideOver is memPathSide with the engine's transport wrap(the mem transport) when wrap
// is not nil.
func memPathSideOver(t *testing.T, n *mem.Network, name Peer, pc closePath, cfg Config, wrap func(*mem.Transport) Transport) closeSide {
	t.Helper()
	pc.cfg(&cfg)
	tr := n.Transport(name)
	cfg.StagingMemory = make([]byte, int64(cfg.Tuning.NumSlots)*cfg.SlotBytes)
	if pc.pull {
		tr.AllowDirect(cfg.StagingMemory) // as UCX's staging memory is mapped
	}
	n.Endpoint(name).MapPeers(pc.in)
	var engTr Transport = tr
	var dev *fakeDevice
	switch {
	case pc.device && wrap != nil:
		t.Fatal("memPathSideOver: a wrapped transport has no device gets")
	case pc.device:
		// Device gets on the RMA row; none on the staging row, whose Movers then stage; on the
		// receivers' only after a decline.
		dev = &fakeDevice{Transport: tr, gets: pc.path == PathRMA || pc.declined && name != "prefill"}
		engTr = dev
	case wrap != nil:
		engTr = wrap(tr)
	}
	e, err := New(engTr, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	side := closeSide{e: e, self: name, kv: func(t testing.TB, ids []int32, seed uint64) ([]byte, *layout.Plan) {
		k := newKVPool(t, testDims, layout.BlockMajor, nil, ids, seed)
		if pc.path != PathStaging && !pc.device {
			tr.AllowDirect(k.mem)
		}
		return k.mem, k.plan
	}}
	if dev != nil {
		side.device = dev.register
		if dev.gets {
			side.deviceHolds = dev.holds.Load
		}
		if pc.path == PathStaging {
			side.mover = func(_ RequestID, pool []byte) Mover { return newHostMover(pool) }
		}
	}
	return side
}

// slowMover is a Mover (the host mover, or a device one) with every copy taking at least delay,
// as a large chunk's does on a busy host: Close then finds copies running on the mover workers.
type slowMover struct {
	Mover
	delay time.Duration
}

func (m slowMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	time.Sleep(m.delay)
	return m.Mover.Gather(p, off, dst)
}

func (m slowMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	time.Sleep(m.delay)
	return m.Mover.Scatter(p, src, off)
}

// ScatterReadsAnyHostMemory implements anySourceScatterer as the Mover it wraps does: true for
// the host mover, false for a device one, whose scatter reads only its device slots.
func (m slowMover) ScatterReadsAnyHostMemory() bool {
	a, ok := m.Mover.(anySourceScatterer)
	return ok && a.ScatterReadsAnyHostMemory()
}
