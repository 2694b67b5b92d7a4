/* SPDX-License-Identifier: Apache-2.0 */
/*
 * C tests of native/ucx_fifo.c, run by ctest under ASan and UBSan (make c-test), on a FIFO
 * laid out as UCX's posix transport lays it (the control block, then the elements): the tail
 * moves to the head only in the dead pid's block with plausible counters; the first claimed
 * and unwritten element is found across a lap; it is filled as an empty inline message with
 * the lap's owner bit, and nothing else is.
 */
#include "../ucx_fifo.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, "\n");                                                     \
      failures++;                                                                \
      return;                                                                    \
    }                                                                            \
  } while (0)

enum { fifo_size = 8, elem_size = 64, ctl = 192, pid = 4242 };
#define ARMED (UINT64_C(1) << 63)

static unsigned char *fifo;
static size_t fifo_len = ctl + fifo_size * elem_size;

static void set_ctl(uint64_t head, uint64_t tail, int32_t owner) {
  memcpy(fifo + 0, &head, 8);
  memcpy(fifo + 128, &tail, 8);
  memcpy(fifo + 136, &owner, 4);
}

static uint64_t tail_of(void) {
  uint64_t t;
  memcpy(&t, fifo + 128, 8);
  return t;
}

static unsigned char *elem(uint64_t i) { return fifo + ctl + (i % fifo_size) * elem_size; }

/* Marks elements [from, to) written for their laps, as a writer leaves them. */
static void write_elems(uint64_t from, uint64_t to) {
  for (uint64_t i = from; i < to; i++) elem(i)[0] = (unsigned char)(2 | ((i / fifo_size) & 1));
}

static void test_release(void) {
  uint64_t n = 99;
  set_ctl(ARMED | 20, 14, pid);
  CHECK(kvx_ucx_mm_fifo_release((uintptr_t)fifo, fifo_len, pid, fifo_size, &n) == KVX_FIFO_OK, "release");
  CHECK(n == 6 && tail_of() == 20, "unread %llu, tail %llu", (unsigned long long)n, (unsigned long long)tail_of());
  set_ctl(20, 14, pid + 1);
  CHECK(kvx_ucx_mm_fifo_release((uintptr_t)fifo, fifo_len, pid, fifo_size, &n) == KVX_FIFO_NOT_A_FIFO, "another pid");
  CHECK(tail_of() == 14, "tail untouched");
  set_ctl(30, 14, pid);
  CHECK(kvx_ucx_mm_fifo_release((uintptr_t)fifo, fifo_len, pid, fifo_size, &n) == KVX_FIFO_NOT_A_FIFO, "16 unread of 8");
  CHECK(kvx_ucx_mm_fifo_release((uintptr_t)fifo, 100, pid, fifo_size, &n) == KVX_FIFO_NOT_A_FIFO, "too short");
  CHECK(kvx_ucx_mm_fifo_release((uintptr_t)fifo + 8, fifo_len, pid, fifo_size, &n) == KVX_FIFO_NOT_A_FIFO, "misaligned");
}

static void test_unwritten_and_fill(void) {
  /* UCX starts every owner bit at 1 (unwritten in lap 0); elements 0..12 were claimed, all
   * written but 9 (lap 1: its slot still holds lap 0's element 1). */
  for (uint64_t i = 0; i < fifo_size; i++) elem(i)[0] = 1;
  write_elems(0, 9);   /* 0..7 in lap 0, 8 in lap 1 */
  write_elems(10, 13); /* 10..12 in lap 1; 9 claimed and never written */
  set_ctl(ARMED | 13, 6, pid); /* the reader released up to 6 */
  uint64_t idx = 0, head = 0;
  CHECK(kvx_ucx_mm_fifo_unwritten((uintptr_t)fifo, fifo_len, pid, fifo_size, elem_size, &idx, &head) == KVX_FIFO_OK, "scan");
  CHECK(idx == 9 && head == 13, "first unwritten %llu of head %llu", (unsigned long long)idx, (unsigned long long)head);

  CHECK(kvx_ucx_mm_fifo_fill((uintptr_t)fifo, fifo_len, pid, fifo_size, elem_size, 10, 31) == KVX_FIFO_NOT_A_FIFO, "written");
  CHECK(kvx_ucx_mm_fifo_fill((uintptr_t)fifo, fifo_len, pid, fifo_size, elem_size, 13, 31) == KVX_FIFO_NOT_A_FIFO, "not claimed");
  CHECK(kvx_ucx_mm_fifo_fill((uintptr_t)fifo, fifo_len, pid, fifo_size, elem_size, 5, 31) == KVX_FIFO_NOT_A_FIFO, "below the tail");
  CHECK(kvx_ucx_mm_fifo_fill((uintptr_t)fifo, fifo_len, pid + 1, fifo_size, elem_size, 9, 31) == KVX_FIFO_NOT_A_FIFO, "another pid");
  unsigned char before[elem_size];
  memcpy(before, elem(9), elem_size);
  memset(elem(9) + 1, 0xab, 3);
  CHECK(kvx_ucx_mm_fifo_fill((uintptr_t)fifo, fifo_len, pid, fifo_size, elem_size, 9, 31) == KVX_FIFO_OK, "fill");
  CHECK(elem(9)[0] == (2 | 1) && elem(9)[1] == 31 && elem(9)[2] == 0 && elem(9)[3] == 0,
        "element 9 (lap 1): flags %x id %d length %d %d", elem(9)[0], elem(9)[1], elem(9)[2], elem(9)[3]);
  CHECK(memcmp(elem(9) + 4, before + 4, elem_size - 4) == 0, "the descriptor fields after the length untouched");
  CHECK(kvx_ucx_mm_fifo_unwritten((uintptr_t)fifo, fifo_len, pid, fifo_size, elem_size, &idx, &head) == KVX_FIFO_OK, "scan");
  CHECK(idx == 13 && head == 13, "all written: %llu", (unsigned long long)idx);
  CHECK(kvx_ucx_mm_fifo_unwritten((uintptr_t)fifo, fifo_len, pid, 6, elem_size, &idx, &head) == KVX_FIFO_NOT_A_FIFO, "size not a power of two");
  CHECK(kvx_ucx_mm_fifo_unwritten((uintptr_t)fifo, fifo_len - 1, pid, fifo_size, elem_size, &idx, &head) == KVX_FIFO_NOT_A_FIFO, "elements past the end");
}

int main(void) {
  fifo = aligned_alloc(64, fifo_len);
  if (fifo == NULL) return 1;
  memset(fifo, 0, fifo_len);
  test_release();
  test_unwritten_and_fill();
  free(fifo);
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("ucx_fifo: ok\n");
  return 0;
}
