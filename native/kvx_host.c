/* SPDX-License-Identifier: Apache-2.0 */
#include "kvx_host.h"

#include <stddef.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/*
 * Copies at or above this size stream their stores past the cache: the destination will not
 * be read again soon, and non-temporal stores skip the read-for-ownership that ordinary stores
 * pay, which is what glibc's memcpy does for large copies too. Smaller copies stay cached,
 * because a staging chunk is read again at once by the wire.
 */
#define KVX_STREAM_MIN (8ll << 20)

/* memcpy with non-temporal 16-byte stores; falls back to memcpy without SSE2. */
static void copy_stream(char *dst, const char *src, int64_t n) {
#if defined(__SSE2__)
  int64_t head = (int64_t)((16 - ((uintptr_t)dst & 15)) & 15);
  if (head > n) head = n;
  memcpy(dst, src, (size_t)head);
  dst += head;
  src += head;
  n -= head;
  while (n >= 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)src);
    __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
    _mm_stream_si128((__m128i *)dst, a);
    _mm_stream_si128((__m128i *)(dst + 16), b);
    _mm_stream_si128((__m128i *)(dst + 32), c);
    _mm_stream_si128((__m128i *)(dst + 48), d);
    dst += 64;
    src += 64;
    n -= 64;
  }
  memcpy(dst, src, (size_t)n);
#else
  memcpy(dst, src, (size_t)n);
#endif
}

/* Everything a copy relies on, checked before any byte moves. */
static int check(const kvx_layout_t *l, const kvx_selection_t *s, const int32_t *blocks,
                 int64_t nblocks, const void *pool, int64_t pool_bytes, int64_t off, int64_t len,
                 const void *buf) {
  if (!l || !s || !blocks || !pool || !buf) return KVX_ERR_NULL;
  if (l->num_layers <= 0 || l->kv_factor <= 0 || l->num_heads <= 0 || l->head_dim <= 0 ||
      l->elem_size <= 0 || l->tokens_per_block <= 0 || l->num_blocks <= 0 || nblocks <= 0)
    return KVX_ERR_LAYOUT;
  if (s->layer_begin < 0 || s->layer_end <= s->layer_begin || s->layer_end > l->num_layers ||
      s->head_begin < 0 || s->head_end <= s->head_begin || s->head_end > l->num_heads)
    return KVX_ERR_LAYOUT;
  for (int64_t i = 0; i < nblocks; i++)
    if (blocks[i] < 0 || blocks[i] >= l->num_blocks) return KVX_ERR_BLOCK_RANGE;
  const int64_t total = kvx_stream_bytes(l, s, nblocks);
  if (off < 0 || len < 0 || off > total || len > total - off) return KVX_ERR_STREAM_RANGE;
  if (pool_bytes < kvx_pool_span(l)) return KVX_ERR_POOL_SMALL;
  return KVX_OK;
}

/*
 * A stream unit's position as digits, least significant first: token, head (in the
 * selection), position in the block list, K/V, layer (in the selection). The walk advances it
 * by one run at a time with carries, so a run's pool offset costs a few multiplies instead of
 * kvx_unit_offset's four divisions, which cost more than copying a 256-byte run.
 */
typedef struct {
  int64_t d[5];
} kvx_pos;

enum { POS_TOKEN, POS_HEAD, POS_BLOCK, POS_KV, POS_LAYER };

static kvx_pos pos_of(const kvx_layout_t *l, const kvx_selection_t *s, int64_t nblocks, int64_t u) {
  const int64_t radix[4] = {l->tokens_per_block, kvx_sel_heads(s), nblocks, l->kv_factor};
  kvx_pos p;
  for (int i = 0; i < 4; i++) {
    p.d[i] = u % radix[i];
    u /= radix[i];
  }
  p.d[POS_LAYER] = u;
  return p;
}

static int64_t pos_offset(const kvx_layout_t *l, const kvx_selection_t *s, const int32_t *blocks,
                          const kvx_pos *p) {
  return (int64_t)blocks[p->d[POS_BLOCK]] * l->stride_block +
         (s->layer_begin + p->d[POS_LAYER]) * l->stride_layer + p->d[POS_KV] * l->stride_kv +
         (s->head_begin + p->d[POS_HEAD]) * l->stride_head + p->d[POS_TOKEN] * l->stride_token;
}

/*
 * The digit a run steps: kvx_run_units is one unit, one block's tokens of one head, or every
 * selected head's tokens, so a run always starts with the digits below it at zero.
 */
static int run_digit(const kvx_layout_t *l, int64_t run_units) {
  if (run_units == 1) return POS_TOKEN;
  if (run_units == l->tokens_per_block) return POS_HEAD;
  return POS_BLOCK;
}

/* Steps p by one at digit d, carrying into the digits above; the layer digit never wraps. */
static void pos_step(kvx_pos *p, int d, const int64_t radix[4]) {
  for (; d < POS_LAYER; d++) {
    if (++p->d[d] < radix[d]) return;
    p->d[d] = 0;
  }
  p->d[POS_LAYER]++;
}

/*
 * Walks the stream range run by run: each run is the longest stretch of consecutive stream
 * units that is also contiguous in the pool, so every memcpy is as long as the strides allow.
 */
static void copy_runs(const kvx_layout_t *l, const kvx_selection_t *s, const int32_t *blocks,
                      int64_t nblocks, char *pool, int64_t off, int64_t len, char *stream,
                      int gather) {
  const int nt = len >= KVX_STREAM_MIN;
  const int64_t run_units = kvx_run_units(l, s);
  const int64_t run_bytes = run_units * kvx_row_bytes(l);
  const int64_t radix[4] = {l->tokens_per_block, kvx_sel_heads(s), nblocks, l->kv_factor};
  const int digit = run_digit(l, run_units);
  kvx_pos pos = pos_of(l, s, nblocks, (off / run_bytes) * run_units);
  int64_t in = off % run_bytes;
  while (len > 0) {
    int64_t n = run_bytes - in;
    if (n > len) n = len;
    char *p = pool + pos_offset(l, s, blocks, &pos) + in;
    char *to = gather ? stream : p;
    const char *from = gather ? p : stream;
    if (nt)
      copy_stream(to, from, n);
    else
      memcpy(to, from, (size_t)n);
    stream += n;
    len -= n;
    pos_step(&pos, digit, radix);
    in = 0;
  }
#if defined(__SSE2__)
  if (nt) _mm_sfence(); /* order the streamed stores before the caller hands the bytes on */
#endif
}

int kvx_host_gather(const kvx_layout_t *l, const kvx_selection_t *s, const int32_t *blocks,
                    int64_t nblocks, const void *pool, int64_t pool_bytes, int64_t off, int64_t len,
                    void *dst) {
  int rc = check(l, s, blocks, nblocks, pool, pool_bytes, off, len, dst);
  if (rc != KVX_OK) return rc;
  copy_runs(l, s, blocks, nblocks, (char *)pool, off, len, (char *)dst, 1);
  return KVX_OK;
}

int kvx_host_scatter(const kvx_layout_t *l, const kvx_selection_t *s, const int32_t *blocks,
                     int64_t nblocks, const void *src, int64_t off, int64_t len, void *pool,
                     int64_t pool_bytes) {
  int rc = check(l, s, blocks, nblocks, pool, pool_bytes, off, len, src);
  if (rc != KVX_OK) return rc;
  copy_runs(l, s, blocks, nblocks, (char *)pool, off, len, (char *)src, 0);
  return KVX_OK;
}

void kvx_host_copy(void *dst, const void *src, int64_t len) {
  if (len > 0) memcpy(dst, src, (size_t)len);
}

void kvx_host_copy_streaming(void *dst, const void *src, int64_t len) {
  if (len <= 0) return;
  copy_stream((char *)dst, (const char *)src, len);
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

int64_t kvx_layout_abi(int64_t field) {
  static const int64_t offs[] = {
      offsetof(kvx_layout_t, num_layers),     offsetof(kvx_layout_t, kv_factor),
      offsetof(kvx_layout_t, num_heads),      offsetof(kvx_layout_t, head_dim),
      offsetof(kvx_layout_t, elem_size),      offsetof(kvx_layout_t, tokens_per_block),
      offsetof(kvx_layout_t, num_blocks),     offsetof(kvx_layout_t, stride_block),
      offsetof(kvx_layout_t, stride_layer),   offsetof(kvx_layout_t, stride_kv),
      offsetof(kvx_layout_t, stride_head),    offsetof(kvx_layout_t, stride_token),
  };
  if (field < 0) return (int64_t)sizeof(kvx_layout_t);
  if (field >= (int64_t)(sizeof offs / sizeof offs[0])) return -1;
  return offs[field];
}

int64_t kvx_selection_abi(int64_t field) {
  static const int64_t offs[] = {
      offsetof(kvx_selection_t, layer_begin), offsetof(kvx_selection_t, layer_end),
      offsetof(kvx_selection_t, head_begin),  offsetof(kvx_selection_t, head_end),
  };
  if (field < 0) return (int64_t)sizeof(kvx_selection_t);
  if (field >= (int64_t)(sizeof offs / sizeof offs[0])) return -1;
  return offs[field];
}
