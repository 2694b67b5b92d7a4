/* SPDX-License-Identifier: Apache-2.0 */
/* ucx.c: see ucx.h. Every nbx call funnels through kvx_ucx_track, the one owner of a
 * request's lifetime (invariant L6). */
#define _GNU_SOURCE
#include "ucx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uct/api/uct.h>

/* Lives in the space UCX reserves in front of every request (UCP_PARAM_FIELD_REQUEST_SIZE),
 * so a completion knows its worker and id without a per-request allocation. */
typedef struct kvx_ucx_req_priv {
  uint64_t user;
  int live; /* set by kvx_ucx_track, cleared by finish: tells a reused request from ours */
} kvx_ucx_req_priv_t;

/* UCX calls this once per request when its pool allocates it, before any use. */
static void req_init(void *request) { memset(request, 0, sizeof(kvx_ucx_req_priv_t)); }

static int rdesc_layout_known(void);
static void drain_unexpected(kvx_ucx_worker_t *w);

static int set_config(ucp_config_t *config, const char *name, const char *value) {
  if (value == NULL || value[0] == '\0') return 0;
  return ucp_config_modify(config, name, value) == UCS_OK ? 0 : -1;
}

/* Whether a UCX_TLS list can select a shared-memory (mm) transport; only then is
 * UCX_MM_ERROR_HANDLING meaningful (elsewhere UCX warns that it is unused). */
static int wants_shared_memory(const char *tls) {
  static const char *const names[] = {"all", "shm", "sm", "mm", "posix", "sysv", "xpmem"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (strstr(tls, names[i]) != NULL) return 1;
  return 0;
}

/* Whether a UCX_TLS list can select TCP: unset or empty (all), "all", a list naming tcp, or an
 * exclusion list ("^...") that does not name it. */
static int wants_tcp(const char *tls) {
  if (tls == NULL || tls[0] == '\0' || strstr(tls, "all") != NULL) return 1;
  int named = strstr(tls, "tcp") != NULL;
  return tls[0] == '^' ? !named : named;
}

/* kvxfer's receivers pull: rendezvous by get_zcopy, and the RMA route's gets. UCX 1.22's
 * cuda_ipc transport turns its gets off where it sees no NVLink (CUDA_IPC_ENABLE_GET_ZCOPY
 * "auto": "platforms known to have slower performance"), which leaves device memory between
 * two processes to cuda_copy through host memory: on an H200 without NVLink a 2 MiB ucp_get
 * moved 0.75 GB/s (docs/gpu-results.md). So where this context reaches CUDA memory (its cuda
 * transports loaded, the key known to UCX, so no unused-variable warning), the gets are
 * asked for, unless the caller's environment says otherwise. UCX reads the interface
 * settings from the environment when a worker opens its transports, after this. */
static void allow_cuda_ipc_gets(ucp_context_h ctx) {
  ucp_context_attr_t attr;
  memset(&attr, 0, sizeof(attr));
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(ctx, &attr) == UCS_OK && (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)))
    setenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "y", 0);
}

ucs_status_t kvx_ucx_context_create(const kvx_ucx_ctx_config_t *cfg, ucp_context_h *out) {
  /* Transport-level settings: ucp_config_modify in 1.13 accepts UCT keys but does not apply
   * them, so they are set in the environment, which UCX reads when the context opens its
   * transports. The caller's explicit setting wins (overwrite=0). */
  const char *tls = cfg != NULL ? cfg->tls : NULL;
  if (tls == NULL || wants_shared_memory(tls)) {
    setenv("UCX_MM_ERROR_HANDLING", "y", 0);
    /* The receive FIFO of the shared-memory transports, in elements. UCX sizes and indexes a
     * peer's FIFO by its own setting, so both ends must have the same one (opt-in). */
    if (cfg != NULL && cfg->mm_fifo_size != NULL) setenv("UCX_MM_FIFO_SIZE", cfg->mm_fifo_size, 0);
  }
  /* No zero-copy sends over TCP. When a connection breaks under a partly written zero-copy
   * send, uct_tcp_ep_sendv completes it twice: once in uct_tcp_ep_handle_disconnected (which
   * also runs the endpoint's error handling, and UCP may free the request there), then again
   * on return with UCS_ERR_ENDPOINT_TIMEOUT. UCX 1.13 aborts on it (uct_iface.h `comp->count
   * > 0`); a build without assertions writes into the freed request. With fewer than one
   * payload iov the TCP transport offers neither AM nor PUT zero-copy, and UCP copies into
   * the transport's own buffers instead. Those buffers grow from 8 KiB to 64 KiB, UCX's
   * default receive buffer (so any peer can take these messages): eight times fewer sends
   * win back most of what the copy costs. See docs/ucx.md, "TCP without zero-copy". */
  /* The receive buffer is 1 MiB, so a peer may send segments up to that size (the TCP
   * transport reads a whole segment into one buffer and has no check in release builds): a
   * copied message then costs sixteen times fewer sends and receives than with 64 KiB ones.
   * What this side sends stays at 64 KiB, which any peer takes, unless the caller asks for
   * more (ContextConfig.TCPSegmentBytes). */
  if (wants_tcp(tls)) {
    const char *tx = cfg != NULL && cfg->tcp_tx_seg_size != NULL ? cfg->tcp_tx_seg_size : "64k";
    setenv("UCX_TCP_MAX_IOV", "0", 0);
    setenv("UCX_TCP_RX_SEG_SIZE", "1m", 0);
    setenv("UCX_TCP_TX_SEG_SIZE", tx, 0);
  }

  ucp_config_t *config = NULL;
  ucs_status_t st = ucp_config_read(NULL, NULL, &config);
  if (st != UCS_OK) return st;
  if (cfg != NULL) {
    if (set_config(config, "TLS", cfg->tls) != 0 ||
        set_config(config, "KEEPALIVE_INTERVAL", cfg->keepalive_interval) != 0 ||
        set_config(config, "NET_DEVICES", cfg->net_devices) != 0 ||
        set_config(config, "RNDV_SCHEME", cfg->rndv_scheme) != 0 ||
        set_config(config, "RNDV_THRESH", cfg->rndv_thresh) != 0) {
      ucp_config_release(config);
      return UCS_ERR_INVALID_PARAM;
    }
  }
  ucp_params_t params;
  memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_REQUEST_SIZE |
                      UCP_PARAM_FIELD_REQUEST_INIT | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG;
  if (cfg == NULL || cfg->with_rma) params.features |= UCP_FEATURE_RMA;
  if (cfg != NULL && cfg->wakeup) params.features |= UCP_FEATURE_WAKEUP;
  params.request_size = sizeof(kvx_ucx_req_priv_t);
  params.request_init = req_init;
  /* Memory registration and rkey packing run on callers' goroutines while the progress
   * thread drives the workers: the context must take its own lock. */
  params.mt_workers_shared = 1;
  params.name = "kvxfer";
  st = ucp_init(&params, config, out);
  ucp_config_release(config);
  if (st == UCS_OK) allow_cuda_ipc_gets(*out);
  return st;
}

void kvx_ucx_context_destroy(ucp_context_h ctx) {
  if (ctx != NULL) ucp_cleanup(ctx);
}

static void print_config(void *config, FILE *f) {
  ucp_config_print((const ucp_config_t *)config, f, NULL, UCS_CONFIG_PRINT_CONFIG);
}

int kvx_ucx_protocols_v2(void) {
  ucp_config_t *config = NULL;
  if (ucp_config_read(NULL, NULL, &config) != UCS_OK) return -1;
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (f == NULL) {
    ucp_config_release(config);
    return -1;
  }
  print_config(config, f);
  fclose(f);
  ucp_config_release(config);
  if (text == NULL) return -1;
  /* One line per setting, "UCX_PROTO_ENABLE=y" or "=n"; a UCX without the setting has no
   * protocols v2. */
  int v2 = strstr(text, "\nUCX_PROTO_ENABLE=y") != NULL ? 1 : 0;
  free(text);
  return v2;
}

int kvx_ucx_mm_config(const char *name) {
  uct_component_h *comps = NULL;
  unsigned n = 0;
  if (uct_query_components(&comps, &n) != UCS_OK) return -1;
  int size = -1;
  for (unsigned i = 0; i < n && size < 0; i++) {
    uct_component_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
    if (uct_component_query(comps[i], &attr) != UCS_OK || strcmp(attr.name, "posix") != 0) continue;
    uct_md_config_t *md_config = NULL;
    if (uct_md_config_read(comps[i], NULL, NULL, &md_config) != UCS_OK) break;
    uct_md_h md = NULL;
    ucs_status_t st = uct_md_open(comps[i], "posix", md_config, &md);
    uct_config_release(md_config);
    if (st != UCS_OK) break;
    uct_iface_config_t *iface_config = NULL;
    if (uct_md_iface_config_read(md, "posix", NULL, NULL, &iface_config) == UCS_OK) {
      char value[32];
      if (uct_config_get(iface_config, name, value, sizeof(value)) == UCS_OK) {
        char *end = NULL;
        long v = strtol(value, &end, 10);
        if (end != value && *end == '\0' && v > 0 && v <= 1 << 30) size = (int)v;
      }
      uct_config_release(iface_config);
    }
    uct_md_close(md);
  }
  uct_release_component_list(comps);
  return size;
}

ucs_status_t kvx_ucx_worker_create(ucp_context_h ctx, kvx_ucx_done_fn on_done,
                                   kvx_ucx_ep_error_fn on_ep_error, void *cb_arg,
                                   kvx_ucx_worker_t **out) {
  return kvx_ucx_worker_create_efd(ctx, on_done, on_ep_error, cb_arg, -1, out);
}

ucs_status_t kvx_ucx_worker_create_efd(ucp_context_h ctx, kvx_ucx_done_fn on_done,
                                       kvx_ucx_ep_error_fn on_ep_error, void *cb_arg, int event_fd,
                                       kvx_ucx_worker_t **out) {
  kvx_ucx_worker_t *w = calloc(1, sizeof(*w));
  if (w == NULL) return UCS_ERR_NO_MEMORY;
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (event_fd >= 0) {
    /* UCX adds its own fds (its signal eventfd, the keepalive timer, each active transport's
     * event fd) to the caller's epoll set, level-triggered, and never closes it. Every event
     * kind (the default): a transport then also reports send completions, so ucp_worker_arm
     * says BUSY while a send waits in its pending queue instead of sleeping through it. */
    wp.field_mask |= UCP_WORKER_PARAM_FIELD_EVENT_FD;
    wp.event_fd = event_fd;
  }
  ucs_status_t st = ucp_worker_create(ctx, &wp, &w->worker);
  if (st != UCS_OK) {
    free(w);
    return st;
  }
  w->context = ctx;
  w->on_done = on_done;
  w->on_ep_error = on_ep_error;
  w->cb_arg = cb_arg;
  w->rdesc_layout = rdesc_layout_known();
  *out = w;
  return UCS_OK;
}

static void unexp_drop_oldest(kvx_ucx_worker_t *w);

ucs_status_t kvx_ucx_worker_arm(kvx_ucx_worker_t *w) { return ucp_worker_arm(w->worker); }

void kvx_ucx_worker_destroy(kvx_ucx_worker_t *w) {
  if (w == NULL) return;
  /* Held messages are out of UCX's queue, so ucp_worker_destroy would not release them. */
  while (w->unexp_head != NULL) unexp_drop_oldest(w);
  ucp_worker_destroy(w->worker);
  free(w);
}

ucs_status_t kvx_ucx_worker_address(kvx_ucx_worker_t *w, void **addr, size_t *len) {
  ucp_address_t *a = NULL;
  size_t n = 0;
  ucs_status_t st = ucp_worker_get_address(w->worker, &a, &n);
  if (st != UCS_OK) return st;
  void *copy = malloc(n);
  if (copy == NULL) {
    ucp_worker_release_address(w->worker, a);
    return UCS_ERR_NO_MEMORY;
  }
  memcpy(copy, a, n);
  ucp_worker_release_address(w->worker, a);
  *addr = copy;
  *len = n;
  return UCS_OK;
}

/* --- unexpected messages (see kvx_ucx_worker_set_unexpected in ucx.h) ------------------- */

/* The head of UCX's ucp_recv_desc_t (src/ucp/core/ucp_request.h), which a ucp_tag_message_h
 * points to; the same in every release from 1.13 to 1.22: a union as large as two list links,
 * the received length, the payload offset, the flags. Only the rendezvous flag is read. */
struct kvx_ucp_recv_desc {
  void *links[4];
  uint32_t length;
  uint32_t payload_offset;
  uint16_t flags;
};
#define KVX_UCP_RECV_DESC_FLAG_RNDV (1u << 6) /* UCP_RECV_DESC_FLAG_RNDV */

static int rdesc_layout_known(void) {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return major == 1 && minor >= 13 && minor <= 22;
}

void kvx_ucx_worker_set_unexpected(kvx_ucx_worker_t *w, size_t limit_bytes) {
  w->unexp_limit = limit_bytes;
}

/* Where discarded messages are received: larger ones are truncated, which is what frees them
 * (UCX consumes and drops the rest of the message). Its content is never read. */
static char discard_scratch[64];

static void discard_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                       void *user_data) {
  (void)status;
  (void)info;
  (void)user_data;
  ucp_request_free(request);
}

/* Receives msg into the scratch buffer. Not a tracked request: no on_done, and UCX releases
 * one still pending when the worker is destroyed. */
static void discard(kvx_ucx_worker_t *w, ucp_tag_message_h msg) {
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  p.cb.recv = discard_cb;
  /* A request completes through discard_cb; a status pointer means it is already over. */
  (void)ucp_tag_msg_recv_nbx(w->worker, discard_scratch, sizeof(discard_scratch), msg, &p);
  w->stats.unexp_dropped++;
}

static void unexp_drop_oldest(kvx_ucx_worker_t *w) {
  kvx_ucx_unexp_t *u = w->unexp_head;
  w->unexp_head = u->next;
  if (w->unexp_head == NULL) w->unexp_tail = NULL;
  w->stats.unexp_held--;
  w->stats.unexp_bytes -= u->cost;
  discard(w, u->msg);
  free(u);
}

/* Takes every message out of UCX's unexpected queue into the held list, within the bound. */
static void drain_unexpected(kvx_ucx_worker_t *w) {
  if (w->unexp_limit == 0) return;
  for (unsigned i = 0; i < 4096; i++) {
    ucp_tag_recv_info_t info;
    memset(&info, 0, sizeof(info));
    ucp_tag_message_h msg = ucp_tag_probe_nb(w->worker, 0, 0, 1, &info);
    if (msg == NULL) return;
    size_t cost = KVX_UCX_UNEXP_OVERHEAD;
    if (!w->rdesc_layout ||
        !(((const struct kvx_ucp_recv_desc *)(const void *)msg)->flags & KVX_UCP_RECV_DESC_FLAG_RNDV))
      cost += info.length;
    while (w->unexp_head != NULL && w->stats.unexp_bytes + cost > w->unexp_limit)
      unexp_drop_oldest(w);
    kvx_ucx_unexp_t *u = cost <= w->unexp_limit ? malloc(sizeof(*u)) : NULL;
    if (u == NULL) {
      discard(w, msg);
      continue;
    }
    u->next = NULL;
    u->msg = msg;
    u->tag = info.sender_tag;
    u->cost = cost;
    if (w->unexp_tail != NULL) w->unexp_tail->next = u;
    else w->unexp_head = u;
    w->unexp_tail = u;
    w->stats.unexp_held++;
    w->stats.unexp_bytes += cost;
  }
}

/* The oldest held message a receive for tag/mask matches, taken off the list; NULL if none. */
static kvx_ucx_unexp_t *unexp_take(kvx_ucx_worker_t *w, uint64_t tag, uint64_t mask) {
  kvx_ucx_unexp_t *prev = NULL;
  for (kvx_ucx_unexp_t *u = w->unexp_head; u != NULL; prev = u, u = u->next) {
    if (((u->tag ^ tag) & mask) != 0) continue;
    if (prev != NULL) prev->next = u->next;
    else w->unexp_head = u->next;
    if (w->unexp_tail == u) w->unexp_tail = prev;
    w->stats.unexp_held--;
    w->stats.unexp_bytes -= u->cost;
    return u;
  }
  return NULL;
}

/* ucp_tag_recv_nbx, after the held messages: the oldest one it matches is received through
 * ucp_tag_msg_recv_nbx, which runs the same code as a match in UCX's own queue. */
static ucs_status_ptr_t recv_nbx(kvx_ucx_worker_t *w, void *buf, size_t count, uint64_t tag,
                                 uint64_t mask, const ucp_request_param_t *p) {
  kvx_ucx_unexp_t *u = unexp_take(w, tag, mask);
  if (u == NULL) return ucp_tag_recv_nbx(w->worker, buf, count, tag, mask, p);
  ucp_tag_message_h msg = u->msg;
  free(u);
  return ucp_tag_msg_recv_nbx(w->worker, buf, count, msg, p);
}

unsigned kvx_ucx_progress(kvx_ucx_worker_t *w, unsigned max_rounds) {
  unsigned busy = 0;
  for (unsigned i = 0; i < max_rounds; i++) {
    unsigned n = ucp_worker_progress(w->worker);
    /* After every round: one round takes in a bounded amount (a few FIFO elements, a few
     * socket reads), so that is all the bound is ever passed by. */
    drain_unexpected(w);
    if (n == 0) break;
    busy++;
  }
  return busy;
}

/* Captures what a UCX print function writes, as a malloc'd string. */
static char *capture(void (*print)(void *, FILE *), void *obj) {
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (f == NULL) return NULL;
  print(obj, f);
  fclose(f);
  return text;
}

static void print_worker(void *w, FILE *f) { ucp_worker_print_info((ucp_worker_h)w, f); }
static void print_ep(void *ep, FILE *f) { ucp_ep_print_info((ucp_ep_h)ep, f); }

char *kvx_ucx_worker_info(kvx_ucx_worker_t *w) { return capture(print_worker, w->worker); }

char *kvx_ucx_ep_info(kvx_ucx_ep_t *ep) { return capture(print_ep, ep->ep); }

/* --- request lifetime ------------------------------------------------------------------ */

/* The single exit of a request: deliver the callback, then free, in that order, once.
 * user_data is always the worker. A receive posted with NO_IMM_CMPL may be called back from
 * inside its own post, before kvx_ucx_track saw it (live == 0): its id is then the one the
 * post is running for, and the post learns through posting_done that it is over. */
static void finish(void *request, ucs_status_t status, size_t length, void *user_data) {
  kvx_ucx_req_priv_t *priv = (kvx_ucx_req_priv_t *)request;
  kvx_ucx_worker_t *w = user_data;
  uint64_t user;
  if (priv->live) {
    user = priv->user;
  } else {
    user = w->posting_user;
    w->posting_done = 1;
    w->stats.requests++; /* counted here, since the post will not return it as live */
  }
  priv->live = 0;
  w->stats.callbacks++;
  if (w->on_done != NULL) w->on_done(w->cb_arg, user, status, length);
  w->stats.freed++;
  ucp_request_free(request);
}

static void send_cb(void *request, ucs_status_t status, void *user_data) {
  finish(request, status, 0, user_data);
}

static void recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                    void *user_data) {
  finish(request, status, status == UCS_OK && info != NULL ? info->length : 0, user_data);
}

/* Marks the start of a post, so that a callback from inside it is attributed to user. */
static void begin_post(kvx_ucx_worker_t *w, uint64_t user) {
  w->posting_user = user;
  w->posting_done = 0;
}

/* Takes what an nbx call returned; see the request rule in ucx.h. */
static ucs_status_t kvx_ucx_track(kvx_ucx_worker_t *w, ucs_status_ptr_t sp, uint64_t user,
                                  void **req_out) {
  *req_out = NULL;
  if (w->posting_done) {
    /* Called back (and freed) inside the post: the pointer must not be touched. */
    w->posting_done = 0;
    return UCS_INPROGRESS;
  }
  if (sp == NULL) {
    w->stats.inline_done++;
    return UCS_OK;
  }
  if (UCS_PTR_IS_ERR(sp)) {
    w->stats.inline_done++;
    return UCS_PTR_STATUS(sp);
  }
  kvx_ucx_req_priv_t *priv = (kvx_ucx_req_priv_t *)sp;
  priv->user = user;
  priv->live = 1;
  w->stats.requests++;
  *req_out = sp;
  return UCS_INPROGRESS;
}

/* A post on an endpoint takes the worker from it before the nbx call and never reads the
 * endpoint record after: UCX 1.13 may run the endpoint's error handler inside the call (a TCP
 * send that finds the connection reset fails the endpoint on the spot), and a handler that
 * closed the endpoint there would free the record under the post (native defers that). */
static void send_param(ucp_request_param_t *p, kvx_ucx_worker_t *w, uint64_t user) {
  memset(p, 0, sizeof(*p));
  p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p->cb.send = send_cb;
  p->user_data = w;
  begin_post(w, user);
}

/* --- endpoints ------------------------------------------------------------------------- */

static void ep_error_cb(void *arg, ucp_ep_h uep, ucs_status_t status) {
  (void)uep;
  kvx_ucx_ep_t *ep = arg;
  ep->failed = 1;
  ep->w->stats.ep_errors++;
  if (ep->w->on_ep_error != NULL) ep->w->on_ep_error(ep->w->cb_arg, ep->user, status);
}

ucs_status_t kvx_ucx_ep_create(kvx_ucx_worker_t *w, const void *addr, size_t addr_len,
                               uint64_t user, kvx_ucx_ep_t **out) {
  (void)addr_len; /* a UCP worker address carries its own length */
  kvx_ucx_ep_t *ep = calloc(1, sizeof(*ep));
  if (ep == NULL) return UCS_ERR_NO_MEMORY;
  ep->w = w;
  ep->user = user;
  ucp_ep_params_t p;
  memset(&p, 0, sizeof(p));
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = (const ucp_address_t *)addr;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = ep_error_cb;
  p.err_handler.arg = ep;
  ucs_status_t st = ucp_ep_create(w->worker, &p, &ep->ep);
  if (st != UCS_OK) {
    free(ep);
    return st;
  }
  w->stats.eps_open++;
  *out = ep;
  return UCS_OK;
}

ucs_status_t kvx_ucx_ep_close(kvx_ucx_ep_t *ep, int force, uint64_t user, void **req_out) {
  kvx_ucx_worker_t *w = ep->w;
  ucp_request_param_t p;
  send_param(&p, w, user);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  return kvx_ucx_track(w, ucp_ep_close_nbx(ep->ep, &p), user, req_out);
}

void kvx_ucx_ep_release(kvx_ucx_ep_t *ep) {
  if (ep == NULL) return;
  ep->w->stats.eps_open--;
  free(ep);
}

void kvx_ucx_ep_free(kvx_ucx_ep_t *ep) { free(ep); }

/* --- tagged messages and RMA ------------------------------------------------------------ */

ucs_status_t kvx_ucx_tag_send(kvx_ucx_ep_t *ep, uint64_t tag, const void *buf, size_t len,
                              uint64_t user, void **req_out) {
  kvx_ucx_worker_t *w = ep->w;
  ucp_request_param_t p;
  send_param(&p, w, user);
  return kvx_ucx_track(w, ucp_tag_send_nbx(ep->ep, buf, len, tag, &p), user, req_out);
}

ucs_status_t kvx_ucx_tag_send_mapped(kvx_ucx_ep_t *ep, uint64_t tag, const void *buf, size_t len,
                                     ucp_mem_h memh, uint64_t user, void **req_out) {
  kvx_ucx_worker_t *w = ep->w;
  ucp_request_param_t p;
  send_param(&p, w, user);
  if (memh != NULL) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  return kvx_ucx_track(w, ucp_tag_send_nbx(ep->ep, buf, len, tag, &p), user, req_out);
}

ucs_status_t kvx_ucx_tag_send_iov(kvx_ucx_ep_t *ep, uint64_t tag, const ucp_dt_iov_t *iov,
                                  size_t iovcnt, uint64_t user, void **req_out) {
  kvx_ucx_worker_t *w = ep->w;
  ucp_request_param_t p;
  send_param(&p, w, user);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_iov();
  return kvx_ucx_track(w, ucp_tag_send_nbx(ep->ep, iov, iovcnt, tag, &p), user, req_out);
}

static ucs_status_t tag_recv(kvx_ucx_worker_t *w, uint64_t tag, uint64_t mask, void *buf,
                             size_t count, int iov, ucp_mem_h memh, uint64_t user,
                             void **req_out, size_t *len_out) {
  ucp_tag_recv_info_t info;
  memset(&info, 0, sizeof(info));
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  /* UCX 1.13 leaves recv_info.tag_info unset when a receive completes inline from the
   * unexpected queue, so the received length would be lost: receives always complete
   * through the callback, which does carry it. */
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = recv_cb;
  p.user_data = w;
  begin_post(w, user);
  p.recv_info.tag_info = &info;
  if (iov) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
  }
  if (memh != NULL) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  ucs_status_t st = kvx_ucx_track(w, recv_nbx(w, buf, count, tag, mask, &p),
                                  user, req_out);
  if (st == UCS_OK && len_out != NULL) *len_out = info.length;
  return st;
}

ucs_status_t kvx_ucx_tag_recv(kvx_ucx_worker_t *w, uint64_t tag, uint64_t tag_mask, void *buf,
                              size_t len, uint64_t user, void **req_out, size_t *len_out) {
  return tag_recv(w, tag, tag_mask, buf, len, 0, NULL, user, req_out, len_out);
}

ucs_status_t kvx_ucx_tag_recv_mapped(kvx_ucx_worker_t *w, uint64_t tag, uint64_t tag_mask,
                                     void *buf, size_t len, ucp_mem_h memh, uint64_t user,
                                     void **req_out, size_t *len_out) {
  return tag_recv(w, tag, tag_mask, buf, len, 0, memh, user, req_out, len_out);
}

ucs_status_t kvx_ucx_tag_recv_iov(kvx_ucx_worker_t *w, uint64_t tag, uint64_t tag_mask,
                                  const ucp_dt_iov_t *iov, size_t iovcnt, ucp_mem_h memh,
                                  uint64_t user, void **req_out, size_t *len_out) {
  return tag_recv(w, tag, tag_mask, (void *)iov, iovcnt, 1, memh, user, req_out, len_out);
}

ucs_status_t kvx_ucx_put(kvx_ucx_ep_t *ep, const void *buf, size_t len, uint64_t remote_addr,
                         ucp_rkey_h rkey, uint64_t user, void **req_out) {
  kvx_ucx_worker_t *w = ep->w;
  ucp_request_param_t p;
  send_param(&p, w, user);
  return kvx_ucx_track(w, ucp_put_nbx(ep->ep, buf, len, remote_addr, rkey, &p), user,
                       req_out);
}

ucs_status_t kvx_ucx_get(kvx_ucx_ep_t *ep, void *buf, size_t len, uint64_t remote_addr,
                         ucp_rkey_h rkey, uint64_t user, void **req_out) {
  kvx_ucx_worker_t *w = ep->w;
  ucp_request_param_t p;
  send_param(&p, w, user);
  return kvx_ucx_track(w, ucp_get_nbx(ep->ep, buf, len, remote_addr, rkey, &p), user,
                       req_out);
}

ucs_status_t kvx_ucx_get_fenced(kvx_ucx_ep_t *ep, void *buf, size_t len, uint64_t remote_addr,
                                ucp_rkey_h rkey, uint64_t user, void **req_out) {
  ucs_status_t st = ucp_worker_fence(ep->w->worker);
  if (st != UCS_OK) {
    *req_out = NULL;
    ep->w->stats.inline_done++;
    return st;
  }
  return kvx_ucx_get(ep, buf, len, remote_addr, rkey, user, req_out);
}

ucs_status_t kvx_ucx_ep_flush(kvx_ucx_ep_t *ep, uint64_t user, void **req_out) {
  kvx_ucx_worker_t *w = ep->w;
  ucp_request_param_t p;
  send_param(&p, w, user);
  return kvx_ucx_track(w, ucp_ep_flush_nbx(ep->ep, &p), user, req_out);
}

void kvx_ucx_cancel(kvx_ucx_worker_t *w, void *req) {
  if (req == NULL) return;
  w->stats.cancels++;
  ucp_request_cancel(w->worker, req);
}

/* --- memory ------------------------------------------------------------------------------ */

ucs_status_t kvx_ucx_mem_alloc(ucp_context_h ctx, size_t len, ucp_mem_h *memh, void **addr) {
  ucp_mem_map_params_t p;
  memset(&p, 0, sizeof(p));
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                 UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  p.address = NULL;
  p.length = len;
  p.flags = UCP_MEM_MAP_ALLOCATE;
  ucs_status_t st = ucp_mem_map(ctx, &p, memh);
  if (st != UCS_OK) return st;
  ucp_mem_attr_t attr;
  memset(&attr, 0, sizeof(attr));
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(*memh, &attr);
  if (st != UCS_OK || attr.length < len) {
    ucp_mem_unmap(ctx, *memh);
    return st != UCS_OK ? st : UCS_ERR_NO_MEMORY;
  }
  *addr = attr.address;
  return UCS_OK;
}

ucs_status_t kvx_ucx_mem_register(ucp_context_h ctx, void *addr, size_t len, int mem_type,
                                  ucp_mem_h *memh) {
  ucp_mem_map_params_t p;
  memset(&p, 0, sizeof(p));
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                 UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  p.address = addr;
  p.length = len;
  p.memory_type = (ucs_memory_type_t)mem_type;
  return ucp_mem_map(ctx, &p, memh);
}

ucs_status_t kvx_ucx_mem_release(ucp_context_h ctx, ucp_mem_h memh) {
  return ucp_mem_unmap(ctx, memh);
}

ucs_status_t kvx_ucx_rkey_pack(ucp_context_h ctx, ucp_mem_h memh, void **buf, size_t *len) {
  void *packed = NULL;
  size_t n = 0;
  ucs_status_t st = ucp_rkey_pack(ctx, memh, &packed, &n);
  if (st != UCS_OK) return st;
  void *copy = malloc(n);
  if (copy == NULL) {
    ucp_rkey_buffer_release(packed);
    return UCS_ERR_NO_MEMORY;
  }
  memcpy(copy, packed, n);
  ucp_rkey_buffer_release(packed);
  *buf = copy;
  *len = n;
  return UCS_OK;
}

ucs_status_t kvx_ucx_rkey_unpack(kvx_ucx_ep_t *ep, const void *buf, ucp_rkey_h *rkey) {
  return ucp_ep_rkey_unpack(ep->ep, buf, rkey);
}

void kvx_ucx_rkey_destroy(ucp_rkey_h rkey) {
  if (rkey != NULL) ucp_rkey_destroy(rkey);
}

int kvx_ucx_rkey_mapped(ucp_rkey_h rkey, uint64_t remote_addr) {
  void *p = NULL;
  ucs_status_t st = ucp_rkey_ptr(rkey, remote_addr, &p);
  /* UCS_ERR_INVALID_ADDR: mapped, the address outside the mapping */
  return st == UCS_OK || st == UCS_ERR_INVALID_ADDR;
}

void *kvx_ucx_rkey_ptr(ucp_rkey_h rkey, uint64_t remote_addr) {
  void *p = NULL;
  if (rkey == NULL || ucp_rkey_ptr(rkey, remote_addr, &p) != UCS_OK) return NULL;
  return p;
}

/* --- device memory (owner: devucx; see ucx.h) ------------------------------------------------ */

ucs_status_t kvx_ucx_context_memory_types(ucp_context_h ctx, uint64_t *types) {
  ucp_context_attr_t attr;
  memset(&attr, 0, sizeof(attr));
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  ucs_status_t st = ucp_context_query(ctx, &attr);
  if (st != UCS_OK) return st;
  *types = attr.memory_types;
  return UCS_OK;
}

const char *kvx_ucx_version(void) { return ucp_get_version_string(); }

/* ucs_topo_num_devices is in libucs of UCX 1.13 and 1.22 alike; declared here because its
 * header moved between them. */
unsigned ucs_topo_num_devices(void);
unsigned kvx_ucs_sys_devices(void) { return ucs_topo_num_devices(); }

ucs_status_t kvx_ucx_mem_register_addr(ucp_context_h ctx, uint64_t addr, size_t len, int mem_type,
                                       ucp_mem_h *memh, void **ptr) {
  void *p = (void *)(uintptr_t)addr;
  ucs_status_t st = kvx_ucx_mem_register(ctx, p, len, mem_type, memh);
  if (st == UCS_OK) *ptr = p;
  return st;
}

ucs_status_t kvx_ucx_tag_send_typed(kvx_ucx_ep_t *ep, uint64_t tag, const void *buf, size_t len,
                                    int mem_type, uint64_t user, void **req_out) {
  kvx_ucx_worker_t *w = ep->w;
  ucp_request_param_t p;
  send_param(&p, w, user);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.memory_type = (ucs_memory_type_t)mem_type;
  return kvx_ucx_track(w, ucp_tag_send_nbx(ep->ep, buf, len, tag, &p), user, req_out);
}

ucs_status_t kvx_ucx_tag_recv_typed(kvx_ucx_worker_t *w, uint64_t tag, uint64_t tag_mask,
                                    void *buf, size_t len, int mem_type, uint64_t user,
                                    void **req_out, size_t *len_out) {
  ucp_tag_recv_info_t info;
  memset(&info, 0, sizeof(info));
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  /* As tag_recv: never complete inline, so the callback reports the length. */
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL |
                   UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.cb.recv = recv_cb;
  p.user_data = w;
  p.memory_type = (ucs_memory_type_t)mem_type;
  begin_post(w, user);
  p.recv_info.tag_info = &info;
  ucs_status_t st = kvx_ucx_track(w, recv_nbx(w, buf, len, tag, tag_mask, &p),
                                  user, req_out);
  if (st == UCS_OK && len_out != NULL) *len_out = info.length;
  return st;
}

ucs_status_t kvx_ucx_get_typed(kvx_ucx_ep_t *ep, void *buf, size_t len, uint64_t remote_addr,
                               ucp_rkey_h rkey, int mem_type, ucp_mem_h memh, uint64_t user,
                               void **req_out) {
  kvx_ucx_worker_t *w = ep->w;
  ucp_request_param_t p;
  send_param(&p, w, user);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.memory_type = (ucs_memory_type_t)mem_type;
  if (memh != NULL) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  return kvx_ucx_track(w, ucp_get_nbx(ep->ep, buf, len, remote_addr, rkey, &p), user, req_out);
}
