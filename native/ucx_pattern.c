/* SPDX-License-Identifier: Apache-2.0 */
/* The byte pattern the tests and the soak fill and check transfers with (declared in ucx.h):
 * split from ucx.c, which it needs nothing of. */

#include "ucx.h"

#include <string.h>

static inline uint64_t mix(uint64_t x) {
  /* splitmix64's finaliser: cheap, and neighbouring words differ in every byte. */
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static inline uint8_t pattern_byte(uint64_t seed, uint64_t off) {
  return (uint8_t)(mix(seed ^ (off >> 3)) >> (8 * (off & 7)));
}

void kvx_ucx_pattern_fill(void *buf, uint64_t stream_off, size_t len, uint64_t seed) {
  uint8_t *b = buf;
  size_t i = 0;
  for (; i < len && ((stream_off + i) & 7) != 0; i++) b[i] = pattern_byte(seed, stream_off + i);
  for (; i + 8 <= len; i += 8) {
    uint64_t word = mix(seed ^ ((stream_off + i) >> 3));
    memcpy(b + i, &word, 8); /* little-endian: byte k of the word is byte k of the stream */
  }
  for (; i < len; i++) b[i] = pattern_byte(seed, stream_off + i);
}

int64_t kvx_ucx_pattern_check(const void *buf, uint64_t stream_off, size_t len, uint64_t seed) {
  const uint8_t *b = buf;
  size_t i = 0;
  for (; i < len && ((stream_off + i) & 7) != 0; i++)
    if (b[i] != pattern_byte(seed, stream_off + i)) return (int64_t)i;
  for (; i + 8 <= len; i += 8) {
    uint64_t word = mix(seed ^ ((stream_off + i) >> 3)), got;
    memcpy(&got, b + i, 8);
    if (got != word) {
      for (size_t k = 0; k < 8; k++)
        if (b[i + k] != pattern_byte(seed, stream_off + i + k)) return (int64_t)(i + k);
    }
  }
  for (; i < len; i++)
    if (b[i] != pattern_byte(seed, stream_off + i)) return (int64_t)i;
  return -1;
}

