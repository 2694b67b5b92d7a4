// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"sync/atomic"
	"unsafe"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/cuda/internal/fakecuda"
)

func init() { fakecuda.NewRuntime = func(f *fakecuda.Faults) any { return newFakeRuntime(f) } }

// newFakeRuntime is a Runtime whose libkvxcuda entry points are Go functions that move no
// bytes: device memory is addresses only, and every call succeeds unless f says otherwise.
// Package cudatest hands it to tests of what runs over a GPU, on hosts without one.
func newFakeRuntime(f *fakecuda.Faults) *Runtime {
	answer := func(fn func() int32) int32 {
		if fn == nil {
			return codeSuccess
		}
		return fn()
	}
	launch := func(op string) int32 {
		if f.Launch == nil {
			return codeSuccess
		}
		return f.Launch(op)
	}
	var next atomic.Uint64 // device addresses and handles, never 0
	next.Store(1 << 40)
	alloc := func(n int64) uint64 { // 256-byte aligned, as cudaMalloc's, a gap between
		size := (uint64(n)+255)&^255 + 256
		return next.Add(size) - size
	}
	handle := func(h *uint64) int32 { *h = alloc(1); return codeSuccess }
	ok2 := func(int32, uint64) int32 { return codeSuccess }
	k := &kvxAPI{
		path:           "fake",
		abiVersion:     func() int32 { return 0 },
		runtimeVersion: func() int32 { return 0 },
		abiOffset:      func(string) int64 { return 0 },
		open:           func(int32) int32 { return codeSuccess },
		deviceInfo: func(_ int32, _ *byte, _ int64, _, _, _ *int32, _ *int64) int32 {
			return codeSuccess
		},
		malloc:        func(_ int32, p *uint64, n int64) int32 { *p = alloc(n); return codeSuccess },
		free:          ok2,
		memset:        func(int32, uint64, int32, int64, uint64) int32 { return codeSuccess },
		memcpy:        func(int32, uint64, uint64, int64, uint64) int32 { return codeSuccess },
		copyToDevice:  func(int32, uint64, unsafe.Pointer, int64) int32 { return codeSuccess },
		copyToHost:    func(int32, unsafe.Pointer, uint64, int64) int32 { return codeSuccess },
		streamCreate:  func(_ int32, s *uint64) int32 { return handle(s) },
		streamDestroy: ok2,
		streamQuery:   ok2,
		eventCreate:   func(_ int32, e *uint64, _ int32) int32 { return handle(e) },
		eventDestroy:  ok2,
		eventRecord:   func(int32, uint64, uint64) int32 { return answer(f.EventRecord) },
		eventQuery:    func(int32, uint64) int32 { return answer(f.EventQuery) },
		eventElapsed:  func(int32, *float32, uint64, uint64) int32 { return codeSuccess },
		gather:        func(int32, *copyArgs, uint64) int32 { return launch("gather") },
		scatter:       func(int32, *copyArgs, uint64) int32 { return launch("scatter") },
		spin:          func(int32, int64, uint64) int32 { return codeSuccess },
		emulate:       func(*copyArgs, int32, int64) int32 { return codeSuccess },
		vectorBytes:   func(*copyArgs) int32 { return 16 },
		fastdiv:       func(d, x uint32) uint32 { return x / d },
	}
	return &Runtime{kvx: k, info: DeviceInfo{Name: "fake", LibraryPath: "fake"}, log: zap.NewNop()}
}
