/* SPDX-License-Identifier: Apache-2.0 */
/*
 * C tests of native/ucx_log.c, run by ctest under ASan and UBSan (make c-test): UCX's log
 * lines, logged through UCX's own dispatch (ucs_warn, ucs_error), reach the queue in order
 * with their level and source while routing is on, wake the reader once per empty-to-busy
 * turn, are cut at KVX_UCX_LOG_MSG_MAX, and past KVX_UCX_LOG_QUEUE are dropped and counted,
 * never waited for, from several threads at once.
 */
#define _GNU_SOURCE
#include "../ucx_log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <ucs/debug/log_def.h>

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

static int wake_fd;

/* Reads every wake-up byte the pipe holds and returns how many there were. */
static int wakeups(void) {
  char buf[64];
  int n = 0;
  for (int i = 0; i < 1000; i++) {
    ssize_t r = read(wake_fd, buf, sizeof(buf));
    if (r <= 0) break;
    n += (int)r;
  }
  return n;
}

static int drain(void) {
  kvx_ucx_log_line_t l;
  int n = 0;
  while (n <= 2 * KVX_UCX_LOG_QUEUE && kvx_ucx_log_take(&l)) n++;
  return n;
}

static void test_install_once(void) {
  int again = kvx_ucx_log_install();
  CHECK(again == wake_fd, "a second install returns the same pipe (%d, %d)", again, wake_fd);
}

static void test_routing_off_leaves_ucx_printing(void) {
  kvx_ucx_log_route(0);
  ucs_warn("ucx_log_test: printed by UCX itself (routing off)");
  kvx_ucx_log_line_t l;
  CHECK(!kvx_ucx_log_take(&l), "nothing queued while routing is off");
  CHECK(wakeups() == 0, "no wake-up while routing is off");
}

static void test_lines_in_order(void) {
  kvx_ucx_log_route(1);
  int first = __LINE__ + 1;
  ucs_warn("ucx_log_test: line %d", 1);
  ucs_error("ucx_log_test: line %d", 2);
  ucs_warn("ucx_log_test: line %d", 3);
  kvx_ucx_log_route(0);
  CHECK(wakeups() == 1, "one wake-up for one turn from empty");
  kvx_ucx_log_line_t l;
  for (int i = 1; i <= 3; i++) {
    CHECK(kvx_ucx_log_take(&l), "line %d queued", i);
    char want[64];
    snprintf(want, sizeof(want), "ucx_log_test: line %d", i);
    CHECK(strcmp(l.msg, want) == 0, "line %d text: %s", i, l.msg);
    CHECK(l.level == (i == 2 ? UCS_LOG_LEVEL_ERROR : UCS_LOG_LEVEL_WARN), "line %d level %d", i, l.level);
    CHECK(strcmp(l.file, "ucx_log_test.c") == 0, "base name of the source: %s", l.file);
    CHECK(l.line == (unsigned)(first + i - 1), "line %d source line %u", i, l.line);
  }
  CHECK(!kvx_ucx_log_take(&l), "nothing more");
  CHECK(kvx_ucx_log_take_dropped() == 0, "nothing dropped");
}

static void test_long_line_cut(void) {
  static char longmsg[4 * KVX_UCX_LOG_MSG_MAX];
  memset(longmsg, 'x', sizeof(longmsg) - 1);
  kvx_ucx_log_route(1);
  ucs_warn("%s", longmsg);
  kvx_ucx_log_route(0);
  kvx_ucx_log_line_t l;
  CHECK(kvx_ucx_log_take(&l), "the long line queued");
  CHECK(strlen(l.msg) == KVX_UCX_LOG_MSG_MAX - 1, "cut to %d: %zu", KVX_UCX_LOG_MSG_MAX - 1, strlen(l.msg));
  wakeups();
}

#define FLOOD_THREADS 4
#define FLOOD_LINES 200 /* per thread: 800 in all, past the queue's 256 */

static void *flood(void *arg) {
  (void)arg;
  for (int i = 0; i < FLOOD_LINES; i++) ucs_warn("ucx_log_test: flood %d", i);
  return NULL;
}

static void test_full_queue_drops_and_counts(void) {
  kvx_ucx_log_route(1);
  pthread_t th[FLOOD_THREADS];
  for (int i = 0; i < FLOOD_THREADS; i++) pthread_create(&th[i], NULL, flood, NULL);
  for (int i = 0; i < FLOOD_THREADS; i++) pthread_join(th[i], NULL);
  kvx_ucx_log_route(0);
  int kept = drain();
  uint64_t dropped = kvx_ucx_log_take_dropped();
  CHECK(kept == KVX_UCX_LOG_QUEUE, "the queue held %d: %d", KVX_UCX_LOG_QUEUE, kept);
  CHECK((uint64_t)kept + dropped == FLOOD_THREADS * FLOOD_LINES, "kept %d + dropped %llu", kept,
        (unsigned long long)dropped);
  CHECK(kvx_ucx_log_take_dropped() == 0, "the count resets when taken");
  wakeups();
}

int main(void) {
  wake_fd = kvx_ucx_log_install();
  if (wake_fd < 0) {
    perror("kvx_ucx_log_install");
    return 1;
  }
  test_install_once();
  test_routing_off_leaves_ucx_printing();
  test_lines_in_order();
  test_long_line_cut();
  test_full_queue_drops_and_counts();
  if (failures) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("ucx_log_test: all passed\n");
  return 0;
}
