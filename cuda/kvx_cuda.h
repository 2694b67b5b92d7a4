/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvx_cuda.h: the C ABI of libkvxcuda.so, the one boundary between the CUDA code and Go.
 *
 * Go loads this library at run time with purego (package cuda), so the ABI is plain C with
 * fixed-width types only: device addresses, streams and events travel as uint64_t, which keeps
 * every struct free of pointer-size and padding questions and lets Go hold them as integers.
 * A Go test compares every struct's size and field offsets with its Go mirror through
 * kvx_cuda_abi_offset, so a field added on one side only fails `make test`.
 *
 * Every function returns a cudaError_t as int (0 is success) and takes the device ordinal:
 * the CUDA runtime's current device is per OS thread and Go moves goroutines between threads,
 * so each call sets it rather than trusting whatever the calling thread had.
 *
 * Nothing here blocks on the GPU except kvx_cuda_copy_to_host/kvx_cuda_copy_to_device (plain
 * cudaMemcpy, documented as synchronous). Waiting for work is done from Go by polling
 * kvx_cuda_event_query / kvx_cuda_stream_query under a deadline.
 */
#ifndef KVX_CUDA_H
#define KVX_CUDA_H

#include <stdint.h>

#include "kvx/kvx_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a function or struct below changes; Go refuses a library of another version. */
#define KVX_CUDA_ABI_VERSION 1

/*
 * One gather or scatter: stream bytes [offset, offset+length) of the plan (layout, selection,
 * block list) between the pool and a contiguous stream buffer. The block ids live in device
 * memory (blocks): a kernel reads them for every run, so they must be where the kernel is, and
 * the caller uploads them once per plan rather than once per launch. 176 bytes, no padding.
 */
typedef struct kvx_cuda_copy {
  kvx_layout_t layout;  /* the pool's layout (96 bytes) */
  kvx_selection_t sel;  /* selected layers and heads (32 bytes) */
  uint64_t blocks;      /* device address of nblocks int32 block ids */
  int64_t nblocks;      /* number of block ids in the plan */
  uint64_t pool;        /* device address of the pool's byte 0 */
  uint64_t buf;         /* device address of the stream buffer; it holds stream byte offset */
  int64_t offset;       /* first stream byte to move */
  int64_t length;       /* bytes to move; 0 succeeds at once */
} kvx_cuda_copy_t;

/* KVX_CUDA_ABI_VERSION of the library. */
int kvx_cuda_abi_version(void);

/* CUDART_VERSION the library was compiled against (e.g. 13020). */
int kvx_cuda_runtime_version(void);

/*
 * sizeof a struct of this ABI ("kvx_cuda_copy_t") or the offset of one of its fields
 * ("kvx_cuda_copy_t.length", "kvx_layout_t.stride_kv"); -1 for an unknown name.
 */
int64_t kvx_cuda_abi_offset(const char *name);

/* Makes device current, creates its primary context and caches its occupancy figures. */
int kvx_cuda_open(int device);

/* Device name (NUL-terminated, truncated to cap), SM count, compute capability, memory. */
int kvx_cuda_device_info(int device, char *name, int64_t cap, int32_t *sm_count, int32_t *cc_major,
                         int32_t *cc_minor, int64_t *total_mem);

/* cudaMalloc / cudaFree. */
int kvx_cuda_malloc(int device, uint64_t *ptr, int64_t bytes);
int kvx_cuda_free(int device, uint64_t ptr);

/* cudaMemsetAsync of bytes bytes to value on stream. */
int kvx_cuda_memset(int device, uint64_t ptr, int value, int64_t bytes, uint64_t stream);

/* Device-to-device copy on stream (cudaMemcpyAsync). */
int kvx_cuda_memcpy(int device, uint64_t dst, uint64_t src, int64_t bytes, uint64_t stream);

/* Synchronous host<->device copies (cudaMemcpy) for setup and tests, never for the data path. */
int kvx_cuda_copy_to_device(int device, uint64_t dst, const void *src, int64_t bytes);
int kvx_cuda_copy_to_host(int device, void *dst, uint64_t src, int64_t bytes);

/* A stream that does not synchronise with the legacy default stream. */
int kvx_cuda_stream_create(int device, uint64_t *stream);
int kvx_cuda_stream_destroy(int device, uint64_t stream);
/* 0 when all work on stream is done, cudaErrorNotReady (600) while some is pending. */
int kvx_cuda_stream_query(int device, uint64_t stream);

/* Events; timing != 0 enables kvx_cuda_event_elapsed (and costs a little on record). */
int kvx_cuda_event_create(int device, uint64_t *event, int timing);
int kvx_cuda_event_destroy(int device, uint64_t event);
int kvx_cuda_event_record(int device, uint64_t event, uint64_t stream);
/* Never blocks: 0 when the recorded work is done, cudaErrorNotReady (600) while it is not. */
int kvx_cuda_event_query(int device, uint64_t event);
/* Milliseconds between two completed timing events. */
int kvx_cuda_event_elapsed(int device, float *ms, uint64_t start, uint64_t end);

/*
 * Gather: buf[0, length) = stream bytes [offset, offset+length) read from the pool.
 * Scatter: the reverse. Both launch on stream and return at once; 0 bytes launch nothing.
 * The launcher checks what it can see (sizes, ranges, selection); block ids are trusted to
 * have been validated by layout.NewPlan before upload.
 */
int kvx_cuda_gather(int device, const kvx_cuda_copy_t *c, uint64_t stream);
int kvx_cuda_scatter(int device, const kvx_cuda_copy_t *c, uint64_t stream);

/*
 * Test support: runs the gather (gather != 0) or scatter kernel's own per-thread code on the
 * CPU, every work item and thread in turn, with c's pool, buf and blocks as HOST addresses,
 * and work items sized as for a grid of ctas CTAs. Hosts without a GPU test the kernels'
 * index math, tiling, vector-width choice and tail handling with it against the Go reference.
 * Every access is checked as the GPU would: outside the pool's span or the buffer returns
 * cudaErrorIllegalAddress (700), misaligned returns cudaErrorMisalignedAddress (716); the bad
 * access itself is skipped. Slow; never for the data path.
 */
int kvx_cuda_emulate(const kvx_cuda_copy_t *c, int gather, int64_t ctas);

/* The vector width in bytes (16, 8, 4, 2 or 1) a launch of c would copy with; 0 for an empty
 * range; minus a cudaError_t when c is invalid. For tests and tuning. */
int kvx_cuda_vector_bytes(const kvx_cuda_copy_t *c);

/* Test support: x / d through the kernels' multiply-and-shift division (valid for
 * 1 <= d < 2^31 and x < 2^31), run on the CPU. */
uint32_t kvx_cuda_fastdiv(uint32_t d, uint32_t x);

/*
 * Test helper: a one-thread kernel that spins for about `ms` milliseconds of GPU clock, so a
 * test can observe an event that is certainly unfinished. Bounded by ms, which is capped.
 */
int kvx_cuda_spin(int device, int64_t ms, uint64_t stream);

#ifdef __cplusplus
}
#endif

#endif /* KVX_CUDA_H */
