/* SPDX-License-Identifier: Apache-2.0 */
/*
 * C tests of the host gather/scatter, run under AddressSanitizer and UBSan by `make c-test`.
 * The Go tests cover the semantics against a reference; these cover the C entry points' own
 * checks and memory safety, including the streaming (non-temporal) path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvx_host.h"

static int failures;
#define CHECK(cond)                                                       \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                         \
    }                                                                     \
  } while (0)

static kvx_layout_t block_major(int64_t layers, int64_t kv, int64_t heads, int64_t dim,
                                int64_t elem, int64_t tokens, int64_t blocks) {
  kvx_layout_t l = {layers, kv, heads, dim, elem, tokens, blocks, 0, 0, 0, 0, 0};
  l.stride_token = dim * elem;
  l.stride_head = l.stride_token * tokens;
  l.stride_kv = l.stride_head * heads;
  l.stride_layer = l.stride_kv * kv;
  l.stride_block = l.stride_layer * layers;
  return l;
}

/* gather then scatter into a second pool restores the listed blocks, byte for byte. */
static void test_round_trip(int64_t tokens_mult) {
  kvx_layout_t l = block_major(3, 2, 4, 8, 2, 4 * tokens_mult, 5);
  kvx_selection_t s = {0, 3, 0, 4};
  int32_t blocks[] = {3, 0, 4};
  int64_t span = kvx_pool_span(&l), n = kvx_stream_bytes(&l, &s, 3);
  unsigned char *pool = malloc(span), *back = calloc(1, span), *stream = malloc(n);
  for (int64_t i = 0; i < span; i++) pool[i] = (unsigned char)(i * 13 + 1);
  CHECK(kvx_host_gather(&l, &s, blocks, 3, pool, span, 0, n, stream) == KVX_OK);
  /* scatter in two uneven pieces */
  CHECK(kvx_host_scatter(&l, &s, blocks, 3, stream, 0, n / 3, back, span) == KVX_OK);
  CHECK(kvx_host_scatter(&l, &s, blocks, 3, stream + n / 3, n / 3, n - n / 3, back, span) == KVX_OK);
  for (int b = 0; b < 3; b++) {
    int64_t at = blocks[b] * l.stride_block;
    CHECK(memcmp(pool + at, back + at, (size_t)l.stride_block) == 0);
  }
  /* blocks 1 and 2 were not listed: untouched */
  for (int64_t i = 1 * l.stride_block; i < 3 * l.stride_block; i++)
    if (back[i] != 0) {
      CHECK(back[i] == 0);
      break;
    }
  free(pool);
  free(back);
  free(stream);
}

/* every refusal leaves both buffers as they were */
static void test_refusals(void) {
  kvx_layout_t l = block_major(2, 2, 2, 4, 2, 2, 3);
  kvx_selection_t s = {0, 2, 0, 2};
  int32_t good[] = {2, 0}, bad[] = {2, 3};
  int64_t span = kvx_pool_span(&l), n = kvx_stream_bytes(&l, &s, 2);
  unsigned char *pool = malloc(span), *buf = malloc(n);
  memset(pool, 7, span);
  memset(buf, 9, n);
  kvx_selection_t bad_sel = {0, 3, 0, 2};
  CHECK(kvx_host_gather(&l, &s, bad, 2, pool, span, 0, n, buf) == KVX_ERR_BLOCK_RANGE);
  CHECK(kvx_host_gather(&l, &s, good, 2, pool, span - 1, 0, n, buf) == KVX_ERR_POOL_SMALL);
  CHECK(kvx_host_gather(&l, &s, good, 2, pool, span, 1, n, buf) == KVX_ERR_STREAM_RANGE);
  CHECK(kvx_host_gather(&l, &s, good, 2, pool, span, -1, 1, buf) == KVX_ERR_STREAM_RANGE);
  CHECK(kvx_host_gather(&l, &bad_sel, good, 2, pool, span, 0, n, buf) == KVX_ERR_LAYOUT);
  CHECK(kvx_host_gather(NULL, &s, good, 2, pool, span, 0, n, buf) == KVX_ERR_NULL);
  CHECK(kvx_host_scatter(&l, &s, bad, 2, buf, 0, n, pool, span) == KVX_ERR_BLOCK_RANGE);
  CHECK(kvx_host_scatter(&l, &s, good, 2, buf, n, 1, pool, span) == KVX_ERR_STREAM_RANGE);
  for (int64_t i = 0; i < span; i++)
    if (pool[i] != 7) {
      CHECK(pool[i] == 7);
      break;
    }
  for (int64_t i = 0; i < n; i++)
    if (buf[i] != 9) {
      CHECK(buf[i] == 9);
      break;
    }
  free(pool);
  free(buf);
}

/* A range big enough for the non-temporal path, at an unaligned destination. */
static void test_streaming_path(void) {
  kvx_layout_t l = block_major(6, 2, 8, 128, 2, 32, 12); /* 12 MiB stream */
  kvx_selection_t s = {0, 6, 0, 8};
  int32_t blocks[] = {11, 2, 7, 0, 5, 9, 1, 3, 4, 6, 8, 10};
  int64_t span = kvx_pool_span(&l), n = kvx_stream_bytes(&l, &s, 12);
  CHECK(n - 1 >= (8ll << 20));
  unsigned char *pool = malloc(span), *stream = malloc(n + 1), *back = calloc(1, span);
  for (int64_t i = 0; i < span; i++) pool[i] = (unsigned char)(i * 7 + 3);
  CHECK(kvx_host_gather(&l, &s, blocks, 12, pool, span, 1, n - 1, stream + 1) == KVX_OK);
  CHECK(kvx_host_gather(&l, &s, blocks, 12, pool, span, 0, 1, stream) == KVX_OK);
  CHECK(kvx_host_scatter(&l, &s, blocks, 12, stream, 0, n, back, span) == KVX_OK);
  CHECK(memcmp(pool, back, (size_t)span) == 0);
  unsigned char *copy = malloc(n);
  kvx_host_copy_streaming(copy + 0, stream, n);
  CHECK(memcmp(copy, stream, (size_t)n) == 0);
  free(copy);
  free(pool);
  free(stream);
  free(back);
}

static void test_abi(void) {
  CHECK(kvx_layout_abi(-1) == 96);
  CHECK(kvx_selection_abi(-1) == 32);
  CHECK(kvx_layout_abi(11) == 88);
  CHECK(kvx_layout_abi(12) == -1);
}

int main(void) {
  test_round_trip(1);
  test_round_trip(3);
  test_refusals();
  test_streaming_path();
  test_abi();
  if (failures) {
    fprintf(stderr, "test_host: %d failed\n", failures);
    return 1;
  }
  printf("test_host: all passed\n");
  return 0;
}
