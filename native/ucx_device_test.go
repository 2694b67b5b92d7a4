// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// expectUCXCUDA reads KVX_EXPECT_UCX_CUDA: "1" where the UCX under test must reach CUDA
// memory (make gpu-test), "0" where it must not (make ucx-cuda-check on a host without a
// driver), unset where either is fine (go test with whatever UCX pkg-config found).
func expectUCXCUDA(t *testing.T) (want, set bool) {
	switch v := os.Getenv("KVX_EXPECT_UCX_CUDA"); v {
	case "":
		return false, false
	case "0", "1":
		return v == "1", true
	default:
		t.Fatalf("KVX_EXPECT_UCX_CUDA=%q: must be 0, 1 or unset", v)
		return false, false
	}
}

func TestUCX_MemoryTypeDetection(t *testing.T) {
	c, err := NewContext(ContextConfig{TLS: "posix,cma,self"})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()

	version := UCXVersion()
	require.Regexp(t, `^1\.[0-9]+\.[0-9]+`, version, "UCX reports its version as 1.x.y")
	if want := os.Getenv("KVX_EXPECT_UCX_VERSION"); want != "" {
		require.True(t, strings.HasPrefix(version, want), "linked against UCX %s, expected %s", version, want)
	}
	cases := []struct {
		desc string
		kind MemoryKind
		want bool
	}{
		{"host memory is always reachable", MemoryHost, true},
		{"a kind kvxfer does not know is never reachable", MemoryKind(7), false},
		{"a negative kind is never reachable", MemoryKind(-1), false},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			require.Equal(t, tc.want, c.Supports(tc.kind))
		})
	}
	if want, set := expectUCXCUDA(t); set {
		// A transport list must name a CUDA transport for UCX to reach device memory: UCX
		// 1.22 with "posix,cma,self" reports no CUDA memory type (the first GPU run,
		// docs/gpu-results.md); cuda_copy is named only where the build is expected to
		// have it.
		tls := "posix,cma,self"
		if want {
			tls += ",cuda_copy,cuda_ipc"
		}
		cc, err := NewContext(ContextConfig{TLS: tls})
		require.NoError(t, err)
		defer func() { require.NoError(t, cc.Close()) }()
		require.Equal(t, want, cc.Supports(MemoryCUDA), "UCX %s, transports %s: CUDA memory support (KVX_EXPECT_UCX_CUDA)", version, tls)
	}
	t.Logf("UCX %s, transports posix,cma,self: CUDA memory %v", version, c.Supports(MemoryCUDA))
}

func TestUCX_DeviceMemoryWithoutCUDAIsATypedError(t *testing.T) {
	c, err := NewContext(ContextConfig{TLS: "posix,cma,self"})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	if c.Supports(MemoryCUDA) {
		t.Skipf("UCX %s reaches CUDA memory: registration is covered by the gpu-tagged tests", UCXVersion())
	}
	host, err := c.Allocate(1 << 20)
	require.NoError(t, err)
	defer func() { require.NoError(t, host.Close()) }()
	hostPtr := unsafe.Pointer(unsafe.SliceData(host.Bytes()))

	cases := []struct {
		desc     string
		register func() (*Memory, error)
	}{
		{"RegisterDevice of a device address", func() (*Memory, error) { return c.RegisterDevice(0x7f0000000000, 1<<20) }},
		{"Register with MemoryCUDA", func() (*Memory, error) { return c.Register(hostPtr, 1<<20, MemoryCUDA) }},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			m, err := tc.register()
			require.Nil(t, m)
			require.ErrorIs(t, err, ErrMemoryType)
			require.ErrorIs(t, err, ErrNotSupported)
			var te *MemoryTypeError
			require.ErrorAs(t, err, &te)
			require.Equal(t, MemoryCUDA, te.Kind)
			require.Contains(t, err.Error(), "libucx-cu12", "the error names the fix")
			require.Contains(t, err.Error(), UCXVersion())
		})
	}
	// Nothing was registered: the context closes (deferred) without ErrBusy.
}

func TestUCX_RegisterRefusesBadArguments(t *testing.T) {
	c, err := NewContext(ContextConfig{TLS: "posix,cma,self"})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	host, err := c.Allocate(1 << 20)
	require.NoError(t, err)
	defer func() { require.NoError(t, host.Close()) }()
	hostPtr := unsafe.Pointer(unsafe.SliceData(host.Bytes()))

	cases := []struct {
		desc     string
		register func() (*Memory, error)
	}{
		{"an unknown memory kind", func() (*Memory, error) { return c.Register(hostPtr, 4096, MemoryKind(7)) }},
		{"a negative memory kind", func() (*Memory, error) { return c.Register(hostPtr, 4096, MemoryKind(-2)) }},
		{"a device address of zero", func() (*Memory, error) { return c.RegisterDevice(0, 4096) }},
		{"a device region of no bytes", func() (*Memory, error) { return c.RegisterDevice(0x7f0000000000, 0) }},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			m, err := tc.register()
			require.Nil(t, m)
			require.ErrorIs(t, err, ErrInvalidArgument)
		})
	}
	// A host registration through the same checked path still works.
	m, err := c.Register(hostPtr, 4096, MemoryHost)
	require.NoError(t, err)
	require.Equal(t, MemoryHost, m.Kind())
	require.NoError(t, m.Close())
}

func TestUCX_DeviceOpsRefuseHostRegions(t *testing.T) {
	p := newPair(t, "posix,cma,self")
	m := alloc(t, p.ctxA, 1<<16)
	cases := []struct {
		desc string
		post func() *Request
	}{
		{"TagSendDevice from host memory", func() *Request { return p.ab.TagSendDevice(m, 0, 4096, 1) }},
		{"TagRecvDevice into host memory", func() *Request { return p.ab.TagRecvDevice(m, 0, 4096, 1, ^uint64(0)) }},
		{"TagSendDevice from no memory", func() *Request { return p.ab.TagSendDevice(nil, 0, 4096, 1) }},
		{"GetDevice into host memory", func() *Request { return p.ab.GetDevice(m, 0, 4096, m.Addr(), nil) }},
		{"GetDevice into no memory", func() *Request { return p.ab.GetDevice(nil, 0, 4096, m.Addr(), nil) }},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			r := tc.post()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.ErrorIs(t, r.Wait(ctx), ErrInvalidArgument)
			require.Zero(t, m.InUse(), "a refused request pins nothing")
		})
	}
}

func TestUCX_RunOnThreadIsTheProgressThread(t *testing.T) {
	c, err := NewContext(ContextConfig{TLS: "posix,cma,self"})
	require.NoError(t, err)
	w, err := c.NewWorker(WorkerConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The worker's goroutine is locked to its thread: every call sees the same thread id,
	// which is not the caller's.
	tids := make([]int, 3)
	for i := range tids {
		require.NoError(t, w.RunOnThread(ctx, func() { tids[i] = syscall.Gettid() }))
	}
	require.Equal(t, tids[0], tids[1])
	require.Equal(t, tids[0], tids[2])
	require.NoError(t, w.Close())
	require.ErrorIs(t, w.RunOnThread(ctx, func() {}), ErrClosed, "a closed worker runs nothing")
	require.NoError(t, c.Close())
}
