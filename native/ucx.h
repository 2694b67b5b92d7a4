/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ucx.h: kvxfer's thin C layer over UCP (UCX 1.13).
 *
 * Threading: everything here except kvx_ucx_worker_signal must be called from the one thread
 * that drives the worker (the Go side's locked progress goroutine, or a C test's main loop).
 * That is why the worker is created UCS_THREAD_MODE_SINGLE: no UCX lock is ever taken, and a
 * completion callback can never run concurrently with a post or a cancel of the same request.
 *
 * Request lifetime (invariant L6): every nbx call goes through one helper. It returns
 *   UCS_OK          completed inline: no request exists, no callback will come;
 *   an error status failed inline: no request exists, no callback will come;
 *   UCS_INPROGRESS  *req_out holds a live request: exactly one on_done callback will follow
 *                   (from kvx_ucx_progress, or from kvx_ucx_cancel), and the request is
 *                   freed with ucp_request_free right after that callback returns;
 *                   or *req_out is NULL: on_done already ran, inside the post itself
 *                   (receives never complete inline, so that UCX reports their length).
 * The caller must drop its request pointer when on_done fires; the counters in
 * kvx_ucx_stats_t let tests check that every request posted was freed exactly once.
 *
 * Memory handed to a pending operation must stay valid until on_done: it is C memory or
 * memory mapped by UCX, never Go memory.
 */
#ifndef KVX_UCX_H
#define KVX_UCX_H

#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Called once per pending request, when it completes, fails or is cancelled. user is the
 * caller's id given at post time; length is the received length for tagged receives. */
typedef void (*kvx_ucx_done_fn)(void *arg, uint64_t user, ucs_status_t status, size_t length);

/* Called when UCX reports an endpoint failed (peer died, keepalive expired). user is the
 * endpoint's id given at creation. It may run inside a post on any endpoint of the worker
 * (UCX 1.13 fails a TCP endpoint inside the send that finds its connection reset): it must
 * not close or release an endpoint there, only note the failure for after the post. */
typedef void (*kvx_ucx_ep_error_fn)(void *arg, uint64_t user, ucs_status_t status);

/* Context settings. NULL/zero fields keep UCX's own defaults (and the environment's UCX_*). */
typedef struct kvx_ucx_ctx_config {
  const char *tls;                /* UCX_TLS, e.g. "posix,cma,self" or "tcp,self"; NULL: all */
  const char *keepalive_interval; /* UCX_KEEPALIVE_INTERVAL, e.g. "500ms"; NULL: default */
  const char *net_devices;        /* UCX_NET_DEVICES, e.g. "lo"; NULL: all */
  const char *rndv_scheme;        /* UCX_RNDV_SCHEME, e.g. "get_zcopy"; NULL: default */
  const char *rndv_thresh;        /* UCX_RNDV_THRESH, e.g. "65536"; NULL: default */
  const char *tcp_tx_seg_size;    /* UCX_TCP_TX_SEG_SIZE, e.g. "1048576"; NULL: 64k */
  const char *mm_fifo_size;       /* UCX_MM_FIFO_SIZE, e.g. "1024"; NULL: UCX's (64) */
  int with_rma;                   /* request UCP_FEATURE_RMA too */
  int wakeup;                     /* request UCP_FEATURE_WAKEUP (see kvx_ucx_worker_arm) */
} kvx_ucx_ctx_config_t;

/* Counters kept per worker, for tests of L6 and for metrics. */
typedef struct kvx_ucx_stats {
  uint64_t inline_done;     /* posts that completed or failed inline (no request) */
  uint64_t requests;        /* posts that returned a live request */
  uint64_t callbacks;       /* completion callbacks delivered for those requests */
  uint64_t freed;           /* ucp_request_free calls made by this layer */
  uint64_t cancels;         /* ucp_request_cancel calls made */
  uint64_t ep_errors;       /* endpoint error callbacks */
  uint64_t eps_open;        /* endpoints created and not yet released */
  uint64_t unexp_held;      /* unexpected messages this layer holds for a later receive */
  uint64_t unexp_bytes;     /* what they are charged (see kvx_ucx_worker_set_unexpected) */
  uint64_t unexp_dropped;   /* unexpected messages discarded to stay within the bound */
} kvx_ucx_stats_t;

/* One unexpected message taken out of UCX's queue (see kvx_ucx_worker_set_unexpected). */
typedef struct kvx_ucx_unexp {
  struct kvx_ucx_unexp *next;
  ucp_tag_message_h msg;
  uint64_t tag;
  size_t cost;
} kvx_ucx_unexp_t;

typedef struct kvx_ucx_worker {
  ucp_context_h context;
  ucp_worker_h worker;
  kvx_ucx_done_fn on_done;
  kvx_ucx_ep_error_fn on_ep_error;
  void *cb_arg;
  kvx_ucx_stats_t stats;
  uint64_t posting_user; /* the id of the post in progress (see finish in ucx.c) */
  int posting_done;      /* that post was already called back */
  /* Unexpected messages held, oldest first, and the bound on what they are charged. */
  kvx_ucx_unexp_t *unexp_head, *unexp_tail;
  size_t unexp_limit;   /* 0: no bound, UCX keeps its own unexpected queue */
  int rdesc_layout;     /* the loaded UCX's receive descriptor layout is known (1.13 to 1.22) */
} kvx_ucx_worker_t;

/* One endpoint. Allocated here because UCX's error handler needs a stable argument. */
typedef struct kvx_ucx_ep {
  kvx_ucx_worker_t *w;
  ucp_ep_h ep;
  uint64_t user;
  int failed; /* set once the error handler ran: only a forced close is allowed then */
} kvx_ucx_ep_t;

/* Context: reads UCX's configuration, applies cfg, and sets UCX_MM_ERROR_HANDLING=y so that
 * shared memory stays usable with UCP_ERR_HANDLING_MODE_PEER endpoints (UCX 1.13 drops it
 * otherwise and silently falls back to TCP over loopback). */
ucs_status_t kvx_ucx_context_create(const kvx_ucx_ctx_config_t *cfg, ucp_context_h *out);
void kvx_ucx_context_destroy(ucp_context_h ctx);
/* 1 when the UCX loaded selects its protocols with protocols v2 (UCX_PROTO_ENABLE=y, as the
 * environment and UCX's own default say: 1.22's default, not 1.13's), 0 when not, -1 when its
 * configuration cannot be read. */
int kvx_ucx_protocols_v2(void);

/* An integer setting of the shared-memory (posix) transport for a worker created now, e.g.
 * "MM_FIFO_SIZE" (UCX_MM_FIFO_SIZE: 64 in 1.13, 256 in 1.22) or "MM_FIFO_ELEM_SIZE", as the
 * environment and UCX's own default say, read through UCT's configuration of the posix
 * transport; -1 when this UCX has no posix transport or it cannot be read. */
int kvx_ucx_mm_config(const char *name);

/* Worker: single-threaded (see the top of this file). The callbacks may be NULL. */
ucs_status_t kvx_ucx_worker_create(ucp_context_h ctx, kvx_ucx_done_fn on_done,
                                   kvx_ucx_ep_error_fn on_ep_error, void *cb_arg,
                                   kvx_ucx_worker_t **out);
/* kvx_ucx_worker_create, with UCX's wakeup fds added to event_fd (an epoll set the caller
 * owns and closes after kvx_ucx_worker_destroy) when event_fd >= 0: the context must have
 * been created with wakeup. */
ucs_status_t kvx_ucx_worker_create_efd(ucp_context_h ctx, kvx_ucx_done_fn on_done,
                                       kvx_ucx_ep_error_fn on_ep_error, void *cb_arg, int event_fd,
                                       kvx_ucx_worker_t **out);
/* ucp_worker_arm, for a worker made with an event_fd: UCS_OK once every transport the worker
 * uses will make event_fd readable when anything arrives or completes (the caller may then
 * wait on it), UCS_ERR_BUSY when there is work now (progress again before waiting: an event
 * already queued, a send a transport holds in its pending queue, a copy in flight). */
ucs_status_t kvx_ucx_worker_arm(kvx_ucx_worker_t *w);
/* Destroys the worker. Requests still pending are released by UCX without callbacks. */
void kvx_ucx_worker_destroy(kvx_ucx_worker_t *w);
/* The worker's address, copied into malloc'd memory the caller frees with free(). */
ucs_status_t kvx_ucx_worker_address(kvx_ucx_worker_t *w, void **addr, size_t *len);
/* Bounds what unexpected messages (arrived with no receive posted) may hold in this process.
 * UCX keeps every such message until a receive matches it, and a sender decides how it sends:
 * an eager message (UCX 1.22 sends large ones eagerly over shm and TCP with kvxfer's
 * get_zcopy default; any peer can ask for it with UCX_RNDV_THRESH) is held whole, so without
 * a bound a peer grows this process's memory at will. With limit_bytes > 0, after every round
 * of progress this layer takes each unexpected message out of UCX's queue
 * (ucp_tag_probe_nb with remove) and keeps its handle, oldest first; a receive posted later
 * takes the oldest held message it matches (ucp_tag_msg_recv_nbx, the same call path as a
 * match in UCX's queue) before it goes to UCX. Each held message is charged its length plus
 * KVX_UCX_UNEXP_OVERHEAD, or only the overhead for a rendezvous request, whose data stays
 * with the sender (told from the descriptor's flags where the layout is known, UCX 1.13 to
 * 1.22; any other version charges the length). When a new message would pass the bound, the
 * oldest held ones are discarded (received into a scratch buffer and truncated, which frees
 * them), then the new one if it alone is larger than the bound. A discarded message is lost:
 * a receive posted for it later waits until its own deadline. 0 turns the bound off. */
#define KVX_UCX_UNEXP_OVERHEAD 16384
void kvx_ucx_worker_set_unexpected(kvx_ucx_worker_t *w, size_t limit_bytes);

/* Progresses the worker until it reports no more work or max_rounds rounds passed. Returns
 * how many rounds made progress. */
unsigned kvx_ucx_progress(kvx_ucx_worker_t *w, unsigned max_rounds);
/* Worker transport summary (ucp_worker_print_info), malloc'd, caller frees. */
char *kvx_ucx_worker_info(kvx_ucx_worker_t *w);

/* Endpoints: created with UCP_ERR_HANDLING_MODE_PEER (keepalive comes with it). */
ucs_status_t kvx_ucx_ep_create(kvx_ucx_worker_t *w, const void *addr, size_t addr_len,
                               uint64_t user, kvx_ucx_ep_t **out);
/* Starts closing the endpoint: flush and disconnect, or with force=1 drop everything at
 * once, completing its pending sends with an error. Follows the request rule above; once the
 * close completed (inline or through on_done), call kvx_ucx_ep_release. */
ucs_status_t kvx_ucx_ep_close(kvx_ucx_ep_t *ep, int force, uint64_t user, void **req_out);
void kvx_ucx_ep_release(kvx_ucx_ep_t *ep);
/* Frees the endpoint record only, after its worker was destroyed (which released UCX's
 * endpoint and must not be touched again). */
void kvx_ucx_ep_free(kvx_ucx_ep_t *ep);
/* Lanes and transports the endpoint uses (ucp_ep_print_info), malloc'd, caller frees. */
char *kvx_ucx_ep_info(kvx_ucx_ep_t *ep);

/* Tagged messages. A contiguous buffer, or an iov array (which must stay valid, like the
 * buffers it points to, until completion). */
ucs_status_t kvx_ucx_tag_send(kvx_ucx_ep_t *ep, uint64_t tag, const void *buf, size_t len,
                              uint64_t user, void **req_out);
/* kvx_ucx_tag_send from memory of a region this context mapped or registered, with its memory
 * handle named to UCX (UCP_OP_ATTR_FIELD_MEMH). UCX 1.22 needs it: a rendezvous send whose
 * buffer UCX found registered by itself packs a key with the request, and when the endpoint
 * fails or is force-closed UCX completes such a request only after invalidating that
 * registration (ucp_request_memh_invalidate), which shared memory and TCP cannot do: the send
 * never completed. With the caller's handle UCX skips the invalidation and completes it with
 * the close's error at once, as 1.13 does. */
ucs_status_t kvx_ucx_tag_send_mapped(kvx_ucx_ep_t *ep, uint64_t tag, const void *buf, size_t len,
                                     ucp_mem_h memh, uint64_t user, void **req_out);
ucs_status_t kvx_ucx_tag_send_iov(kvx_ucx_ep_t *ep, uint64_t tag, const ucp_dt_iov_t *iov,
                                  size_t iovcnt, uint64_t user, void **req_out);
/* *len_out receives the message length when the receive completes inline. */
ucs_status_t kvx_ucx_tag_recv(kvx_ucx_worker_t *w, uint64_t tag, uint64_t tag_mask, void *buf,
                              size_t len, uint64_t user, void **req_out, size_t *len_out);
/* kvx_ucx_tag_recv into a region this context mapped or registered, with its memory handle
 * named to UCX, as kvx_ucx_tag_send_mapped, and for the same reason: with the rendezvous scheme
 * "am" on UCX 1.22 a receive whose buffer UCX found registered by itself was, once its endpoint
 * failed, left waiting for an invalidation of that registration that only the region's unmap
 * ran, and that unmap, after the worker was destroyed, wrote into the freed request (heap
 * corruption: malloc aborted later). With the caller's handle UCX completes it with the error. */
ucs_status_t kvx_ucx_tag_recv_mapped(kvx_ucx_worker_t *w, uint64_t tag, uint64_t tag_mask,
                                     void *buf, size_t len, ucp_mem_h memh, uint64_t user,
                                     void **req_out, size_t *len_out);
/* memh: the handle of the region every piece lies in, or NULL. */
ucs_status_t kvx_ucx_tag_recv_iov(kvx_ucx_worker_t *w, uint64_t tag, uint64_t tag_mask,
                                  const ucp_dt_iov_t *iov, size_t iovcnt, ucp_mem_h memh,
                                  uint64_t user, void **req_out, size_t *len_out);

/* RMA. */
ucs_status_t kvx_ucx_put(kvx_ucx_ep_t *ep, const void *buf, size_t len, uint64_t remote_addr,
                         ucp_rkey_h rkey, uint64_t user, void **req_out);
ucs_status_t kvx_ucx_get(kvx_ucx_ep_t *ep, void *buf, size_t len, uint64_t remote_addr,
                         ucp_rkey_h rkey, uint64_t user, void **req_out);
/* kvx_ucx_get after ucp_worker_fence: the get is ordered after every operation issued on the
 * worker before it (a validation read that must not pass the data gets). */
ucs_status_t kvx_ucx_get_fenced(kvx_ucx_ep_t *ep, void *buf, size_t len, uint64_t remote_addr,
                                ucp_rkey_h rkey, uint64_t user, void **req_out);
/* Completes once every RMA issued on the endpoint before it is remotely complete. */
ucs_status_t kvx_ucx_ep_flush(kvx_ucx_ep_t *ep, uint64_t user, void **req_out);

/* Cancels a pending request. Only an unmatched tagged receive is really cancelled (its
 * on_done then reports UCS_ERR_CANCELED); for anything else UCX ignores the call and the
 * request completes on its own. Never call it after that request's on_done. */
void kvx_ucx_cancel(kvx_ucx_worker_t *w, void *req);

/* Memory: allocated by UCX (ucp_mem_map with ALLOCATE), or the caller's memory registered
 * once. mem_type is a ucs_memory_type_t (UCS_MEMORY_TYPE_HOST, UCS_MEMORY_TYPE_CUDA, ...). */
ucs_status_t kvx_ucx_mem_alloc(ucp_context_h ctx, size_t len, ucp_mem_h *memh, void **addr);
ucs_status_t kvx_ucx_mem_register(ucp_context_h ctx, void *addr, size_t len, int mem_type,
                                  ucp_mem_h *memh);
ucs_status_t kvx_ucx_mem_release(ucp_context_h ctx, ucp_mem_h memh);
/* Packs the region's remote key into malloc'd memory the caller frees with free(). */
ucs_status_t kvx_ucx_rkey_pack(ucp_context_h ctx, ucp_mem_h memh, void **buf, size_t *len);
ucs_status_t kvx_ucx_rkey_unpack(kvx_ucx_ep_t *ep, const void *buf, ucp_rkey_h *rkey);
void kvx_ucx_rkey_destroy(ucp_rkey_h rkey);
/* 1 when a transport maps the key's memory into this process (ucp_rkey_ptr: posix's attached
 * segment), so gets through it are loads; 0 when none does (UCS_ERR_UNREACHABLE). */
int kvx_ucx_rkey_mapped(ucp_rkey_h rkey, uint64_t remote_addr);
/* Where the peer's remote_addr is mapped in this process (ucp_rkey_ptr), or NULL. */
void *kvx_ucx_rkey_ptr(ucp_rkey_h rkey, uint64_t remote_addr);

/* Test patterns: every 8-byte word holds a function of (seed, its absolute offset), so a
 * misplaced, missing or duplicated chunk shows up. fill writes [off, off+len) of buf as the
 * stream's bytes at offset off; check returns the first mismatching byte offset, or -1. */
void kvx_ucx_pattern_fill(void *buf, uint64_t stream_off, size_t len, uint64_t seed);
int64_t kvx_ucx_pattern_check(const void *buf, uint64_t stream_off, size_t len, uint64_t seed);

/* --- device memory (owner: devucx) ------------------------------------------------------------
 * A CUDA-enabled UCX (the libucx-cu12 wheel, say) moves device memory through the same calls;
 * Debian's UCX cannot. These let the Go side ask which memory types this UCX reaches before it
 * hands UCX a device pointer, and name the type on each operation so UCX neither guesses nor
 * pays for detection. */

/* *types receives a bit mask of the memory types the context supports: bit (1 << t) for each
 * ucs_memory_type_t t (ucp_context_query, UCP_ATTR_FIELD_MEMORY_TYPES). */
ucs_status_t kvx_ucx_context_memory_types(ucp_context_h ctx, uint64_t *types);
/* The version of the UCX library loaded at run time (which may differ from the headers'). */
const char *kvx_ucx_version(void);
/* The number of system devices (PCI devices UCX placed in its topology) this process's UCX
 * knows: a remote key's system-device id must be one of them (rkey.go). */
unsigned kvx_ucs_sys_devices(void);
/* Registers len bytes at a device (or host) address given as an integer, so Go never forms a
 * pointer to device memory itself; *ptr receives the same address as a pointer. */
ucs_status_t kvx_ucx_mem_register_addr(ucp_context_h ctx, uint64_t addr, size_t len, int mem_type,
                                       ucp_mem_h *memh, void **ptr);
/* kvx_ucx_tag_send and kvx_ucx_tag_recv with the buffer's memory type named
 * (UCP_OP_ATTR_FIELD_MEMORY_TYPE). */
ucs_status_t kvx_ucx_tag_send_typed(kvx_ucx_ep_t *ep, uint64_t tag, const void *buf, size_t len,
                                    int mem_type, uint64_t user, void **req_out);
ucs_status_t kvx_ucx_tag_recv_typed(kvx_ucx_worker_t *w, uint64_t tag, uint64_t tag_mask,
                                    void *buf, size_t len, int mem_type, uint64_t user,
                                    void **req_out, size_t *len_out);
/* kvx_ucx_get into a registered region of memory type mem_type, naming its memh
 * (UCP_OP_ATTR_FIELD_MEMORY_TYPE, UCP_OP_ATTR_FIELD_MEMH): UCX neither probes the buffer's
 * type nor looks its registration up again, and a CUDA buffer goes GPU to GPU. */
ucs_status_t kvx_ucx_get_typed(kvx_ucx_ep_t *ep, void *buf, size_t len, uint64_t remote_addr,
                               ucp_rkey_h rkey, int mem_type, ucp_mem_h memh, uint64_t user,
                               void **req_out);

#ifdef __cplusplus
}
#endif

#endif /* KVX_UCX_H */
