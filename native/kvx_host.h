/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvx_host.h: gather and scatter of a plan's byte stream on host memory.
 *
 * Same index math as the CUDA kernels (include/kvx/kvx_layout.h). Both calls copy the stream range
 * [off, off + len) of the plan over `blocks` and check everything they are given before they
 * touch memory: on any error nothing is read or written.
 */
#ifndef KVX_HOST_H
#define KVX_HOST_H

#include <stdint.h>

#include "kvx/kvx_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes of the host calls. */
enum {
  KVX_OK = 0,
  KVX_ERR_NULL = 1,         /* a required pointer is NULL */
  KVX_ERR_BLOCK_RANGE = 2,  /* a block id lies outside [0, num_blocks) */
  KVX_ERR_STREAM_RANGE = 3, /* [off, off+len) lies outside the plan's stream */
  KVX_ERR_POOL_SMALL = 4,   /* pool_bytes is less than the layout's span */
  KVX_ERR_LAYOUT = 5,       /* a dimension or selection is not positive / in range */
};

/* Copies stream bytes [off, off+len) of the plan out of the pool into dst. */
int kvx_host_gather(const kvx_layout_t *layout, const kvx_selection_t *sel, const int32_t *blocks,
                    int64_t nblocks, const void *pool, int64_t pool_bytes, int64_t off, int64_t len,
                    void *dst);

/* Copies len bytes from src into stream bytes [off, off+len) of the plan in the pool. */
int kvx_host_scatter(const kvx_layout_t *layout, const kvx_selection_t *sel, const int32_t *blocks,
                     int64_t nblocks, const void *src, int64_t off, int64_t len, void *pool,
                     int64_t pool_bytes);

/* Plain memcpy, so benchmarks compare against the same call path. */
void kvx_host_copy(void *dst, const void *src, int64_t len);

/* memcpy with the non-temporal stores that large gathers and scatters use. */
void kvx_host_copy_streaming(void *dst, const void *src, int64_t len);

/* sizeof and offsetof of the shared structs, for the Go mirror's ABI test. */
int64_t kvx_layout_abi(int64_t field);
int64_t kvx_selection_abi(int64_t field);

#ifdef __cplusplus
}
#endif

#endif /* KVX_HOST_H */
