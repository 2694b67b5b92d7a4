// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/ucxhooks"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// A device spec on a UCX without CUDA (Debian's 1.13): without a Mover it is refused at Send
// and Receive with an ErrInvalidSpec matching ErrDeviceRoute, nothing registered, held or started;
// with one, the engine stages it (path staging, chosen automatically), every byte checked.
// The "device" pools here are host memory standing in behind the host mover: no GPU is needed to
// show the choice.
func TestUCXRegion_DeviceSpecWithoutCUDAStagesOrRefuses(t *testing.T) {
	src := newUCXEngine(t, "posix,cma,self", "", ucxTestConfig())
	dst := newUCXEngine(t, "posix,cma,self", "", ucxTestConfig())
	if ucxOf(src.tr).DeviceMemory() {
		t.Skip("this UCX reaches CUDA memory: the GPU tests cover it (make gpu-test)")
	}
	dims := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 8}
	s := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 4), 3)
	r := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(2, 4), 0)
	pretend := func(k *ucxKV) DevicePool { // Go memory never reaches UCX on the staging route
		return DevicePool{Addr: uint64(uintptr(unsafe.Pointer(&k.mem[0]))), Len: int64(len(k.mem))}
	}

	t.Run("no Mover: refused", func(t *testing.T) {
		for _, receive := range []bool{false, true} {
			spec := Spec{ID: 1600, Peer: dst.tr.Self(), Plan: s.plan, Device: pretend(s)}
			var err error
			if receive {
				_, err = src.e.Receive(bg, spec)
			} else {
				_, err = src.e.Send(bg, spec)
			}
			require.ErrorIs(t, err, ErrInvalidSpec)
			require.ErrorIs(t, err, ErrDeviceRoute)
			var se *specError
			require.ErrorAs(t, err, &se)
			require.Equal(t, "Device", se.Field)
			require.Zero(t, ucxhooks.Hooks.Registrations(src.tr), "nothing registered")
			src.e.mu.Lock()
			require.Empty(t, src.e.handles, "nothing started")
			src.e.mu.Unlock()
		}
	})

	t.Run("with a Mover: staging", func(t *testing.T) {
		hs, err := src.e.Send(bg, Spec{ID: 1601, Peer: dst.tr.Self(), Plan: s.plan, Device: pretend(s), Mover: newHostMover(s.mem)})
		require.NoError(t, err)
		hr, err := dst.e.Receive(bg, Spec{ID: 1601, Peer: src.tr.Self(), Plan: r.plan, Device: pretend(r), Mover: newHostMover(r.mem)})
		require.NoError(t, err)
		waitQuiesced(t, hr, 20*time.Second)
		waitQuiesced(t, hs, 20*time.Second)
		require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
		require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
		require.Equal(t, PathStaging, hr.Path())
		require.Equal(t, PathStaging, hs.Path())
		require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
	})
}

// The transport's device-RMA calls refuse what is not a device registration with a
// *transport.RegionError matching transport.ErrBadRegion (host memory it registered is named as such), hold
// nothing, and refuse everything once closed.
func TestUCXRegion_DeviceRMACallsRefuseHostMemory(t *testing.T) {
	u := newUCXEngine(t, "posix,cma,self", "", ucxTestConfig())
	page := os.Getpagesize()
	mem := mmapPool(t, 4*page, "anon")
	reg, err := u.tr.RegisterHost(mem)
	require.NoError(t, err)
	addr, n := reg.Addr(), reg.Len()
	checks := []struct {
		desc string
		call func() error
	}{
		{"CheckDevice", func() error { return ucxOf(u.tr).CheckDevice(addr, n) }},
		{"RMAKeyAt", func() error { _, _, err := ucxOf(u.tr).RMAKeyAt(addr, n); return err }},
		{"PostGetAt", func() error {
			_, err := ucxOf(u.tr).PostGetAt(u.tr.Self(), transport.Tag{}, mustKey(t, reg), addr, addr, n, func(transport.Completion) { t.Error("a refused get completed") })
			return err
		}},
		{"CheckDevice, zero length", func() error { return ucxOf(u.tr).CheckDevice(1<<40, 0) }},
	}
	for _, c := range checks {
		t.Run(c.desc, func(t *testing.T) {
			err := c.call()
			require.ErrorIs(t, err, transport.ErrBadRegion)
			var re *transport.RegionError
			require.ErrorAs(t, err, &re)
			if re.Len > 0 {
				require.Contains(t, re.Reason, "host memory")
			}
		})
	}
	require.Nil(t, ucxOf(u.tr).HoldDevice(addr, n), "host memory is never held as a device region")
	require.NoError(t, reg.Unregister())
	require.NoError(t, u.e.Close())
	require.ErrorIs(t, ucxOf(u.tr).CheckDevice(1<<40, 1<<20), ErrClosed)
}

// deviceGetsStandIn is a ucx.Transport that claims device gets over one host region, standing
// in for a CUDA-enabled UCX on a receiver: enough for the receiver to take the rma route and
// ask for an offer. Its gets are never posted here (the sender declines), and refuse if they are.
type deviceGetsStandIn struct {
	ucxImpl
	pool []byte
}

func (d *deviceGetsStandIn) DeviceGets() bool { return true }

func (d *deviceGetsStandIn) CheckDevice(addr uint64, n int64) error {
	base := uint64(uintptr(unsafe.Pointer(&d.pool[0])))
	if addr < base || n <= 0 || addr-base+uint64(n) > uint64(len(d.pool)) {
		return &transport.RegionError{Op: "check", Addr: addr, Len: n, Reason: "outside the stand-in's pool", Err: transport.ErrBadRegion}
	}
	return nil
}

func (d *deviceGetsStandIn) HoldDevice(addr uint64, n int64) func() {
	if d.CheckDevice(addr, n) != nil {
		return nil
	}
	return func() {}
}

func (d *deviceGetsStandIn) RMAKeyAt(addr uint64, n int64) (uint64, []byte, error) {
	return 0, nil, &transport.RegionError{Op: "key", Addr: addr, Len: n, Reason: "the stand-in offers nothing", Err: transport.ErrBadRegion}
}

func (d *deviceGetsStandIn) PostGetAt(transport.Peer, transport.Tag, []byte, uint64, uint64, int64, func(transport.Completion)) (transport.OpID, error) {
	return 0, &transport.RegionError{Op: "get", Reason: "the stand-in does no gets", Err: transport.ErrBadRegion}
}

// Over real UCX (shm, then TCP): a device receiver takes the rma route and the sender, a UCX
// without CUDA, declines it; with a Mover on both sides they stage instead and complete, every
// byte checked; without one on the receiver, both fail with an ErrDeviceRoute. The "device"
// pools are host memory behind the host mover.
func TestUCXRegion_DeviceRMADeclinedStages(t *testing.T) {
	for _, tls := range []string{"posix,cma,self", "tcp,self"} {
		t.Run(tls, func(t *testing.T) {
			dims := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 8}
			dev := ""
			if tls == "tcp,self" {
				dev = "lo"
			}
			src := newUCXEngine(t, tls, dev, ucxTestConfig())
			if ucxOf(src.tr).DeviceMemory() {
				t.Skip("this UCX reaches CUDA memory: the sender would offer; the GPU tests cover it (make gpu-test)")
			}
			r := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(2, 4), 0)
			cfg := ucxTestConfig().withDefaults()
			cfg.Tuning.NumSlots = cfg.MaxConcurrent * cfg.Tuning.PipelineDepth
			tr, err := ucx.New(ucx.Config{TLS: tls, NetDevices: dev, KeepaliveInterval: 200 * time.Millisecond,
				StagingBytes: int64(cfg.Tuning.NumSlots) * cfg.SlotBytes, CloseTimeout: 2 * time.Second,
				ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 3 * time.Second,
				ServeEmulatedRMA: true}) // device gets need RMA: a UCX over TCP only opens without it otherwise
			require.NoError(t, err)
			cfg.StagingMemory = tr.StagingMemory()
			dst, err := New(&deviceGetsStandIn{ucxImpl: ucxOf(tr), pool: r.mem}, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = dst.Close() })
			pretend := func(k *ucxKV) DevicePool {
				return DevicePool{Addr: uint64(uintptr(unsafe.Pointer(&k.mem[0]))), Len: int64(len(k.mem))}
			}
			for i, c := range []struct {
				desc     string
				dstMover bool
			}{{"Movers on both sides: staging", true}, {"no Mover on the receiver: refused", false}} {
				t.Run(c.desc, func(t *testing.T) {
					id := RequestID(1700 + i)
					s := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 4), uint64(3+i))
					clear(r.mem)
					rspec := Spec{ID: id, Peer: src.tr.Self(), Plan: r.plan, Device: pretend(r)}
					if c.dstMover {
						rspec.Mover = newHostMover(r.mem)
					}
					hs, err := src.e.Send(bg, Spec{ID: id, Peer: tr.Self(), Plan: s.plan, Device: pretend(s), Mover: newHostMover(s.mem)})
					require.NoError(t, err)
					hr, err := dst.Receive(bg, rspec)
					require.NoError(t, err)
					waitQuiesced(t, hr, 20*time.Second)
					waitQuiesced(t, hs, 20*time.Second)
					if !c.dstMover {
						require.Equal(t, Failed, hr.Status().State)
						require.Equal(t, Failed, hs.Status().State)
						require.ErrorIs(t, hr.Status().Err, ErrDeviceRoute)
						return
					}
					require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
					require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
					require.Equal(t, PathStaging, hr.Path())
					require.Equal(t, PathStaging, hs.Path())
					require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
				})
			}
		})
	}
}
