// SPDX-License-Identifier: Apache-2.0

//go:build gpu && cgo

// GPU-only, like ucx_device_gpu_test.go: `make gpu-test` runs these against the CUDA-enabled UCX
// of the libucx-cu12 wheel with KVX_EXPECT_UCX_CUDA=1 (scripts/gpu-test-ucx.sh); `go vet -tags
// gpu` compiles them everywhere. They ran on an H200 on 2026-11-27 and 2026-11-29
// (docs/gpu-results.md).

package transfer

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/native"
)

// newRegionEngine is an Engine over a plain ucx.Transport (every UCX transport, cuda_ipc and
// cuda_copy included) on which device pools are registered, skipping where this UCX cannot
// register CUDA memory unless KVX_EXPECT_UCX_CUDA=1 says it must.
func newRegionEngine(t *testing.T, cfg Config) *ucxEngine {
	t.Helper()
	u := newUCXEngine(t, "", "", cfg)
	if !ucxOf(u.tr).DeviceMemory() {
		if os.Getenv("KVX_EXPECT_UCX_CUDA") == "1" {
			t.Fatalf("UCX %s reports no CUDA memory with KVX_EXPECT_UCX_CUDA=1", native.UCXVersion())
		}
		t.Skipf("this UCX (%s) cannot register device memory", native.UCXVersion())
	}
	return u
}

// registerPool registers a device pool with u's transport for the test's length.
func registerPool(t *testing.T, u *ucxEngine, p *devicePool) DevicePool {
	t.Helper()
	r, err := u.tr.RegisterDevice(p.buf.Mem().Addr, p.l.SpanBytes())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Unregister()) })
	return DevicePool{Addr: r.Addr(), Len: r.Len()}
}

// Two engines in one process, each KV pool in cudaMalloc memory the test allocated and
// registered (RegisterDevice): the receiver's gets move the blocks GPU to GPU, path rma on
// both sides, no staging slot leased and the Movers given for staging never called; every
// byte checked through the host. A layout conversion has no gets to make and fails with
// ErrDeviceRoute, saying why. The bandwidth is logged.
func TestUCXRegion_DeviceRegisteredPoolsTakeRMA(t *testing.T) {
	rt := openGPU(t)
	cfg := ucxTestConfig()
	cfg.Tuning.DirectChunkBytes = 8 << 20
	src, dst := newRegionEngine(t, cfg), newRegionEngine(t, cfg)
	dims := layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 128}
	cases := []struct {
		desc     string
		dstOrder layout.Order
		wantErr  error
	}{
		{desc: "block-major both sides: gets", dstOrder: layout.BlockMajor},
		{desc: "layer-major receiver: no gets line up, refused", dstOrder: layout.LayerMajor, wantErr: ErrDeviceRoute},
	}
	for i, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			sp := newDevicePool(t, rt, layout.Packed(dims, layout.BlockMajor), uint64(i+1))
			dp := newDevicePool(t, rt, layout.Packed(dims, c.dstOrder), 0)
			ids := seqBlocks(0, 96)
			sPlan, err := layout.NewPlan(sp.l, sp.l.All(), ids)
			require.NoError(t, err)
			dPlan, err := layout.NewPlan(dp.l, dp.l.All(), seqBlocks(16, 96))
			require.NoError(t, err)
			id := RequestID(1700 + i)
			sm := &countingMover{Mover: noDeviceMover{}}
			dm := &countingMover{Mover: noDeviceMover{}}
			began := time.Now()
			hs, err := src.e.Send(t.Context(), Spec{ID: id, Peer: dst.tr.Self(), Plan: sPlan, Device: registerPool(t, src, sp), Mover: sm})
			require.NoError(t, err)
			hr, err := dst.e.Receive(t.Context(), Spec{ID: id, Peer: src.tr.Self(), Plan: dPlan, Device: registerPool(t, dst, dp), Mover: dm})
			require.NoError(t, err)
			waitQuiesced(t, hr, 60*time.Second)
			elapsed := time.Since(began)
			waitQuiesced(t, hs, 60*time.Second)
			if c.wantErr != nil {
				require.ErrorIs(t, hr.Status().Err, c.wantErr)
				require.Equal(t, Failed, hs.Status().State)
				return
			}
			require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
			require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
			require.Equal(t, PathRMA, hr.Path())
			require.Equal(t, PathRMA, hs.Path())
			require.Zero(t, sm.calls.Load()+dm.calls.Load(), "no staging: the Movers were never called")
			for _, e := range []*Engine{src.e, dst.e} {
				require.Zero(t, e.pool.Stats().Leased)
			}
			require.NoError(t, rt.CopyFromDevice(dp.host, dp.buf.Mem()))
			want, got := make([]byte, sPlan.Bytes()), make([]byte, dPlan.Bytes())
			require.NoError(t, layouttest.ReferenceGather(sPlan, sp.host, want))
			require.NoError(t, layouttest.ReferenceGather(dPlan, dp.host, got))
			require.True(t, bytes.Equal(want, got), "every byte")
			t.Logf("device-rma in-process: %d MiB in %v: %.2f GB/s (UCX %s)", len(want)>>20, elapsed,
				float64(len(want))/elapsed.Seconds()/1e9, native.UCXVersion())
		})
	}
}

// Two processes on this GPU, each KV pool in its own cudaMalloc memory registered with its
// transport: the receiver's gets read the sender's device blocks GPU to GPU (cuda_ipc), path
// rma on both sides, no staging; the receiving side checks every byte through the host. Each
// direction; the bandwidth goes to the log as "device-rma two-process", which
// scripts/gpu-test-ucx.sh prints beside ucx_perftest -m cuda.
func TestUCXRegion_DeviceTwoProcessesGPUToGPU(t *testing.T) {
	rt := openGPU(t)
	blocks := int64(128) // 256 MiB of Llama-3-8B KV
	if s := os.Getenv("KVX_DEVICE_RMA_BLOCKS"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		require.NoError(t, err)
		blocks = n
	}
	bin := peerproc.BuildEnginePeer(t)
	for _, mode := range []string{"engine-send", "engine-recv"} {
		t.Run(mode, func(t *testing.T) {
			local := newRegionEngine(t, ucxPeerTestConfig())
			peer := peerproc.Start(t, bin, append(ucxPeerArgs("", "", mode, blocks, 82, time.Minute), "-device")...)
			peer.Connect(t, string(local.tr.Self()))
			host, plan := ucxEnginePool(t, blocks, 5, mode == "engine-recv")
			buf, err := rt.Alloc(int64(len(host)))
			require.NoError(t, err)
			t.Cleanup(func() { _ = buf.Free() })
			require.NoError(t, rt.CopyToDevice(buf.Mem(), host))
			reg, err := local.tr.RegisterDevice(buf.Mem().Addr, int64(len(host)))
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, reg.Unregister()) })
			spec := Spec{ID: 82, Peer: Peer(peer.Addr), Plan: plan, Device: DevicePool{Addr: reg.Addr(), Len: reg.Len()}, Timeout: time.Minute}
			began := time.Now()
			var h *Handle
			if mode == "engine-send" {
				h, err = local.e.Receive(bg, spec)
			} else {
				h, err = local.e.Send(bg, spec)
			}
			require.NoError(t, err)
			waitQuiesced(t, h, time.Minute)
			elapsed := time.Since(began)
			require.Equal(t, Completed, h.Status().State, "%v", h.Status().Err)
			require.Equal(t, PathRMA, h.Path())
			require.Equal(t, PathRMA.String(), peer.Expect(t, "PATH ", time.Minute))
			require.Equal(t, Completed.String()+" OK", peer.Expect(t, "DONE ", time.Minute), "the peer checks every byte")
			require.Zero(t, local.e.pool.Stats().Leased)
			if mode == "engine-send" {
				want, _ := ucxEnginePool(t, blocks, 5, true)
				got := make([]byte, len(want))
				require.NoError(t, rt.CopyFromDevice(got, buf.Mem()))
				require.True(t, bytes.Equal(want, got), "every byte")
			}
			fmt.Printf("device-rma two-process %s: %d MiB in %v: %.2f GB/s (UCX %s, %s)\n", mode, plan.Bytes()>>20, elapsed,
				float64(plan.Bytes())/elapsed.Seconds()/1e9, native.UCXVersion(), rt.Info().Name)
		})
	}
}
