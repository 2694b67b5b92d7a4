// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"unsafe"

	"github.com/ebitengine/purego"
)

// cudartAPI holds the few CUDA runtime entry points Go calls directly: enough to tell "no
// driver" from "no device" and to name errors, whichever libkvxcuda.so is loaded.
type cudartAPI struct {
	path string

	// cudaError_t cudaGetDeviceCount(int *count);
	getDeviceCount func(count *int32) int32
	// cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
	runtimeGetVersion func(v *int32) int32
	// cudaError_t cudaDriverGetVersion(int *driverVersion);
	driverGetVersion func(v *int32) int32
	// const char *cudaGetErrorName(cudaError_t error);
	getErrorName func(code int32) string
	// const char *cudaGetErrorString(cudaError_t error);
	getErrorString func(code int32) string
}

// kvxAPI is libkvxcuda.so's C ABI, kvx_cuda.h.
type kvxAPI struct {
	path string

	// int kvx_cuda_abi_version(void);
	abiVersion func() int32
	// int kvx_cuda_runtime_version(void);
	runtimeVersion func() int32
	// int64_t kvx_cuda_abi_offset(const char *name);
	abiOffset func(name string) int64
	// int kvx_cuda_open(int device);
	open func(device int32) int32
	// int kvx_cuda_device_info(int device, char *name, int64_t cap, int32_t *sm_count,
	//                          int32_t *cc_major, int32_t *cc_minor, int64_t *total_mem);
	deviceInfo func(device int32, name *byte, nameCap int64, sms, major, minor *int32, mem *int64) int32
	// int kvx_cuda_malloc(int device, uint64_t *ptr, int64_t bytes);
	malloc func(device int32, ptr *uint64, bytes int64) int32
	// int kvx_cuda_free(int device, uint64_t ptr);
	free func(device int32, ptr uint64) int32
	// int kvx_cuda_memset(int device, uint64_t ptr, int value, int64_t bytes, uint64_t stream);
	memset func(device int32, ptr uint64, value int32, bytes int64, stream uint64) int32
	// int kvx_cuda_memcpy(int device, uint64_t dst, uint64_t src, int64_t bytes, uint64_t stream);
	memcpy func(device int32, dst, src uint64, bytes int64, stream uint64) int32
	// int kvx_cuda_copy_to_device(int device, uint64_t dst, const void *src, int64_t bytes);
	copyToDevice func(device int32, dst uint64, src unsafe.Pointer, bytes int64) int32
	// int kvx_cuda_copy_to_host(int device, void *dst, uint64_t src, int64_t bytes);
	copyToHost func(device int32, dst unsafe.Pointer, src uint64, bytes int64) int32
	// int kvx_cuda_stream_create(int device, uint64_t *stream);
	streamCreate func(device int32, stream *uint64) int32
	// int kvx_cuda_stream_destroy(int device, uint64_t stream);
	streamDestroy func(device int32, stream uint64) int32
	// int kvx_cuda_stream_query(int device, uint64_t stream);
	streamQuery func(device int32, stream uint64) int32
	// int kvx_cuda_event_create(int device, uint64_t *event, int timing);
	eventCreate func(device int32, event *uint64, timing int32) int32
	// int kvx_cuda_event_destroy(int device, uint64_t event);
	eventDestroy func(device int32, event uint64) int32
	// int kvx_cuda_event_record(int device, uint64_t event, uint64_t stream);
	eventRecord func(device int32, event, stream uint64) int32
	// int kvx_cuda_event_query(int device, uint64_t event);
	eventQuery func(device int32, event uint64) int32
	// int kvx_cuda_event_elapsed(int device, float *ms, uint64_t start, uint64_t end);
	eventElapsed func(device int32, ms *float32, start, end uint64) int32
	// int kvx_cuda_gather(int device, const kvx_cuda_copy_t *c, uint64_t stream);
	gather func(device int32, c *copyArgs, stream uint64) int32
	// int kvx_cuda_scatter(int device, const kvx_cuda_copy_t *c, uint64_t stream);
	scatter func(device int32, c *copyArgs, stream uint64) int32
	// int kvx_cuda_spin(int device, int64_t ms, uint64_t stream);
	spin func(device int32, ms int64, stream uint64) int32
	// int kvx_cuda_emulate(const kvx_cuda_copy_t *c, int gather, int64_t ctas);
	emulate func(c *copyArgs, gather int32, ctas int64) int32
	// int kvx_cuda_vector_bytes(const kvx_cuda_copy_t *c);
	vectorBytes func(c *copyArgs) int32
	// uint32_t kvx_cuda_fastdiv(uint32_t d, uint32_t x);
	fastdiv func(d, x uint32) uint32
}

// symbol names one C function and the Go function variable it is bound to.
type symbol struct {
	name string
	fn   any // pointer to a func variable
}

func (a *cudartAPI) symbols() []symbol {
	return []symbol{
		{"cudaGetDeviceCount", &a.getDeviceCount},
		{"cudaRuntimeGetVersion", &a.runtimeGetVersion},
		{"cudaDriverGetVersion", &a.driverGetVersion},
		{"cudaGetErrorName", &a.getErrorName},
		{"cudaGetErrorString", &a.getErrorString},
	}
}

func (a *kvxAPI) symbols() []symbol {
	return []symbol{
		{"kvx_cuda_abi_version", &a.abiVersion},
		{"kvx_cuda_runtime_version", &a.runtimeVersion},
		{"kvx_cuda_abi_offset", &a.abiOffset},
		{"kvx_cuda_open", &a.open},
		{"kvx_cuda_device_info", &a.deviceInfo},
		{"kvx_cuda_malloc", &a.malloc},
		{"kvx_cuda_free", &a.free},
		{"kvx_cuda_memset", &a.memset},
		{"kvx_cuda_memcpy", &a.memcpy},
		{"kvx_cuda_copy_to_device", &a.copyToDevice},
		{"kvx_cuda_copy_to_host", &a.copyToHost},
		{"kvx_cuda_stream_create", &a.streamCreate},
		{"kvx_cuda_stream_destroy", &a.streamDestroy},
		{"kvx_cuda_stream_query", &a.streamQuery},
		{"kvx_cuda_event_create", &a.eventCreate},
		{"kvx_cuda_event_destroy", &a.eventDestroy},
		{"kvx_cuda_event_record", &a.eventRecord},
		{"kvx_cuda_event_query", &a.eventQuery},
		{"kvx_cuda_event_elapsed", &a.eventElapsed},
		{"kvx_cuda_gather", &a.gather},
		{"kvx_cuda_scatter", &a.scatter},
		{"kvx_cuda_spin", &a.spin},
		{"kvx_cuda_emulate", &a.emulate},
		{"kvx_cuda_vector_bytes", &a.vectorBytes},
		{"kvx_cuda_fastdiv", &a.fastdiv},
	}
}

// maxParentDirs bounds the walk up from the working directory when looking for build/ and
// .toolchain/: tests run in a package directory a few levels below the module root.
const maxParentDirs = 8

// libkvxcudaCandidates lists where to look for libkvxcuda.so, in order. An explicit path (the
// config's, else $KVX_CUDA_LIB) is the only candidate when given: a caller that names a
// library must not silently get another one.
func libkvxcudaCandidates(explicit string) []string {
	if explicit == "" {
		explicit = os.Getenv("KVX_CUDA_LIB")
	}
	if explicit != "" {
		return []string{explicit}
	}
	var c []string
	if exe, err := os.Executable(); err == nil {
		c = append(c, filepath.Join(filepath.Dir(exe), "libkvxcuda.so"))
	}
	for _, dir := range parentDirs() {
		c = append(c,
			filepath.Join(dir, "build", "cuda", "libkvxcuda.so"),
			filepath.Join(dir, "build", "gpu", "libkvxcuda.so"),
			filepath.Join(dir, "build", "release", "cuda", "libkvxcuda.so"))
	}
	return append(c, "libkvxcuda.so")
}

// cudartCandidates lists where to look for the CUDA runtime, in order (see libkvxcudaCandidates
// for the explicit path). The system's runtime comes before the PyPI wheel's because on a GPU
// host it is the one installed to match the driver.
func cudartCandidates(explicit string) []string {
	if explicit == "" {
		explicit = os.Getenv("KVX_CUDART")
	}
	if explicit != "" {
		return []string{explicit}
	}
	c := []string{
		"libcudart.so.13", "libcudart.so.12",
		"/usr/local/cuda/lib64/libcudart.so.13", "/usr/local/cuda/lib64/libcudart.so.12",
	}
	for _, dir := range parentDirs() {
		matches, _ := filepath.Glob(filepath.Join(dir, ".toolchain", "cuda-*", "nvidia", "cu13", "lib", "libcudart.so.13"))
		sort.Sort(sort.Reverse(sort.StringSlice(matches))) // newest pinned version first
		c = append(c, matches...)
	}
	return c
}

// parentDirs is the working directory and up to maxParentDirs of its parents.
func parentDirs() []string {
	dir, err := os.Getwd()
	if err != nil {
		return nil
	}
	dirs := []string{dir}
	for i := 0; i < maxParentDirs; i++ {
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dirs = append(dirs, parent)
		dir = parent
	}
	return dirs
}

// dlopen opens the first candidate that loads. RTLD_GLOBAL makes an already-loaded libcudart
// satisfy libkvxcuda.so's dependency on the same soname, so both share one runtime instance.
func dlopen(library string, candidates []string) (uintptr, string, error) {
	lerr := &LibraryError{Library: library}
	for _, path := range candidates {
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, path, nil
		}
		lerr.Tried = append(lerr.Tried, path)
		lerr.Reasons = append(lerr.Reasons, err.Error())
	}
	if len(candidates) == 0 {
		lerr.Tried, lerr.Reasons = []string{"(no candidates)"}, []string{"nothing to try"}
	}
	return 0, "", lerr
}

// bind checks every symbol with Dlsym before registering it, because RegisterLibFunc panics on
// a missing one and a stale library must be an error, not a crash.
func bind(library, path string, h uintptr, syms []symbol) error {
	for _, s := range syms {
		addr, err := purego.Dlsym(h, s.name)
		if err != nil || addr == 0 {
			return loadError(library, path, fmt.Sprintf("missing symbol %s (built from another version?)", s.name))
		}
		purego.RegisterFunc(s.fn, addr)
	}
	return nil
}

// loadError is the one way this file reports a library that opened but cannot be used.
func loadError(library, path, reason string) error {
	return &LibraryError{Library: library, Tried: []string{path}, Reasons: []string{reason}}
}

func loadCudart(explicit string) (*cudartAPI, error) {
	h, path, err := dlopen("libcudart", cudartCandidates(explicit))
	if err != nil {
		return nil, err
	}
	a := &cudartAPI{path: path}
	if err := bind("libcudart", path, h, a.symbols()); err != nil {
		return nil, err
	}
	return a, nil
}

func loadKvx(explicit string) (*kvxAPI, error) {
	h, path, err := dlopen("libkvxcuda.so", libkvxcudaCandidates(explicit))
	if err != nil {
		return nil, err
	}
	a := &kvxAPI{path: path}
	if err := bind("libkvxcuda.so", path, h, a.symbols()); err != nil {
		return nil, err
	}
	return a, nil
}
