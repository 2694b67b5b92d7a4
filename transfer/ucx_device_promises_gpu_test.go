// SPDX-License-Identifier: Apache-2.0

//go:build gpu && cgo

// The cross-path promises (docs/invariants.md) on the device routes over real UCX: the mem
// tables run them with a fake device (closePaths' device rows); these need a GPU and a
// CUDA-enabled UCX (`make gpu-test`, scripts/gpu-run.sh), and `go vet -tags gpu` compiles them
// everywhere. Their names hold "DeviceOverUCX", which scripts/gpu-run.sh runs as a step of its
// own.

package transfer

import (
	"bytes"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// deviceUCXRow is one device route over real UCX: gets between device pools registered with a
// plain transport over a CUDA-enabled UCX (Spec.Device, path rma), or staging through device
// slots and the gather and scatter kernels of a ucx.NewDevice transport (Spec.Mover, path
// staging).
type deviceUCXRow struct {
	name string
	gets bool
}

var deviceUCXRows = []deviceUCXRow{{"device gets", true}, {"device staging", false}}

// closePath is the row as closeMidTransfer's path: a gets row's handles hold a device pool
// (Spec.Device); a staging row's name their pools only through their Movers.
func (r deviceUCXRow) closePath() closePath {
	if r.gets {
		return closePath{name: r.name, cfg: func(*Config) {}, path: PathRMA, device: true}
	}
	return closePath{name: r.name, cfg: func(*Config) {}, path: PathStaging}
}

// deviceUCXSide is an engine of a device row with its KV pools in device memory, each with a
// host mirror (kv returns the mirror; closeSide.spec names its device pool or Mover).
type deviceUCXSide struct {
	closeSide
	rt    *cuda.Runtime
	tr    *ucx.Transport
	holds *deviceHoldCounter // gets rows: the device registrations its transfers hold
	mu    sync.Mutex
	bufs  map[*byte]*cuda.Buffer // by the mirror's first byte
}

// newDeviceUCXSide is an engine on row's route. hold: its transport holds the completions
// heldCompletions holds (the generation word's read: a gets row stays in flight, its bytes
// moved, until Close or a cancel); copyDelay > 0: a staging row's every gather and scatter
// takes that much longer, as a large chunk's on a busy GPU.
func newDeviceUCXSide(t *testing.T, rt *cuda.Runtime, row deviceUCXRow, cfg Config, d layout.Dims, hold bool, copyDelay time.Duration) *deviceUCXSide {
	t.Helper()
	s := &deviceUCXSide{rt: rt, bufs: map[*byte]*cuda.Buffer{}}
	if row.gets {
		s.holds = &deviceHoldCounter{}
		wrap := func(u ucxImpl) Transport {
			s.holds.ucxImpl = u
			if hold {
				s.holds.ucxImpl = &heldCompletions{ucxImpl: u}
			}
			return s.holds
		}
		u := newUCXEngineOver(t, "", "", cfg, wrap)
		requireDeviceUCX(t, ucxOf(u.tr).DeviceMemory())
		s.e, s.tr = u.e, u.tr
		s.device = func(pool []byte) DevicePool {
			b := s.buf(t, pool)
			r, err := s.tr.RegisterDevice(b.Mem().Addr, int64(len(pool)))
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Unregister() }) // after the engines' Close, which may have released it
			return DevicePool{Addr: r.Addr(), Len: r.Len()}
		}
		s.deviceHolds = s.holds.n.Load
	} else {
		de := newDeviceEngine(t, rt, cfg)
		s.e, s.tr = de.e, de.tr
		s.device = func([]byte) DevicePool { return DevicePool{} } // no Spec.Pool: the Mover names the pool
		s.mover = func(id RequestID, pool []byte) Mover {
			m, err := s.tr.NewMover(id, s.buf(t, pool).Mem())
			require.NoError(t, err)
			t.Cleanup(func() { _ = m.Close() })
			if copyDelay > 0 {
				return slowMover{Mover: m, delay: copyDelay}
			}
			return m
		}
	}
	s.self = s.tr.Self()
	s.kv = func(t testing.TB, ids []int32, seed uint64) ([]byte, *layout.Plan) {
		k := newUCXKV(t, d, layout.BlockMajor, ids, seed)
		b, err := rt.Alloc(int64(len(k.mem)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Free() })
		require.NoError(t, rt.CopyToDevice(b.Mem(), k.mem))
		s.mu.Lock()
		s.bufs[&k.mem[0]] = b
		s.mu.Unlock()
		return k.mem, k.plan
	}
	return s
}

// requireDeviceUCX fails (KVX_EXPECT_UCX_CUDA=1) or skips where this UCX cannot register
// device memory, as newRegionEngine does.
func requireDeviceUCX(t *testing.T, ok bool) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("KVX_EXPECT_UCX_CUDA") == "1" {
		t.Fatalf("UCX %s reports no CUDA memory with KVX_EXPECT_UCX_CUDA=1", native.UCXVersion())
	}
	t.Skipf("this UCX (%s) cannot register device memory", native.UCXVersion())
}

// buf is the device buffer of the pool whose host mirror is pool.
func (s *deviceUCXSide) buf(t testing.TB, pool []byte) *cuda.Buffer {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.bufs[&pool[0]]
	require.NotNil(t, b, "a pool this side's kv did not make")
	return b
}

// stream is what plan names in the device pool mirrored by pool, read back from the GPU.
func (s *deviceUCXSide) stream(t testing.TB, pool []byte, plan *layout.Plan) []byte {
	t.Helper()
	host := make([]byte, len(pool))
	require.NoError(t, s.rt.CopyFromDevice(host, s.buf(t, pool).Mem()))
	out := make([]byte, plan.Bytes())
	require.NoError(t, layouttest.ReferenceGather(plan, host, out))
	return out
}

// deviceHoldCounter counts the device registrations the engine over it holds (HoldDevice),
// for requireDeviceHolds: one per transfer, from its start until it is quiescent.
type deviceHoldCounter struct {
	ucxImpl
	n atomic.Int64
}

func (c *deviceHoldCounter) HoldDevice(addr uint64, n int64) func() {
	release := c.ucxImpl.HoldDevice(addr, n)
	if release == nil {
		return nil
	}
	c.n.Add(1)
	var once sync.Once
	return func() { once.Do(func() { c.n.Add(-1); release() }) }
}

// TestL1_DeviceOverUCXCloseWithTransfersInFlight is TestL1_UCXCloseWithTransfersInFlightOnEveryPath
// on the device routes (closeMidTransfer): an engine closed, the sender's or the receiver's,
// while device gets or the device staging slots' kernels and sends move a transfer. The
// process lives (nothing unregisters or frees device memory a get or a kernel still uses),
// every handle ends, no slot is lost, Close is what ended them, and a gets row's device
// registrations are held while, and only while, their handles are not quiescent.
func TestL1_DeviceOverUCXCloseWithTransfersInFlight(t *testing.T) {
	rt := openGPU(t)
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, row := range deviceUCXRows {
		for _, closeSender := range []bool{true, false} {
			side := map[bool]string{true: "sender", false: "receiver"}[closeSender]
			t.Run(row.name+"/close the "+side, func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.SlotBytes, cfg.Tuning.PipelineDepth, cfg.Tuning.CancelGrace = 1<<20, 4, time.Microsecond
				cfg.Tuning.QuarantineTimeout = 10 * time.Second // Close, not the timer, ends what is left
				mk := func() closeSide {
					return newDeviceUCXSide(t, rt, row, cfg, dims, true, 20*time.Millisecond).closeSide
				}
				closeMidTransfer(t, mk(), mk(), row.closePath(), closeSender, 32)
			})
		}
	}
}

// TestL10_DeviceOverUCXCancelIsTruthful is TestL10_UCXSendersCancelIsTruthfulOnEveryPath and
// TestL3_UCXReceiversCancelIsACleanCancelForTheSender on the device routes: one side cancels a
// 256 MiB transfer between device pools while its bytes move. A FreeNow answer finds Done and
// Quiesced closed; any other leaves Quiesced to close within the bound, nothing poisoned, no
// slot leased, no device registration held; a receiver that completed has every byte (read
// back from the GPU). The sender's cancel ends it Cancelled; the receiver's is a clean
// cancel for the sender (Cancelled by the peer's abort, no quarantine).
func TestL10_DeviceOverUCXCancelIsTruthful(t *testing.T) {
	rt := openGPU(t)
	big := layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 128}
	for _, row := range deviceUCXRows {
		for _, bySender := range []bool{true, false} {
			who := map[bool]string{true: "sender", false: "receiver"}[bySender]
			t.Run(row.name+"/the "+who+" cancels", func(t *testing.T) {
				cfg := ucxTestConfig()
				cfg.Tuning.CancelGrace = 5 * time.Second // a stranded operation outlives 5 s
				sq, rq := &quarantineCounter{}, &quarantineCounter{}
				scfg, rcfg := cfg, cfg
				scfg.Observer, rcfg.Observer = sq, rq
				src := newDeviceUCXSide(t, rt, row, scfg, big, false, 0)
				dst := newDeviceUCXSide(t, rt, row, rcfg, big, false, 0)
				ids := seqBlocks(0, 128)
				smem, splan := src.kv(t, ids, 97)
				dmem, dplan := dst.kv(t, ids, 0)
				hs, err := src.e.Send(bg, src.spec(Spec{ID: 99, Peer: dst.self, Plan: splan}, smem))
				require.NoError(t, err)
				hr, err := dst.e.Receive(bg, dst.spec(Spec{ID: 99, Peer: src.self, Plan: dplan}, dmem))
				require.NoError(t, err)
				require.Eventually(t, func() bool { return hr.Status().Bytes > 0 || isClosed(hr.Done()) }, 30*time.Second, 50*time.Microsecond)
				canceller, h := dst.e, hr
				if bySender {
					canceller, h = src.e, hs
				}
				out := canceller.Cancel(99)
				if out.FreeNow() {
					require.True(t, isClosed(h.Done()), "Cancel answered %v with Done open", out)
					require.True(t, isClosed(h.Quiesced()), "Cancel answered %v with Quiesced open", out)
				}
				t.Logf("cancel after %d bytes: %v", hr.Status().Bytes, out)
				waitQuiesced(t, hs, 20*time.Second)
				waitQuiesced(t, hr, 20*time.Second)
				want := map[bool]Path{true: PathRMA, false: PathStaging}[row.gets]
				require.Equal(t, want, hr.Path())
				require.Equal(t, want, hs.Path())
				for _, h := range []*Handle{hs, hr} {
					require.True(t, h.Status().State.Terminal(), "%+v", h.Status())
					require.False(t, h.Status().BlocksPoisoned, "%+v", h.Status())
				}
				require.Zero(t, sq.n.Load()+rq.n.Load(), "a quarantine: %v / %v", hs.Status().Err, hr.Status().Err)
				if hr.Status().State == Completed { // every byte arrived before the cancel took
					require.True(t, bytes.Equal(src.stream(t, smem, splan), dst.stream(t, dmem, dplan)), "every byte")
				}
				switch {
				case out == AlreadyComplete:
					require.Equal(t, Completed, h.Status().State)
				case bySender:
					require.Contains(t, []CancelOutcome{CancelRequestedInFlight, BackendUnhealthy}, out)
					require.Equal(t, Cancelled, hs.Status().State, "%v", hs.Status().Err)
					require.ErrorIs(t, hs.Status().Err, ErrCancelled)
				case hr.Status().State == Completed: // its last reads ended before the cancel reached them
					require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
				default:
					require.Contains(t, []CancelOutcome{CancelRequestedInFlight, BackendUnhealthy}, out)
					require.Equal(t, Cancelled, hr.Status().State, "%v", hr.Status().Err)
					require.Equal(t, Cancelled, hs.Status().State, "%v", hs.Status().Err)
					require.ErrorIs(t, hs.Status().Err, ErrPeerAborted)
				}
				for _, s := range []*deviceUCXSide{src, dst} {
					eventually(t, func() bool { return s.e.pool.Stats().Leased == 0 }, "every slot lease ended")
					requireSlotsAccounted(t, s.e)
					require.Zero(t, s.e.pool.Stats().Poisoned, "staging slots poisoned")
					if s.holds != nil {
						require.Zero(t, s.holds.n.Load(), "a device registration held after Quiesced")
					}
				}
			})
		}
	}
}

// TestL9_DeviceOverUCXPeerKilledMidTransfer is TestL9_UCXPeerKilledMidTransferOnEveryPath on the
// device gets route, the peer an enginepeer process on the same GPU (-device: its pool in
// cudaMalloc memory, registered): the peer is killed (SIGKILL) while the blocks move between the
// two device pools, this side receiving (its gets read the dead peer's memory) or sending (the
// peer reads this side's, and stops itself at its first bytes, -freeze, before the kill).
// This side's request ends within the loss bound, Failed with the peer named (or Completed,
// with every byte, where the receiver had them all first), quiesces, nothing poisoned, no
// quarantine, no slot leased and its device registration let go.
func TestL9_DeviceOverUCXPeerKilledMidTransfer(t *testing.T) {
	rt := openGPU(t)
	const lossBound = 10 * time.Second // docs/ucx.md, "A killed peer"
	bin := peerproc.BuildEnginePeer(t)
	for _, killed := range []string{"sender", "receiver"} {
		t.Run("killed "+killed, func(t *testing.T) {
			localSends := killed == "receiver"
			// 2 GiB of Llama-3-8B KV, in 2 MiB gets: at 256 MiB a receiving peer's gets once ended
			// before its 20 us poll saw any of them moved (-freeze: "missed").
			const blocks = 1024
			cfg := ucxPeerTestConfig()
			cfg.TransferTimeout = 60 * time.Second          // the loss, not a deadline, ends it
			cfg.Tuning.QuarantineTimeout = 15 * time.Second // a net for late verdicts
			cfg.Tuning.CancelGrace = 5 * time.Second
			q := &quarantineCounter{}
			cfg.Observer = q
			local, holds := deviceGetsEngine(t, cfg)
			mode := map[bool]string{true: "engine-recv", false: "engine-send"}[localSends] // the peer's
			args := append(ucxPeerArgs("", "", mode, blocks, 84, 2*time.Minute), "-device")
			if localSends {
				args = append(args, "-freeze") // it stops itself at its first bytes
			}
			peer := peerproc.Start(t, bin, args...)
			peer.Connect(t, string(local.tr.Self()))
			plan, pool, buf := enginePoolOnDevice(t, rt, local, blocks, 5, localSends)
			spec := Spec{ID: 84, Peer: Peer(peer.Addr), Plan: plan, Device: pool}
			peer.Expect(t, "FILLED", 60*time.Second)
			var h *Handle
			var err error
			if localSends {
				h, err = local.e.Send(bg, spec)
				require.NoError(t, err)
				if peer.Expect(t, "FREEZE ", 60*time.Second) == "missed" {
					waitQuiesced(t, h, 30*time.Second)
					t.Skip("the peer's request ended before it saw bytes moving: nothing to check")
				}
			} else {
				h, err = local.e.Receive(bg, spec)
				require.NoError(t, err)
				require.Eventually(t, func() bool { return h.Status().Bytes > 0 || isClosed(h.Done()) }, 60*time.Second, 20*time.Microsecond)
				if isClosed(h.Done()) {
					waitQuiesced(t, h, 30*time.Second)
					t.Skipf("the request ended before its bytes were seen moving (%v): nothing to check", h.Status().State)
				}
			}
			require.Equal(t, PathRMA, h.Path())
			peer.Signal(t, syscall.SIGKILL)
			at := time.Now()
			select {
			case <-h.Done():
			case <-time.After(lossBound + time.Second):
				require.FailNow(t, "not done after its peer was killed", "%v: %+v", time.Since(at), h.Status())
			}
			st := h.Status()
			t.Logf("%v after the kill: %v, %d of %d bytes (%v)", time.Since(at).Round(time.Millisecond), st.State, st.Bytes, st.Total, st.Err)
			if st.State == Completed {
				require.False(t, localSends && st.Bytes < st.Total, "a sender completes only on its receiver's Done")
				if !localSends { // every byte, read back from the GPU
					want, _ := ucxEnginePool(t, blocks, 5, true)
					got := make([]byte, len(want))
					require.NoError(t, rt.CopyFromDevice(got, buf.Mem()))
					require.True(t, bytes.Equal(want, got), "a completed transfer has every byte right")
				}
			} else {
				require.Equal(t, Failed, st.State, "%v", st.Err)
				var pl *PeerLostError
				require.True(t, errors.As(st.Err, &pl), "%v", st.Err)
				require.Equal(t, Peer(peer.Addr), pl.Peer)
			}
			select {
			case <-h.Quiesced():
			case <-time.After(cfg.Tuning.QuarantineTimeout + 5*time.Second):
			}
			st = h.Status()
			require.True(t, isClosed(h.Quiesced()), "not quiesced: %+v", st)
			require.False(t, st.BlocksPoisoned, "the dead peer can touch nothing: %+v", st)
			require.Zero(t, q.n.Load(), "a quarantine: %v", st.Err)
			require.Zero(t, holds.n.Load(), "the device registration held after Quiesced")
			require.Zero(t, local.e.pool.Stats().Leased)
			requireSlotsAccounted(t, local.e)
		})
	}
}
