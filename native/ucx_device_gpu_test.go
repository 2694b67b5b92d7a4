// SPDX-License-Identifier: Apache-2.0

//go:build gpu && cgo

// GPU-only: run by `make gpu-test` (gpu-test-ucx) against the CUDA-enabled UCX of the
// libucx-cu12 wheel, compiled everywhere by `go vet -tags gpu` (make cuda-vet).

package native

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda"
)

// Device memory registered once moves between two workers with the typed tagged calls, every
// byte checked; closing with a request pending is refused (L2).
func TestUCX_DeviceMemoryTaggedTransfer(t *testing.T) {
	rt, err := cuda.Open(cuda.Config{})
	if errors.Is(err, cuda.ErrNoDevice) || errors.Is(err, cuda.ErrLibraryNotFound) {
		t.Skipf("no GPU here: %v", err)
	}
	require.NoError(t, err)
	defer rt.Close()

	p := newPair(t, "") // every transport UCX has, the cuda ones included
	if !p.ctxA.Supports(MemoryCUDA) {
		if os.Getenv("KVX_EXPECT_UCX_CUDA") == "1" {
			t.Fatalf("UCX %s cannot reach CUDA memory, KVX_EXPECT_UCX_CUDA=1 says it must", UCXVersion())
		}
		t.Skipf("UCX %s cannot reach CUDA memory", UCXVersion())
	}
	const size = 16 << 20
	bufA, err := rt.Alloc(size)
	require.NoError(t, err)
	defer func() { require.NoError(t, bufA.Free()) }()
	bufB, err := rt.Alloc(size)
	require.NoError(t, err)
	defer func() { require.NoError(t, bufB.Free()) }()
	host := make([]byte, size)
	_, _ = rand.NewChaCha8([32]byte{7}).Read(host)
	require.NoError(t, rt.CopyToDevice(bufA.Mem(), host))
	require.NoError(t, rt.CopyToDevice(bufB.Mem(), make([]byte, size)))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Register on each worker's thread, with the device's context current there.
	var memA, memB *Memory
	var errA, errB error
	require.NoError(t, p.a.RunOnThread(ctx, func() {
		s, err := rt.NewStream()
		if err == nil {
			_, err = s.Query()
			_ = s.Close()
		}
		if errA = err; err == nil {
			memA, errA = p.ctxA.RegisterDevice(bufA.Mem().Addr, size)
		}
	}))
	require.NoError(t, errA)
	require.NoError(t, p.b.RunOnThread(ctx, func() { memB, errB = p.ctxB.RegisterDevice(bufB.Mem().Addr, size) }))
	require.NoError(t, errB)
	require.Equal(t, MemoryCUDA, memA.Kind())
	require.Nil(t, memA.Bytes(), "device memory has no host view")

	for _, n := range []int64{64, 64 << 10, size} { // eager, and rendezvous sizes
		recv := p.ba.TagRecvDevice(memB, 0, n, uint64(n), ^uint64(0))
		send := p.ab.TagSendDevice(memA, 0, n, uint64(n))
		require.NoError(t, send.Wait(ctx), "send of %d bytes", n)
		require.NoError(t, recv.Wait(ctx), "receive of %d bytes", n)
		require.Equal(t, n, recv.Length())
		got := make([]byte, n)
		require.NoError(t, rt.CopyFromDevice(got, bufB.Mem()))
		require.Equal(t, host[:n], got, "%d bytes device to device", n)
	}
	info, err := p.ab.Info(ctx)
	require.NoError(t, err)
	t.Logf("UCX %s endpoint lanes:\n%s", UCXVersion(), info)

	pending := p.ba.TagRecvDevice(memB, 0, 4096, 999, ^uint64(0))
	require.ErrorIs(t, memB.Close(), ErrBusy, "a registration under a pending receive stays")
	pending.Cancel()
	require.ErrorIs(t, pending.Wait(ctx), ErrCancelled)
	require.NoError(t, memA.Close())
	require.NoError(t, memB.Close())
}
