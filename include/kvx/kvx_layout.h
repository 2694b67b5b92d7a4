/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvx_layout.h: the paged KV-cache layout and the byte order of a transfer plan.
 *
 * This is the one place where kvxfer's index math lives. It compiles as plain C99 (the host
 * gather/scatter in native/, cgo) and as CUDA C++ (the kernels in cuda/), so the CPU path and
 * the GPU path cannot disagree about which byte goes where. It sits in include/kvx/, under
 * neither of them; both put include/ on the include path and write #include "kvx/kvx_layout.h".
 *
 * The structs are mirrored in Go (package github.com/kvxfer/kvxfer/layout); a Go test checks
 * sizes and offsets. Every field is int64_t: no padding, the same on every ABI we build for.
 *
 * Validation lives in Go (layout.Layout.Validate, layout.NewPlan). The helpers here assume
 * a validated layout; the host entry points re-check block ids and the pool span, which is
 * cheap, so that a bad call from C never reads or writes out of bounds.
 */
#ifndef KVX_LAYOUT_H
#define KVX_LAYOUT_H

#include <stdint.h>

#if defined(__CUDACC__)
#define KVX_HD static __host__ __device__ __forceinline__
#else
#define KVX_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A KV pool. A token's row (head_dim elements of elem_size bytes) is contiguous; every other
 * dimension has its own stride in bytes, so block-major pools
 * ([block][layer][kv][head][token][dim]) and layer-major pools ([layer][kv][block][...]) with
 * heads before or after tokens are all expressible.
 */
typedef struct kvx_layout {
  int64_t num_layers;       /* transformer layers held by this pool (this PP rank's) */
  int64_t kv_factor;        /* 2 for separate K and V, 1 for MLA's joint latent */
  int64_t num_heads;        /* KV heads held by this pool (this TP rank's) */
  int64_t head_dim;         /* elements per head per token */
  int64_t elem_size;        /* bytes per element: 1 (FP8), 2 (BF16/FP16) or 4 (FP32) */
  int64_t tokens_per_block; /* tokens per paged block; must match between peers */
  int64_t num_blocks;       /* blocks in the pool; block ids are 0..num_blocks-1 */
  int64_t stride_block;     /* bytes between block b and b+1 */
  int64_t stride_layer;     /* bytes between layer l and l+1 */
  int64_t stride_kv;        /* bytes between K and V (unused when kv_factor is 1) */
  int64_t stride_head;      /* bytes between head h and h+1 */
  int64_t stride_token;     /* bytes between token t and t+1 within a block */
} kvx_layout_t;

/* A half-open range of layers and of heads, in the pool's own indices. */
typedef struct kvx_selection {
  int64_t layer_begin;
  int64_t layer_end;
  int64_t head_begin;
  int64_t head_end;
} kvx_selection_t;

/*
 * The plan's byte stream is a sequence of units, one token row each, in the order
 *
 *     [layer][kv][block i][head][token]   (then head_dim elements)
 *
 * over the selected layers and heads and the plan's block list. Layers are outermost so that
 * a layer range is one contiguous range of the stream (PP splits, layer-wise streaming);
 * heads sit inside a block so a TP rank's share is one run per (layer, kv, block).
 */
KVX_HD int64_t kvx_row_bytes(const kvx_layout_t *l) { return l->head_dim * l->elem_size; }

KVX_HD int64_t kvx_sel_layers(const kvx_selection_t *s) { return s->layer_end - s->layer_begin; }

KVX_HD int64_t kvx_sel_heads(const kvx_selection_t *s) { return s->head_end - s->head_begin; }

/* Units in the stream of a plan over nblocks blocks. */
KVX_HD int64_t kvx_stream_units(const kvx_layout_t *l, const kvx_selection_t *s, int64_t nblocks) {
  return kvx_sel_layers(s) * l->kv_factor * nblocks * kvx_sel_heads(s) * l->tokens_per_block;
}

/* Bytes in the stream of a plan over nblocks blocks. */
KVX_HD int64_t kvx_stream_bytes(const kvx_layout_t *l, const kvx_selection_t *s, int64_t nblocks) {
  return kvx_stream_units(l, s, nblocks) * kvx_row_bytes(l);
}

/*
 * Units per contiguous run: how many consecutive stream units also lie back to back in the
 * pool. Tokens merge when token rows are packed; the selected heads merge too when each head
 * holds exactly its packed tokens. Copies move whole runs, so the longest run the strides
 * allow is what sets copy efficiency.
 */
KVX_HD int64_t kvx_run_units(const kvx_layout_t *l, const kvx_selection_t *s) {
  const int64_t row = kvx_row_bytes(l);
  if (l->tokens_per_block > 1 && l->stride_token != row) return 1;
  if (kvx_sel_heads(s) > 1 && l->stride_head != row * l->tokens_per_block) return l->tokens_per_block;
  return kvx_sel_heads(s) * l->tokens_per_block;
}

/* Byte offset in the pool of stream unit u. blocks holds the plan's block ids. */
KVX_HD int64_t kvx_unit_offset(const kvx_layout_t *l, const kvx_selection_t *s,
                               const int32_t *blocks, int64_t nblocks, int64_t u) {
  const int64_t tokens = l->tokens_per_block;
  const int64_t heads = kvx_sel_heads(s);
  const int64_t t = u % tokens;
  u /= tokens;
  const int64_t h = u % heads;
  u /= heads;
  const int64_t b = u % nblocks;
  u /= nblocks;
  const int64_t k = u % l->kv_factor;
  const int64_t layer = u / l->kv_factor;
  return (int64_t)blocks[b] * l->stride_block + (s->layer_begin + layer) * l->stride_layer +
         k * l->stride_kv + (s->head_begin + h) * l->stride_head + t * l->stride_token;
}

/*
 * Bytes a pool must span: the offset one past the highest byte any block can touch. Assumes a
 * validated layout (non-negative strides that do not overlap).
 */
KVX_HD int64_t kvx_pool_span(const kvx_layout_t *l) {
  return (l->num_blocks - 1) * l->stride_block + (l->num_layers - 1) * l->stride_layer +
         (l->kv_factor - 1) * l->stride_kv + (l->num_heads - 1) * l->stride_head +
         (l->tokens_per_block - 1) * l->stride_token + kvx_row_bytes(l);
}

#ifdef __cplusplus
}
#endif

#endif /* KVX_LAYOUT_H */
