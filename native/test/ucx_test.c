/* SPDX-License-Identifier: Apache-2.0 */
/*
 * C tests of native/ucx.c, run by ctest under ASan and UBSan (make c-test): two workers in
 * one process exchange tagged messages (contiguous and IOV) and RMA, receives are cancelled
 * before and after they match, an endpoint with a send in flight is force-closed, and every
 * request posted is checked to be completed and freed exactly once (L6).
 *
 * Usage: ucx_test [TLS [shm|tcp]]: the UCX_TLS list (default "posix,cma,self") and the kind
 * of lane the endpoints must use (default: tcp when the list names tcp). ctest runs it over
 * shared memory, over TCP, and over "posix,sysv,cma,tcp,self" expecting shared memory: the
 * UCX 1.13 trap where PEER error handling silently moves loopback traffic to TCP.
 */
#define _POSIX_C_SOURCE 200809L
#include "../ucx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define MAX_OPS 64

static int failures;

#define CHECK(cond, ...)                                             \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                  \
      fprintf(stderr, "\n");                                         \
      failures++;                                                    \
      return;                                                        \
    }                                                                \
  } while (0)

/* One record per posted op: how many times on_done reported it, and with what. */
typedef struct op {
  int done_count;
  ucs_status_t status;
  size_t length;
} op_t;

static op_t ops[MAX_OPS];
static int ep_errors;

static void on_done(void *arg, uint64_t user, ucs_status_t status, size_t length) {
  (void)arg;
  if (user >= MAX_OPS) abort();
  ops[user].done_count++;
  ops[user].status = status;
  ops[user].length = length;
}

static void on_ep_error(void *arg, uint64_t user, ucs_status_t status) {
  (void)arg;
  (void)user;
  (void)status;
  ep_errors++;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct pair {
  ucp_context_h ctx;
  kvx_ucx_worker_t *a, *b;
  kvx_ucx_ep_t *ab, *ba; /* a's endpoint to b, b's endpoint to a */
} pair_t;

/* Records an op's post result: inline outcomes count as its one completion. */
/* Records an op's post result: inline outcomes count as its one completion. A post that
 * returned UCS_INPROGRESS without a request was called back from inside the post, so its
 * record must already hold that one completion. Call reset(id) before posting. */
static void posted(int id, ucs_status_t st, void *req) {
  if (st != UCS_INPROGRESS) {
    if (ops[id].done_count != 0) abort(); /* an inline result after a callback: L6 broken */
    ops[id].done_count = 1;
    ops[id].status = st;
  } else if (req == NULL && ops[id].done_count != 1) {
    abort();
  }
}

static void reset(int id) { memset(&ops[id], 0, sizeof(ops[id])); }

/* Progresses both workers until op id completed, for at most seconds. */
static int wait_op(pair_t *p, int id, double seconds) {
  double end = now_s() + seconds;
  while (ops[id].done_count == 0 && now_s() < end) {
    kvx_ucx_progress(p->a, 64);
    if (p->b != NULL) kvx_ucx_progress(p->b, 64);
  }
  return ops[id].done_count;
}

static void drain(pair_t *p, double seconds) {
  double end = now_s() + seconds;
  while (now_s() < end) {
    kvx_ucx_progress(p->a, 64);
    if (p->b != NULL) kvx_ucx_progress(p->b, 64);
  }
}

static int pair_open(pair_t *p, const char *tls) {
  memset(p, 0, sizeof(*p));
  kvx_ucx_ctx_config_t cfg = {.tls = tls, .keepalive_interval = "200ms", .with_rma = 1};
  if (kvx_ucx_context_create(&cfg, &p->ctx) != UCS_OK) return -1;
  if (kvx_ucx_worker_create(p->ctx, on_done, on_ep_error, NULL, &p->a) != UCS_OK) return -1;
  if (kvx_ucx_worker_create(p->ctx, on_done, on_ep_error, NULL, &p->b) != UCS_OK) return -1;
  void *addr_a, *addr_b;
  size_t la, lb;
  if (kvx_ucx_worker_address(p->a, &addr_a, &la) != UCS_OK) return -1;
  if (kvx_ucx_worker_address(p->b, &addr_b, &lb) != UCS_OK) return -1;
  ucs_status_t s1 = kvx_ucx_ep_create(p->a, addr_b, lb, 100, &p->ab);
  ucs_status_t s2 = kvx_ucx_ep_create(p->b, addr_a, la, 200, &p->ba);
  free(addr_a);
  free(addr_b);
  return s1 == UCS_OK && s2 == UCS_OK ? 0 : -1;
}

static void close_ep(pair_t *p, kvx_ucx_ep_t *ep, int force, int id) {
  void *req;
  reset(id);
  ucs_status_t st = kvx_ucx_ep_close(ep, force, (uint64_t)id, &req);
  posted(id, st, req);
  wait_op(p, id, 5.0);
  kvx_ucx_ep_release(ep);
}

static void pair_close(pair_t *p) {
  if (p->ab != NULL) close_ep(p, p->ab, 1, MAX_OPS - 1);
  if (p->ba != NULL) close_ep(p, p->ba, 1, MAX_OPS - 2);
  kvx_ucx_worker_destroy(p->a);
  kvx_ucx_worker_destroy(p->b);
  kvx_ucx_context_destroy(p->ctx);
}

/* L6: every request that came back live was called back and freed once. */
static void check_l6(const char *name, kvx_ucx_worker_t *w) {
  const kvx_ucx_stats_t *s = &w->stats;
  CHECK(s->requests == s->callbacks && s->callbacks == s->freed,
        "%s: requests %llu callbacks %llu freed %llu", name, (unsigned long long)s->requests,
        (unsigned long long)s->callbacks, (unsigned long long)s->freed);
}

static void test_tag_roundtrip(pair_t *p, size_t len, int iov) {
  char *src = malloc(len), *dst = malloc(len);
  kvx_ucx_pattern_fill(src, 0, len, 7);
  memset(dst, 0, len);
  void *rreq, *sreq;
  size_t got = 0;
  ucs_status_t st;
  ucp_dt_iov_t siov[3], riov[2];
  reset(1);
  reset(2);
  if (iov) {
    /* Three send pieces into two receive pieces: UCX packs and unpacks across boundaries. */
    size_t a = len / 3, b = len / 2;
    siov[0] = (ucp_dt_iov_t){src, a};
    siov[1] = (ucp_dt_iov_t){src + a, b - a};
    siov[2] = (ucp_dt_iov_t){src + b, len - b};
    riov[0] = (ucp_dt_iov_t){dst, len / 4};
    riov[1] = (ucp_dt_iov_t){dst + len / 4, len - len / 4};
    st = kvx_ucx_tag_recv_iov(p->b, 42, ~0ULL, riov, 2, NULL, 1, &rreq, &got);
  } else {
    st = kvx_ucx_tag_recv(p->b, 42, ~0ULL, dst, len, 1, &rreq, &got);
  }
  posted(1, st, rreq);
  if (iov)
    st = kvx_ucx_tag_send_iov(p->ab, 42, siov, 3, 2, &sreq);
  else
    st = kvx_ucx_tag_send(p->ab, 42, src, len, 2, &sreq);
  posted(2, st, sreq);
  CHECK(wait_op(p, 1, 10.0) == 1, "recv of %zu bytes did not complete", len);
  CHECK(wait_op(p, 2, 10.0) == 1, "send of %zu bytes did not complete", len);
  CHECK(ops[1].status == UCS_OK && ops[2].status == UCS_OK, "status %d/%d", ops[1].status,
        ops[2].status);
  CHECK(ops[1].length == len, "received %zu of %zu", ops[1].length, len);
  int64_t bad = kvx_ucx_pattern_check(dst, 0, len, 7);
  CHECK(bad < 0, "len %zu iov %d: first wrong byte at %lld", len, iov, (long long)bad);
  free(src);
  free(dst);
}

static void test_rma(pair_t *p) {
  const size_t len = 3 << 20;
  ucp_mem_h remote_h, local_h;
  void *remote, *local;
  CHECK(kvx_ucx_mem_alloc(p->ctx, len, &remote_h, &remote) == UCS_OK, "mem_alloc");
  CHECK(kvx_ucx_mem_alloc(p->ctx, len, &local_h, &local) == UCS_OK, "mem_alloc");
  kvx_ucx_pattern_fill(local, 0, len, 9);
  memset(remote, 0, len);
  void *rk_buf;
  size_t rk_len;
  CHECK(kvx_ucx_rkey_pack(p->ctx, remote_h, &rk_buf, &rk_len) == UCS_OK, "rkey_pack");
  ucp_rkey_h rkey;
  CHECK(kvx_ucx_rkey_unpack(p->ab, rk_buf, &rkey) == UCS_OK, "rkey_unpack");
  free(rk_buf);
  void *req;
  { reset(3); ucs_status_t st_ = kvx_ucx_put(p->ab, local, len, (uint64_t)(uintptr_t)remote, rkey, 3, &req); posted(3, st_, req); }
  CHECK(wait_op(p, 3, 10.0) == 1 && ops[3].status == UCS_OK, "put: %d", ops[3].status);
  { reset(4); ucs_status_t st_ = kvx_ucx_ep_flush(p->ab, 4, &req); posted(4, st_, req); }
  CHECK(wait_op(p, 4, 10.0) == 1 && ops[4].status == UCS_OK, "flush: %d", ops[4].status);
  CHECK(kvx_ucx_pattern_check(remote, 0, len, 9) < 0, "put landed wrong");
  memset(local, 0, len);
  { reset(5); ucs_status_t st_ = kvx_ucx_get(p->ab, local, len, (uint64_t)(uintptr_t)remote, rkey, 5, &req); posted(5, st_, req); }
  CHECK(wait_op(p, 5, 10.0) == 1 && ops[5].status == UCS_OK, "get: %d", ops[5].status);
  CHECK(kvx_ucx_pattern_check(local, 0, len, 9) < 0, "get returned wrong bytes");
  kvx_ucx_rkey_destroy(rkey);
  CHECK(kvx_ucx_mem_release(p->ctx, remote_h) == UCS_OK, "unmap");
  CHECK(kvx_ucx_mem_release(p->ctx, local_h) == UCS_OK, "unmap");
}

/* A receive nobody sends to is cancelled: exactly one callback, UCS_ERR_CANCELED, and its
 * buffer untouched by a later message with the same tag. */
static void test_cancel_unmatched(pair_t *p) {
  char buf[64], msg[64];
  memset(buf, 0xab, sizeof(buf));
  memset(msg, 0x11, sizeof(msg));
  void *req;
  size_t got;
  reset(6);
  ucs_status_t st = kvx_ucx_tag_recv(p->b, 77, ~0ULL, buf, sizeof(buf), 6, &req, &got);
  CHECK(st == UCS_INPROGRESS && req != NULL, "unmatched recv completed: %d", st);
  posted(6, st, req);
  kvx_ucx_cancel(p->b, req);
  CHECK(wait_op(p, 6, 5.0) == 1, "cancelled recv never called back");
  CHECK(ops[6].status == UCS_ERR_CANCELED, "status %d", ops[6].status);
  /* A late sender: lands in UCX's unexpected queue, never in buf. */
  { reset(7); ucs_status_t st_ = kvx_ucx_tag_send(p->ab, 77, msg, sizeof(msg), 7, &req); posted(7, st_, req); }
  wait_op(p, 7, 5.0);
  drain(p, 0.05);
  for (size_t i = 0; i < sizeof(buf); i++)
    CHECK((unsigned char)buf[i] == 0xab, "cancelled buffer written at %zu", i);
  /* Drain the unexpected message so it does not leak into later tests. */
  { reset(8); ucs_status_t st_ = kvx_ucx_tag_recv(p->b, 77, ~0ULL, buf, sizeof(buf), 8, &req, &got); posted(8, st_, req); }
  CHECK(wait_op(p, 8, 5.0) == 1 && ops[8].status == UCS_OK, "drain recv: %d", ops[8].status);
  CHECK(ops[6].done_count == 1, "cancelled recv called back %d times", ops[6].done_count);
}

/* The race: the cancel arrives after the message matched. UCX ignores it; the receive
 * completes normally, once, with the data. Repeated with the cancel at varying points. */
static void test_cancel_races(pair_t *p) {
  enum { ROUNDS = 200 };
  const size_t len = 256 << 10; /* rendezvous-sized, so matching and completion are apart */
  char *src = malloc(len), *dst = malloc(len);
  kvx_ucx_pattern_fill(src, 0, len, 3);
  int cancelled = 0, completed = 0;
  for (int r = 0; r < ROUNDS; r++) {
    void *rreq, *sreq;
    size_t got;
    reset(10);
    ucs_status_t st = kvx_ucx_tag_recv(p->b, 500, ~0ULL, dst, len, 10, &rreq, &got);
    posted(10, st, rreq);
    { reset(11); ucs_status_t st_ = kvx_ucx_tag_send(p->ab, 500, src, len, 11, &sreq); posted(11, st_, sreq); }
    for (int k = 0; k < r % 7; k++) {
      kvx_ucx_progress(p->a, 1);
      kvx_ucx_progress(p->b, 1);
    }
    if (ops[10].done_count == 0 && rreq != NULL) kvx_ucx_cancel(p->b, rreq);
    CHECK(wait_op(p, 10, 5.0) == 1, "round %d: recv not called back", r);
    if (ops[10].status == UCS_ERR_CANCELED) {
      cancelled++;
      /* The send still goes somewhere: a fresh receive drains it. */
      { reset(12); ucs_status_t st_ = kvx_ucx_tag_recv(p->b, 500, ~0ULL, dst, len, 12, &rreq, &got); posted(12, st_, rreq); }
      CHECK(wait_op(p, 12, 5.0) == 1 && ops[12].status == UCS_OK, "round %d: drain", r);
    } else {
      CHECK(ops[10].status == UCS_OK, "round %d: status %d", r, ops[10].status);
      completed++;
    }
    CHECK(wait_op(p, 11, 5.0) == 1 && ops[11].status == UCS_OK, "round %d: send %d", r,
          ops[11].status);
    CHECK(kvx_ucx_pattern_check(dst, 0, len, 3) < 0, "round %d: wrong bytes", r);
    CHECK(ops[10].done_count == 1, "round %d: recv called back %d times", r, ops[10].done_count);
    memset(dst, 0, len);
  }
  printf("cancel races: %d cancelled before match, %d completed\n", cancelled, completed);
  free(src);
  free(dst);
}

/* A send in flight to a worker that never progresses cannot be cancelled; force-closing the
 * endpoint completes it with an error, exactly once. */
static void test_force_close_inflight(const char *tls) {
  pair_t p;
  CHECK(pair_open(&p, tls) == 0, "pair_open");
  drain(&p, 0.05); /* wire up both endpoints */
  const size_t len = 8 << 20;
  char *src = malloc(len);
  memset(src, 1, len);
  void *req;
  reset(20);
  ucs_status_t st = kvx_ucx_tag_send(p.ab, 900, src, len, 20, &req);
  posted(20, st, req);
  CHECK(st == UCS_INPROGRESS, "an unreceived 8 MiB send completed inline: %d", st);
  for (int i = 0; i < 100; i++) kvx_ucx_progress(p.a, 1); /* only the sender progresses */
  CHECK(ops[20].done_count == 0, "unreceived send completed");
  close_ep(&p, p.ab, 1, 21);
  p.ab = NULL;
  CHECK(ops[21].done_count == 1, "force close did not complete");
  CHECK(wait_op(&p, 20, 5.0) == 1, "send not completed by force close");
  CHECK(ops[20].status != UCS_OK, "send reported success after force close");
  printf("force close: in-flight send completed with %s\n", ucs_status_string(ops[20].status));
  free(src);
  check_l6("force-close sender", p.a);
  pair_close(&p);
}

/* Unexpected messages beyond the worker's bound (kvx_ucx_worker_set_unexpected) are
 * discarded oldest first; a later receive gets the oldest one still held, intact; and the
 * worker is destroyed with messages still held (ASan checks they are released). */
static void test_unexpected_bound(const char *tls) {
  pair_t p;
  CHECK(pair_open(&p, tls) == 0, "pair_open");
  drain(&p, 0.05);
  enum { N = 10, LEN = 4096 }; /* eager on every transport: below any rendezvous threshold */
  /* Room for three: each is charged its length and the overhead. */
  kvx_ucx_worker_set_unexpected(p.b, 3 * (LEN + KVX_UCX_UNEXP_OVERHEAD) + 100);
  char src[N][LEN], dst[LEN];
  void *req;
  size_t got;
  for (int i = 0; i < N; i++) {
    kvx_ucx_pattern_fill(src[i], 0, LEN, 100 + (uint64_t)i);
    reset(30 + i);
    ucs_status_t st = kvx_ucx_tag_send(p.ab, 600, src[i], LEN, 30 + (uint64_t)i, &req);
    posted(30 + i, st, req);
    CHECK(wait_op(&p, 30 + i, 5.0) == 1 && ops[30 + i].status == UCS_OK, "send %d: %d", i,
          ops[30 + i].status);
  }
  drain(&p, 0.05);
  const kvx_ucx_stats_t *s = &p.b->stats;
  CHECK(s->unexp_held == 3 && s->unexp_dropped == N - 3, "held %llu dropped %llu",
        (unsigned long long)s->unexp_held, (unsigned long long)s->unexp_dropped);
  CHECK(s->unexp_bytes == 3 * (LEN + KVX_UCX_UNEXP_OVERHEAD), "charged %llu",
        (unsigned long long)s->unexp_bytes);
  reset(45);
  ucs_status_t st = kvx_ucx_tag_recv(p.b, 600, ~0ULL, dst, LEN, 45, &req, &got);
  posted(45, st, req);
  CHECK(wait_op(&p, 45, 5.0) == 1 && ops[45].status == UCS_OK && ops[45].length == LEN,
        "recv of a held message: %d, %zu bytes", ops[45].status, ops[45].length);
  CHECK(kvx_ucx_pattern_check(dst, 0, LEN, 100 + N - 3) < 0, "not the oldest message held");
  CHECK(s->unexp_held == 2, "held %llu after one receive", (unsigned long long)s->unexp_held);
  check_l6("unexpected receiver", p.b);
  pair_close(&p); /* with two messages still held */
}

/* A worker made with an epoll set of the caller's (kvx_ucx_worker_create_efd, a context with
 * wakeup): once kvx_ucx_worker_arm says OK, a message sent to it makes the set readable, and
 * the worker then receives it. Arm says BUSY until the worker has nothing left to do, which
 * must come within a bounded number of rounds. */
static void test_wakeup(const char *tls) {
  pair_t p;
  memset(&p, 0, sizeof(p));
  kvx_ucx_ctx_config_t cfg = {.tls = tls, .keepalive_interval = "200ms", .with_rma = 1, .wakeup = 1};
  CHECK(kvx_ucx_context_create(&cfg, &p.ctx) == UCS_OK, "context with wakeup over %s", tls);
  int set = epoll_create1(EPOLL_CLOEXEC);
  CHECK(set >= 0, "epoll_create1");
  CHECK(kvx_ucx_worker_create(p.ctx, on_done, on_ep_error, NULL, &p.a) == UCS_OK, "worker a");
  CHECK(kvx_ucx_worker_create_efd(p.ctx, on_done, on_ep_error, NULL, set, &p.b) == UCS_OK,
        "worker b with an event set");
  void *addr_a, *addr_b;
  size_t la, lb;
  CHECK(kvx_ucx_worker_address(p.a, &addr_a, &la) == UCS_OK, "address");
  CHECK(kvx_ucx_worker_address(p.b, &addr_b, &lb) == UCS_OK, "address");
  ucs_status_t s1 = kvx_ucx_ep_create(p.a, addr_b, lb, 100, &p.ab);
  ucs_status_t s2 = kvx_ucx_ep_create(p.b, addr_a, la, 200, &p.ba);
  free(addr_a);
  free(addr_b);
  CHECK(s1 == UCS_OK && s2 == UCS_OK, "endpoints: %d %d", s1, s2);
  drain(&p, 0.05);
  for (int round = 0; round < 3; round++) {
    char src[256], dst[256];
    kvx_ucx_pattern_fill(src, 0, sizeof(src), 30 + round);
    void *rreq, *sreq;
    size_t got = 0;
    reset(50);
    reset(51);
    ucs_status_t st = kvx_ucx_tag_recv(p.b, 900 + round, ~0ULL, dst, sizeof(dst), 50, &rreq, &got);
    posted(50, st, rreq);
    /* Progress b (and a, for the wireup) until b's arm says OK. */
    ucs_status_t armed = UCS_ERR_BUSY;
    double end = now_s() + 5.0;
    while (armed == UCS_ERR_BUSY && now_s() < end) {
      kvx_ucx_progress(p.a, 64);
      if (kvx_ucx_progress(p.b, 64) == 0) armed = kvx_ucx_worker_arm(p.b);
    }
    CHECK(armed == UCS_OK, "%s: arm returned %s for 5 s", tls, ucs_status_string(armed));
    st = kvx_ucx_tag_send(p.ab, 900 + round, src, sizeof(src), 51, &sreq);
    posted(51, st, sreq);
    end = now_s() + 5.0;
    while (ops[51].done_count == 0 && now_s() < end) kvx_ucx_progress(p.a, 64);
    CHECK(ops[51].done_count == 1, "send did not complete");
    struct epoll_event ev;
    int n = epoll_wait(set, &ev, 1, 5000);
    CHECK(n == 1, "%s: the set of an armed worker stayed quiet for 5 s after a message (%d)", tls, n);
    CHECK(wait_op(&p, 50, 5.0) == 1 && ops[50].status == UCS_OK, "receive after the wake");
    CHECK(kvx_ucx_pattern_check(dst, 0, sizeof(dst), 30 + round) < 0, "wrong bytes");
  }
  check_l6("wakeup a", p.a);
  check_l6("wakeup b", p.b);
  pair_close(&p);
  close(set);
}

/* expect is "shm" or "tcp": which kind of lane the TLS list must end up on. */
static void test_transports(pair_t *p, const char *tls, const char *expect) {
  char *info = kvx_ucx_ep_info(p->ab);
  CHECK(info != NULL, "ep info");
  int shm = strstr(info, "posix/") != NULL || strstr(info, "sysv/") != NULL;
  int tcp = strstr(info, "tcp/") != NULL;
  if (strcmp(expect, "tcp") == 0)
    CHECK(tcp && !shm, "tls %s but lanes:\n%s", tls, info);
  else
    CHECK(shm && !tcp, "tls %s: shared memory dropped (UCX_MM_ERROR_HANDLING?):\n%s", tls, info);
  free(info);
}

int main(int argc, char **argv) {
  const char *tls = argc > 1 ? argv[1] : "posix,cma,self";
  const char *expect = argc > 2 ? argv[2] : (strstr(tls, "tcp") != NULL ? "tcp" : "shm");
  pair_t p;
  if (pair_open(&p, tls) != 0) {
    fprintf(stderr, "cannot open a UCX worker pair over %s\n", tls);
    return 1;
  }
  drain(&p, 0.02);
  test_transports(&p, tls, expect);
  /* UCX's posix FIFO, as UCT's configuration reads it: a power of two of at least 64 (UCX's
   * default, 64 in 1.13 and 256 in 1.22, or UCX_MM_FIFO_SIZE). */
  int fifo = kvx_ucx_mm_config("MM_FIFO_SIZE");
  CHECK(fifo >= 64 && (fifo & (fifo - 1)) == 0, "posix FIFO size");
  int elem = kvx_ucx_mm_config("MM_FIFO_ELEM_SIZE"); /* UCX's default 128 */
  CHECK(elem > 16 && elem <= 65536, "posix FIFO element size %d", elem);
  size_t sizes[] = {0, 1, 100, 8192, 65536 + 3, 1 << 20, 16 << 20};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    test_tag_roundtrip(&p, sizes[i], 0);
    if (sizes[i] >= 4) test_tag_roundtrip(&p, sizes[i], 1);
  }
  test_rma(&p);
  test_cancel_unmatched(&p);
  test_cancel_races(&p);
  check_l6("worker a", p.a);
  check_l6("worker b", p.b);
  pair_close(&p);
  test_force_close_inflight(tls);
  test_unexpected_bound(tls);
  test_wakeup(tls);
  if (failures) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("ucx_test %s: all passed\n", tls);
  return 0;
}
