// SPDX-License-Identifier: Apache-2.0

// Package cuda runs kvxfer's gather and scatter on a GPU, with nothing CUDA needed to build.
//
// It loads two shared libraries at run time with purego (no cgo): the CUDA runtime
// (libcudart) and libkvxcuda.so, kvxfer's kernels behind a small C ABI (cuda/kvx_cuda.h). Open
// finds both, checks that the library's ABI matches this package, and opens one device. On a
// host without the libraries, the driver or a device, Open returns an error that matches
// ErrLibraryNotFound or ErrNoDevice with errors.Is, and callers use the host path (package
// native) instead; nothing here panics for a missing GPU.
//
// Lifecycle. A Runtime is one opened device; it hands out device memory (Buffer), streams,
// events and device copies of plans (DevicePlan), each freed by its own Free or Close, and a
// Runtime's Close refuses further calls. Gather, Scatter and Memcpy only enqueue work on a
// stream and return at once: the memory they touch must stay allocated until an Event recorded
// after them reports done. Event.Query never blocks, which is what the engine's non-blocking
// status polling needs; Event.Wait and Stream.Wait poll under a context, so no wait is
// unbounded (L4, L11).
//
// Memory travels as Mem, a device address and a size: a Buffer's, or one wrapped from memory
// allocated elsewhere (an inference engine's KV pool). The package never frees memory it did
// not allocate.
//
// Search order for the libraries (first hit wins):
//
//	libkvxcuda.so: Config.LibraryPath, else $KVX_CUDA_LIB (only that path when set); else
//	  next to the executable; build/cuda, build/gpu and build/release/cuda in the working
//	  directory or a parent (up to 8 levels);
//	  then the system loader ("libkvxcuda.so").
//	libcudart:     Config.RuntimePath, else $KVX_CUDART (only that path when set); else the
//	  system loader (libcudart.so.13, .so.12, /usr/local/cuda/lib64); then the PyPI toolkit
//	  that scripts/cuda-toolchain.sh installs under .toolchain/.
//
// The CUDA runtime's current device is per OS thread and goroutines move between threads, so
// every call into libkvxcuda names its device; callers need not lock OS threads.
package cuda
