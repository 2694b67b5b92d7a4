// SPDX-License-Identifier: Apache-2.0

//go:build gpu && cgo

// GPU-only, like package transfer's ucx_device_gpu_test.go: `make gpu-test` runs it against a CUDA-enabled UCX with
// KVX_EXPECT_UCX_CUDA=1; `go vet -tags gpu` compiles it everywhere. It has not run on a GPU yet
// (docs/gpu-results.md).

package ucx

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/native"
)

// Device memory the caller allocated (cudaMalloc), registered with RegisterDevice on two
// transports, read GPU to GPU with one RMA get of the whole region (cuda_ipc on one node): no
// staging, no kernel; every byte checked through the host, the bandwidth logged.
func TestUCXRegion_DeviceRegisteredMemoryGPUToGPU(t *testing.T) {
	rt := openGPU(t)
	const n = 64 << 20
	mk := func() *ucxTransport {
		tr, err := newTransport(Config{KeepaliveInterval: 200 * time.Millisecond, CloseTimeout: 2 * time.Second, StagingBytes: 1 << 20})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close(true) })
		if !tr.DeviceMemory() {
			if os.Getenv("KVX_EXPECT_UCX_CUDA") == "1" {
				t.Fatalf("UCX %s reports no CUDA memory with KVX_EXPECT_UCX_CUDA=1", native.UCXVersion())
			}
			t.Skipf("this UCX cannot register device memory")
		}
		return tr
	}
	src, dst := mk(), mk()
	sbuf, err := rt.Alloc(n)
	require.NoError(t, err)
	dbuf, err := rt.Alloc(n)
	require.NoError(t, err)
	want := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{9}).Read(want)
	require.NoError(t, rt.CopyToDevice(sbuf.Mem(), want))
	sreg, err := src.RegisterDevice(sbuf.Mem().Addr, n)
	require.NoError(t, err)
	dreg, err := dst.RegisterDevice(dbuf.Mem().Addr, n)
	require.NoError(t, err)
	require.Nil(t, sreg.Pool(), "Go never addresses device memory")
	t.Cleanup(func() {
		require.NoError(t, sreg.Unregister())
		require.NoError(t, dreg.Unregister())
		_ = sbuf.Free()
		_ = dbuf.Free()
	})

	addr, key := sreg.remoteKey()
	dst.mu.Lock()
	ep, err := dst.endpointLocked(src.Self())
	var rk *ucxRemoteKey
	if err == nil {
		rk, err = dst.remoteKeyLocked(src.Self(), 0, ep, key)
	}
	dst.mu.Unlock()
	require.NoError(t, err)
	began := time.Now()
	req := ep.Get(dreg.reg.mem, 0, n, addr, rk.rk)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, req.Wait(ctx))
	t.Logf("%d MiB GPU to GPU in one get: %.2f GB/s (UCX %s)", n>>20, float64(n)/time.Since(began).Seconds()/1e9, native.UCXVersion())
	got := make([]byte, n)
	require.NoError(t, rt.CopyFromDevice(got, dbuf.Mem()))
	require.True(t, bytes.Equal(want, got), "every byte")
}

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
