// SPDX-License-Identifier: Apache-2.0

//go:build gpu && cgo

// GPU-only: `make gpu-test` builds this package against a CUDA-enabled UCX (scripts/ucx-cuda.sh)
// and runs these with KVX_EXPECT_UCX_CUDA=1; `go vet -tags gpu` (make cuda-vet) compiles them
// everywhere.

package transfer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/layout/layouttest"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// openGPU opens device 0, skipping only when the hardware or the CUDA libraries are absent.
func openGPU(t *testing.T) *cuda.Runtime {
	t.Helper()
	rt, err := cuda.Open(cuda.Config{})
	if errors.Is(err, cuda.ErrNoDevice) || errors.Is(err, cuda.ErrLibraryNotFound) {
		t.Skipf("no GPU here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close() })
	return rt
}

// deviceEngine is an Engine over a ucx.NewDevice transport.
type deviceEngine struct {
	tr *ucx.Transport
	e  *Engine
}

func newDeviceEngine(t *testing.T, rt *cuda.Runtime, cfg Config) *deviceEngine {
	t.Helper()
	cfg = cfg.withDefaults()
	tr, err := ucx.NewDevice(ucx.DeviceConfig{Runtime: rt, StagingBytes: int64(cfg.Tuning.NumSlots) * cfg.SlotBytes,
		UCX: ucx.Config{KeepaliveInterval: 200 * time.Millisecond, CloseTimeout: 2 * time.Second}})
	if os.Getenv("KVX_EXPECT_UCX_CUDA") != "1" && errors.Is(err, ucx.ErrDeviceMemory) && !errors.Is(err, ErrInvalidConfig) {
		t.Skipf("this UCX cannot move device memory (set KVX_EXPECT_UCX_CUDA=1 to make that a failure): %v", err)
	}
	require.NoError(t, err)
	cfg.StagingMemory = tr.StagingMemory()
	e, err := New(tr, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return &deviceEngine{tr: tr, e: e}
}

// devicePool is a KV pool in device memory with its host mirror.
type devicePool struct {
	buf  *cuda.Buffer
	host []byte
	l    layout.Layout
}

func newDevicePool(t *testing.T, rt *cuda.Runtime, l layout.Layout, seed uint64) *devicePool {
	t.Helper()
	host := make([]byte, l.SpanBytes())
	if seed != 0 {
		var key [32]byte
		key[0] = byte(seed)
		_, _ = rand.NewChaCha8(key).Read(host)
	}
	buf, err := rt.Alloc(l.SpanBytes())
	require.NoError(t, err)
	require.NoError(t, rt.CopyToDevice(buf.Mem(), host))
	t.Cleanup(func() { _ = buf.Free() })
	return &devicePool{buf: buf, host: host, l: l}
}

// Two engines in one process, pools and staging in device memory: each request's blocks move
// GPU to GPU through the kernels and UCX, and every byte is checked against the reference
// gather of the host mirrors.
func TestUCXDevice_TwoEnginesEveryByteChecked(t *testing.T) {
	rt := openGPU(t)
	cfg := ucxTestConfig()
	cfg.SlotBytes = 1 << 20
	src := newDeviceEngine(t, rt, cfg)
	dst := newDeviceEngine(t, rt, cfg)
	dims := layout.Dims{NumLayers: 8, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 256}
	for _, order := range []layout.Order{layout.BlockMajor, layout.LayerMajor} {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			sp := newDevicePool(t, rt, layout.Packed(dims, order), 1)
			dp := newDevicePool(t, rt, layout.Packed(dims, layout.BlockMajor), 0)
			r := rand.New(rand.NewPCG(2, uint64(order)))
			blocks := func() []int32 {
				perm := r.Perm(int(dims.NumBlocks))[:100]
				out := make([]int32, len(perm))
				for i, b := range perm {
					out[i] = int32(b)
				}
				return out
			}
			sPlan, err := layout.NewPlan(sp.l, sp.l.All(), blocks())
			require.NoError(t, err)
			dPlan, err := layout.NewPlan(dp.l, dp.l.All(), blocks())
			require.NoError(t, err)
			id := RequestID(100 + int(order))
			sm, err := src.tr.NewMover(id, sp.buf.Mem())
			require.NoError(t, err)
			defer func() { require.NoError(t, sm.Close()) }()
			dm, err := dst.tr.NewMover(id, dp.buf.Mem())
			require.NoError(t, err)
			defer func() { require.NoError(t, dm.Close()) }()
			hr, err := dst.e.Receive(t.Context(), Spec{ID: id, Peer: src.tr.Self(), Plan: dPlan, Mover: dm})
			require.NoError(t, err)
			hs, err := src.e.Send(t.Context(), Spec{ID: id, Peer: dst.tr.Self(), Plan: sPlan, Mover: sm})
			require.NoError(t, err)
			for _, h := range []*Handle{hr, hs} {
				waitQuiesced(t, h, 30*time.Second)
				require.NoError(t, h.Status().Err)
			}
			require.NoError(t, rt.CopyFromDevice(dp.host, dp.buf.Mem()))
			want := make([]byte, sPlan.Bytes())
			require.NoError(t, layouttest.ReferenceGather(sPlan, sp.host, want))
			got := make([]byte, dPlan.Bytes())
			require.NoError(t, layouttest.ReferenceGather(dPlan, dp.host, got))
			require.Equal(t, want, got, "the receiver's blocks hold the sender's stream")
		})
	}
}

// A host spec (no ucx.DeviceMover) on a device engine fails with ucx.ErrDeviceMemory, it never sends
// bytes nobody gathered.
func TestUCXDevice_HostSpecIsRefused(t *testing.T) {
	rt := openGPU(t)
	src := newDeviceEngine(t, rt, ucxTestConfig())
	dst := newDeviceEngine(t, rt, ucxTestConfig())
	dims := layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 8}
	l := layout.Packed(dims, layout.BlockMajor)
	p, err := layout.NewPlan(l, l.All(), []int32{1, 2, 3})
	require.NoError(t, err)
	hr, err := dst.e.Receive(t.Context(), Spec{ID: 9, Peer: src.tr.Self(), Plan: p, Pool: make([]byte, l.SpanBytes())})
	require.NoError(t, err)
	waitQuiesced(t, hr, 30*time.Second)
	require.ErrorIs(t, hr.Status().Err, ucx.ErrDeviceMemory)
}
