// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// fakeDevice is an in-memory transport with device gets: its "device regions" are host
// slices standing in for registered GPU memory, named to the engine only by address and
// length, as a real device region is. Every get still runs on the mem network.
type fakeDevice struct {
	*mem.Transport
	gets    bool
	mu      sync.Mutex
	regions [][]byte
	holds   atomic.Int64 // transfers holding a region now
	held    atomic.Int64 // HoldDevice calls, ever
}

var _ transport.DeviceRMATransport = (*fakeDevice)(nil)

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// register makes b a device region of this transport.
func (d *fakeDevice) register(b []byte) DevicePool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.regions = append(d.regions, b)
	d.AllowDirect(b)
	return DevicePool{Addr: addrOf(b), Len: int64(len(b))}
}

func (d *fakeDevice) find(addr uint64, n int64) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.regions {
		base := addrOf(r)
		if addr >= base && n >= 0 && addr-base+uint64(n) <= uint64(len(r)) {
			off := addr - base
			return r[off : off+uint64(n) : off+uint64(n)], nil
		}
	}
	return nil, &transport.RegionError{Op: "find", Addr: addr, Len: n, Reason: "not inside a device registration", Err: transport.ErrBadRegion}
}

func (d *fakeDevice) DeviceGets() bool { return d.gets }

func (d *fakeDevice) CheckDevice(addr uint64, n int64) error { _, err := d.find(addr, n); return err }

func (d *fakeDevice) HoldDevice(addr uint64, n int64) func() {
	if _, err := d.find(addr, n); err != nil {
		return nil
	}
	d.holds.Add(1)
	d.held.Add(1)
	var once sync.Once
	return func() { once.Do(func() { d.holds.Add(-1) }) }
}

func (d *fakeDevice) RMAKeyAt(addr uint64, n int64) (uint64, []byte, error) {
	b, err := d.find(addr, n)
	if err != nil {
		return 0, nil, err
	}
	return d.RMAKey(b)
}

func (d *fakeDevice) PostGetAt(from transport.Peer, tag transport.Tag, key []byte, addr, dstAddr uint64, n int64, done func(transport.Completion)) (transport.OpID, error) {
	b, err := d.find(dstAddr, n)
	if err != nil {
		return 0, err
	}
	return d.PostGet(from, tag, key, addr, b, done)
}

// countingMover is a host mover that counts its copies: a device transfer on the rma route
// must never call it.
type countingMover struct {
	Mover
	calls atomic.Int64
}

func (m *countingMover) Gather(p *layout.Plan, off int64, dst []byte) error {
	m.calls.Add(1)
	return m.Mover.Gather(p, off, dst)
}

func (m *countingMover) Scatter(p *layout.Plan, src []byte, off int64) error {
	m.calls.Add(1)
	return m.Mover.Scatter(p, src, off)
}

type devicePair struct {
	*pair
	srcT, dstT *fakeDevice
}

func newDevicePair(t *testing.T, scfg, rcfg Config, srcGets, dstGets bool) (*devicePair, *wireBytes) {
	t.Helper()
	n := mem.NewNetwork()
	w := &wireBytes{}
	n.SetFault(w.judge)
	st := &fakeDevice{Transport: n.Transport("prefill"), gets: srcGets}
	dt := &fakeDevice{Transport: n.Transport("decode"), gets: dstGets}
	a, err := New(st, scfg)
	require.NoError(t, err)
	b, err := New(dt, rcfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
		requireSlotsAccounted(t, a)
		requireSlotsAccounted(t, b)
	})
	return &devicePair{pair: &pair{net: n, src: a, dst: b}, srcT: st, dstT: dt}, w
}

// devicePathPair is newDevicePair for memPaths: src and dst are device pools (Spec.Device) of
// transports with device gets (path RMA), or without them on the sender's (srcGets false),
// each Spec then with a host Mover to stage through (path staging; after the sender's decline
// when the receiver's transport has device gets). start sends src to dst.
func devicePathPair(t *testing.T, scfg, rcfg Config, srcGets, dstGets bool, src, dst *kvPool) (*pair, func(RequestID) (hs, hr *Handle)) {
	p, _ := newDevicePair(t, scfg, rcfg, srcGets, dstGets)
	sdev, ddev := p.srcT.register(src.mem), p.dstT.register(dst.mem)
	return p.pair, func(id RequestID) (*Handle, *Handle) {
		sspec := Spec{ID: id, Peer: "decode", Plan: src.plan, Device: sdev}
		rspec := Spec{ID: id, Peer: "prefill", Plan: dst.plan, Device: ddev}
		if !srcGets {
			sspec.Mover, rspec.Mover = newHostMover(src.mem), newHostMover(dst.mem)
		}
		hs, err := p.src.Send(bg, sspec)
		require.NoError(t, err)
		hr, err := p.dst.Receive(bg, rspec)
		require.NoError(t, err)
		return hs, hr
	}
}

// A device pool moves by gets when both engines and the peer allow it (path rma, no staging:
// the Mover is never called, and only the stream's bytes cross, once), stages through its
// Mover where the rma route cannot run, and otherwise fails on both sides with a
// ErrDeviceRoute saying why.
func TestDevicePoolTakesRMAOrStagesOrRefuses(t *testing.T) {
	cases := []struct {
		desc                 string
		srcDevice, dstDevice bool // else a host pool named to the direct set
		srcGets, dstGets     bool
		dstOrder             layout.Order
		dstMover, srcMover   bool
		disableRMAOnRecv     bool
		disableRMAOnSend     bool
		smallRanges          bool // the receiver's RMAMinRegionBytes above every range (a host pool would stage)
		wantPath             Path
		wantErr              error // both sides fail with it
	}{
		{desc: "device to device: gets", srcDevice: true, dstDevice: true, srcGets: true, dstGets: true,
			dstMover: true, wantPath: PathRMA},
		// A host receiver stages ranges under RMAMinRegionBytes; a device pool has no staging
		// once its rma route began (deviceNoFallback), so it reads them by gets all the same:
		// one layer of a block, or a model's small blocks, is never refused for its size.
		{desc: "device to device, ranges under RMAMinRegionBytes: gets all the same", srcDevice: true, dstDevice: true,
			srcGets: true, dstGets: true, dstMover: true, smallRanges: true, wantPath: PathRMA},
		{desc: "host pool to device pool: gets", dstDevice: true, srcGets: true, dstGets: true, wantPath: PathRMA},
		{desc: "device pool to host pool: gets", srcDevice: true, srcGets: true, dstGets: true, wantPath: PathRMA},
		{desc: "no device gets here, Movers given: staging", srcDevice: true, dstDevice: true, dstMover: true, srcMover: true,
			wantPath: PathStaging},
		{desc: "rma disabled on the receiver, Movers given: staging", srcDevice: true, dstDevice: true, srcGets: true, dstGets: true,
			dstMover: true, srcMover: true, disableRMAOnRecv: true, wantPath: PathStaging},
		{desc: "rma disabled on the receiver, no Mover: refused", srcDevice: true, dstDevice: true, srcGets: true, dstGets: true,
			disableRMAOnRecv: true, wantErr: ErrDeviceRoute},
		{desc: "layouts that do not line up for gets: refused", srcDevice: true, dstDevice: true, srcGets: true, dstGets: true,
			dstOrder: layout.LayerMajor, wantErr: ErrDeviceRoute},
		{desc: "receiver asks for staging, device sender without Mover: refused", srcDevice: true, dstDevice: true, srcGets: true,
			dstMover: true, wantErr: ErrDeviceRoute},
		// The receiver took the rma route and the sender declined it: both stage instead.
		{desc: "rma route, the sender has no device gets, Movers given: staging after its decline", srcDevice: true, dstDevice: true,
			dstGets: true, dstMover: true, srcMover: true, wantPath: PathStaging},
		{desc: "rma route, rma disabled on the sender, Movers given: staging after its decline", srcDevice: true, dstDevice: true,
			srcGets: true, dstGets: true, dstMover: true, srcMover: true, disableRMAOnSend: true, wantPath: PathStaging},
		{desc: "rma route, the sender declines, the receiver has no Mover: refused", srcDevice: true, dstDevice: true,
			dstGets: true, srcMover: true, wantErr: ErrDeviceRoute},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			src, dst := rmaPools(t, 5)
			if c.dstOrder != layout.BlockMajor {
				dst = newKVPool(t, testDims, c.dstOrder, nil, blocks(2, 7, 3, 11), 0)
			}
			scfg, rcfg := rmaConfig(), rmaConfig()
			rcfg.Tuning.DisableRMA = c.disableRMAOnRecv
			scfg.Tuning.DisableRMA = c.disableRMAOnSend
			if c.smallRanges {
				rcfg.Tuning.RMAMinRegionBytes = 1 << 30
			}
			if c.wantErr != nil && c.disableRMAOnRecv {
				// The receiver refuses before it sends its request (runReceiveDevice), and the
				// sender does not trust an abort naming a request it never saw (runSend): it
				// ends by its QueueTimeout, which this case sets short. fastConfig's far one
				// would outlast waitClosed.
				scfg.QueueTimeout = 500 * time.Millisecond
			}
			p, w := newDevicePair(t, scfg, rcfg, c.srcGets, c.dstGets)
			sspec := Spec{ID: 1, Peer: "decode", Plan: src.plan}
			rspec := Spec{ID: 1, Peer: "prefill", Plan: dst.plan}
			var movers []*countingMover
			side := func(s *Spec, t *fakeDevice, pool *kvPool, device, mover bool) {
				if device {
					s.Device = t.register(pool.mem)
				} else {
					t.AllowDirect(pool.mem)
					s.Pool = pool.mem
				}
				if mover {
					m := &countingMover{Mover: newHostMover(pool.mem)}
					movers = append(movers, m)
					s.Mover = m
				}
			}
			side(&sspec, p.srcT, src, c.srcDevice, c.srcMover)
			side(&rspec, p.dstT, dst, c.dstDevice, c.dstMover)
			hs, err := p.src.Send(bg, sspec)
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, rspec)
			require.NoError(t, err)
			waitClosed(t, hr.Quiesced(), "receiver quiesced")
			waitClosed(t, hs.Quiesced(), "sender quiesced")
			require.Zero(t, p.srcT.holds.Load()+p.dstT.holds.Load(), "a device registration still held after Quiesced")
			require.Equal(t, boolInt(c.srcDevice && c.srcGets)+boolInt(c.dstDevice && c.dstGets), p.srcT.held.Load()+p.dstT.held.Load(),
				"each device pool held by its transfer")
			if c.wantErr != nil {
				for _, h := range []*Handle{hr, hs} {
					requireState(t, h, Failed)
				}
				var re *deviceRouteError // on the side that refused; the other hears why in the abort
				require.True(t, errors.As(hr.Status().Err, &re) || errors.As(hs.Status().Err, &re), "an ErrDeviceRoute on one side: %v / %v", hr.Status().Err, hs.Status().Err)
				require.ErrorIs(t, re, c.wantErr)
				return
			}
			requireState(t, hr, Completed)
			requireState(t, hs, Completed)
			require.Equal(t, c.wantPath, hr.Path())
			require.Equal(t, c.wantPath, hs.Path())
			want, got := make([]byte, src.plan.Bytes()), make([]byte, dst.plan.Bytes())
			require.NoError(t, layouttest.ReferenceGather(src.plan, src.mem, want))
			require.NoError(t, layouttest.ReferenceGather(dst.plan, dst.mem, got))
			require.Equal(t, want, got, "every byte")
			if c.wantPath == PathRMA {
				bytes, _ := w.total()
				require.Equal(t, len(want), bytes, "bare stream bytes by gets, nothing staged or sent twice")
				for _, m := range movers {
					require.Zero(t, m.calls.Load(), "the rma route never stages")
				}
			}
			require.Zero(t, p.net.Pending(), "every operation has its final verdict")
		})
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// A device spec that cannot run is refused at Send or Receive with an ErrInvalidSpec (nothing
// starts, nothing held): both pools set, a plan past the region, an address outside every
// device registration (host memory, say), and a transport without device gets and no Mover.
func TestDeviceSpecRefusals(t *testing.T) {
	src, _ := rmaPools(t, 3)
	cases := []struct {
		desc    string
		gets    bool
		spec    func(d *fakeDevice) Spec
		field   string
		wantErr error
	}{
		{desc: "Pool and Device both set", gets: true, field: "Device", spec: func(d *fakeDevice) Spec {
			return Spec{Pool: src.mem, Device: d.register(src.mem)}
		}},
		{desc: "zero address", gets: true, field: "Device.Addr", spec: func(d *fakeDevice) Spec {
			return Spec{Device: DevicePool{Len: 1 << 20}}
		}},
		{desc: "blocks past the region", gets: true, field: "Device.Len", wantErr: layout.ErrBufferTooSmall, spec: func(d *fakeDevice) Spec {
			dev := d.register(src.mem)
			dev.Len = kvplan.PoolSpan(src.plan) - 1
			return Spec{Device: dev}
		}},
		{desc: "not a device registration", gets: true, field: "Device", wantErr: transport.ErrBadRegion, spec: func(d *fakeDevice) Spec {
			return Spec{Device: DevicePool{Addr: addrOf(src.mem), Len: int64(len(src.mem))}}
		}},
		{desc: "no device gets and no Mover", gets: false, field: "Device", wantErr: ErrDeviceRoute, spec: func(d *fakeDevice) Spec {
			return Spec{Device: d.register(src.mem)}
		}},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			p, _ := newDevicePair(t, rmaConfig(), rmaConfig(), c.gets, c.gets)
			for _, receive := range []bool{false, true} {
				s := c.spec(p.srcT)
				s.ID, s.Peer, s.Plan = 7, "decode", src.plan
				var err error
				if receive {
					_, err = p.src.Receive(bg, s)
				} else {
					_, err = p.src.Send(bg, s)
				}
				require.ErrorIs(t, err, ErrInvalidSpec)
				var se *specError
				require.ErrorAs(t, err, &se)
				require.Equal(t, c.field, se.Field, fmt.Sprint(err))
				if c.wantErr != nil {
					require.ErrorIs(t, err, c.wantErr)
				}
				require.Zero(t, p.srcT.holds.Load(), "nothing held")
				p.src.mu.Lock()
				require.Empty(t, p.src.handles, "nothing started")
				p.src.mu.Unlock()
			}
		})
	}
}

// The validated-read rule holds unchanged for device pools (the generation word lives in the
// sender's host memory): a sender that gives up and reuses its device blocks while the
// receiver's gets are on the wire makes the receiver fail with ErrStaleRead, never complete.
func TestRMAValidatedRead_DevicePoolsSenderReusesBlocksMidRead(t *testing.T) {
	src, dst := rmaPools(t, 63)
	p, _ := newDevicePair(t, rmaConfig(), rmaConfig(), true, true)
	var hang atomic.Bool
	hang.Store(true)
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		switch {
		case fp.Kind == wire.KindData && !fp.Generation && hang.Load():
			return mem.Fault{Hang: true} // the data gets wait on the wire until Resume
		case fp.Kind == wire.KindAbort && fp.From == "prefill":
			return mem.Fault{Drop: true} // the receiver never hears that the sender gave up
		}
		return mem.Fault{}
	})
	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Device: p.srcT.register(src.mem)})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Device: p.dstT.register(dst.mem)})
	require.NoError(t, err)
	eventually(t, func() bool { return p.net.OnWire() >= 1 }, "gets on the wire")
	require.Equal(t, PathRMA, hr.Path())

	p.net.ReportPeerLost(p.net.Endpoint("prefill"), "decode", fmt.Errorf("%w: false alarm", ErrPeerLost))
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	requireState(t, hs, Failed)
	require.Zero(t, p.srcT.holds.Load(), "the sender's device registration is free once quiesced")
	for i := range src.mem { // the caller reuses its device blocks at once, as Quiesced allows
		src.mem[i] = ^src.mem[i]
	}
	hang.Store(false)
	p.net.Resume()
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	requireState(t, hr, Failed)
	require.ErrorIs(t, hr.Status().Err, ErrStaleRead)
	require.Zero(t, p.net.Pending(), "every operation has its final verdict")
}

// unknownMover is a mover whose every copy ends in ErrQuiescenceUnknown, as a device mover's
// kernel that overran its sync timeout (or whose event could not be recorded) does.
type unknownMover struct{ Mover }

func (unknownMover) Gather(*layout.Plan, int64, []byte) error {
	return fmt.Errorf("%w: test: kernel state unknown", ErrQuiescenceUnknown)
}

func (unknownMover) Scatter(*layout.Plan, []byte, int64) error {
	return fmt.Errorf("%w: test: kernel state unknown", ErrQuiescenceUnknown)
}

// L2 with L9 for device pools (Spec.Device): a Receive whose device blocks a hung get may still
// write (quarantined), or whose blocks are poisoned for good (a get that never quiesced, a
// mover that cannot say its copy ended), holds them as a host pool's are: a new Receive over
// them, or a Send of them, is refused with ErrBlocksBusy naming the holder, until they
// quiesce; another device pool is free.
func TestL2_DeviceBlocksHeldWhileNotQuiescent(t *testing.T) {
	cases := []struct {
		desc     string
		gets     bool      // the rma route (device gets), else staging through the Movers
		fault    mem.Fault // on the receiver's data gets (rma route)
		poisoned bool
	}{
		{desc: "rma: a get hung on the wire, quarantined", gets: true, fault: mem.Fault{Hang: true}},
		{desc: "rma: a get that never quiesces, poisoned", gets: true, fault: mem.Fault{Hang: true, NeverQuiesce: true}, poisoned: true},
		{desc: "staging: the mover cannot say its copy ended, poisoned", poisoned: true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			src, dst := rmaPools(t, 17)
			rcfg := rmaConfig()
			rcfg.TransferTimeout = 100 * time.Millisecond
			rcfg.Tuning.QuarantineTimeout = time.Minute
			if c.poisoned {
				rcfg.Tuning.QuarantineTimeout = 50 * time.Millisecond
			}
			p, _ := newDevicePair(t, rmaConfig(), rcfg, c.gets, c.gets)
			var hang atomic.Bool
			hang.Store(true)
			p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
				if fp.Kind == wire.KindData && !fp.Generation && hang.Load() {
					return c.fault
				}
				return mem.Fault{}
			})
			sspec := Spec{ID: 1, Peer: "decode", Plan: src.plan, Device: p.srcT.register(src.mem)}
			dev := p.dstT.register(dst.mem)
			rspec := Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Device: dev}
			if !c.gets {
				sspec.Mover = newHostMover(src.mem)
				rspec.Mover = unknownMover{}
			}
			_, err := p.src.Send(bg, sspec)
			require.NoError(t, err)
			hr, err := p.dst.Receive(bg, rspec)
			require.NoError(t, err)
			waitClosed(t, hr.Done(), "receiver done")
			if c.poisoned {
				eventually(t, func() bool { return hr.Status().BlocksPoisoned }, "blocks poisoned")
				require.NoError(t, p.dst.Drain(bg), "the transfer's goroutine ended")
				require.Equal(t, int64(len(dst.plan.Blocks())), p.dst.Health().Numbers.PoisonedBlocks, "each device block counted once")
			} else {
				requireState(t, hr, Quarantined, ErrDeadline)
			}
			require.False(t, isClosed(hr.Quiesced()))

			for _, s := range []struct {
				desc string
				try  func() (*Handle, error)
			}{
				{"receive over the same device blocks", func() (*Handle, error) {
					return p.dst.Receive(bg, Spec{ID: 2, Peer: "prefill", Plan: dst.plan, Device: dev, Mover: rspec.Mover})
				}},
				{"send of the same device blocks", func() (*Handle, error) {
					return p.dst.Send(bg, Spec{ID: 3, Peer: "prefill", Plan: dst.plan, Device: dev, Mover: rspec.Mover})
				}},
			} {
				_, err := s.try()
				require.ErrorIs(t, err, ErrBlocksBusy, s.desc)
				var be *blocksBusyError
				require.ErrorAs(t, err, &be, s.desc)
				require.Equal(t, RequestID(1), be.Holder, s.desc)
				require.Equal(t, c.poisoned, be.Poisoned, s.desc)
			}

			// The same block ids in another device pool are free.
			_, dst2 := rmaPools(t, 18)
			h2, err := p.dst.Receive(bg, Spec{ID: 4, Peer: "prefill", Plan: dst2.plan, Device: p.dstT.register(dst2.mem), Mover: rspec.Mover})
			require.NoError(t, err, "another device pool")
			require.Contains(t, []CancelOutcome{CancelledBeforeAdvertise, CancelRequestedInFlight, BackendUnhealthy}, p.dst.Cancel(4), "a wedged mover makes the engine unhealthy")
			waitClosed(t, h2.Quiesced(), "receive over another device pool cancelled")

			if c.poisoned {
				require.False(t, isClosed(hr.Quiesced()))
				return
			}
			hang.Store(false)
			p.net.Resume()
			waitClosed(t, hr.Quiesced(), "the transport let go")
			h, err := p.dst.Receive(bg, Spec{ID: 5, Peer: "prefill", Plan: dst.plan, Device: dev})
			require.NoError(t, err, "quiescent device blocks are the caller's again")
			require.Contains(t, []CancelOutcome{CancelledBeforeAdvertise, CancelRequestedInFlight}, p.dst.Cancel(5))
			waitClosed(t, h.Quiesced(), "cancelled")
		})
	}
}

// A device receiver whose sender declined the rma route stages only with a slot free at that
// moment (the loop never waits on the pool): with every slot of its engine leased elsewhere,
// both sides fail with an ErrDeviceRoute that says so, and nothing is left held.
func TestDeviceDeclineWithoutAFreeSlotFails(t *testing.T) {
	src, dst := rmaPools(t, 5)
	p, _ := newDevicePair(t, rmaConfig(), rmaConfig(), false, true)
	var held []*buffer.Slot
	for {
		s, err := p.dst.pool.TryLease()
		if err != nil {
			break
		}
		held = append(held, s)
	}
	require.NotEmpty(t, held)
	hs, err := p.src.Send(bg, Spec{ID: 1, Peer: "decode", Plan: src.plan, Device: p.srcT.register(src.mem), Mover: newHostMover(src.mem)})
	require.NoError(t, err)
	hr, err := p.dst.Receive(bg, Spec{ID: 1, Peer: "prefill", Plan: dst.plan, Device: p.dstT.register(dst.mem), Mover: newHostMover(dst.mem)})
	require.NoError(t, err)
	waitClosed(t, hr.Quiesced(), "receiver quiesced")
	waitClosed(t, hs.Quiesced(), "sender quiesced")
	releaseAll(held)
	requireState(t, hr, Failed)
	requireState(t, hs, Failed)
	var re *deviceRouteError
	require.ErrorAs(t, hr.Status().Err, &re)
	require.Contains(t, re.Reason, "no staging slot was free")
	require.Zero(t, p.dstT.holds.Load(), "the receiver's registration let go")
}
