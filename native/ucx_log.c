/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_log.c: UCX's log lines into a bounded queue for Go (see ucx_log.h). */
#define _GNU_SOURCE
#include "ucx_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <ucs/debug/log_def.h>

static pthread_mutex_t kvx_log_mu = PTHREAD_MUTEX_INITIALIZER;
static kvx_ucx_log_line_t kvx_log_ring[KVX_UCX_LOG_QUEUE]; /* guarded by kvx_log_mu */
static unsigned kvx_log_head, kvx_log_count;               /* guarded by kvx_log_mu */
static uint64_t kvx_log_dropped;                           /* guarded by kvx_log_mu */
static int kvx_log_installed;                              /* guarded by kvx_log_mu */
static int kvx_log_wake[2] = {-1, -1};                     /* set once, at install */
static int kvx_log_routed;                                 /* __atomic */

static ucs_log_func_rc_t kvx_ucx_log_handler(const char *file, unsigned line, const char *function,
                                             ucs_log_level_t level,
                                             const ucs_log_component_config_t *comp_conf,
                                             const char *format, va_list ap) {
  (void)function;
  (void)comp_conf;
  if (level == UCS_LOG_LEVEL_FATAL || !__atomic_load_n(&kvx_log_routed, __ATOMIC_ACQUIRE)) {
    return UCS_LOG_FUNC_RC_CONTINUE;
  }
  char msg[KVX_UCX_LOG_MSG_MAX];
  va_list aq;
  va_copy(aq, ap);
  vsnprintf(msg, sizeof(msg), format, aq);
  va_end(aq);
  const char *base = file != NULL ? strrchr(file, '/') : NULL;
  base = base != NULL ? base + 1 : (file != NULL ? file : "");

  pthread_mutex_lock(&kvx_log_mu);
  if (kvx_log_count == KVX_UCX_LOG_QUEUE) {
    kvx_log_dropped++;
    pthread_mutex_unlock(&kvx_log_mu);
    return UCS_LOG_FUNC_RC_STOP;
  }
  kvx_ucx_log_line_t *slot = &kvx_log_ring[(kvx_log_head + kvx_log_count) % KVX_UCX_LOG_QUEUE];
  slot->level = (int)level;
  slot->line = line;
  snprintf(slot->file, sizeof(slot->file), "%s", base);
  memcpy(slot->msg, msg, sizeof(msg));
  int was_empty = kvx_log_count++ == 0;
  pthread_mutex_unlock(&kvx_log_mu);
  if (was_empty) {
    /* Non-blocking: a full pipe already holds a wake-up the reader has not read. */
    ssize_t n = write(kvx_log_wake[1], "", 1);
    (void)n;
  }
  return UCS_LOG_FUNC_RC_STOP;
}

int kvx_ucx_log_install(void) {
  pthread_mutex_lock(&kvx_log_mu);
  if (!kvx_log_installed) {
    if (pipe2(kvx_log_wake, O_NONBLOCK | O_CLOEXEC) != 0) {
      int err = errno;
      pthread_mutex_unlock(&kvx_log_mu);
      errno = err;
      return -1;
    }
    ucs_log_push_handler(kvx_ucx_log_handler);
    kvx_log_installed = 1;
  }
  int fd = kvx_log_wake[0];
  pthread_mutex_unlock(&kvx_log_mu);
  return fd;
}

void kvx_ucx_log_route(int on) { __atomic_store_n(&kvx_log_routed, on ? 1 : 0, __ATOMIC_RELEASE); }

int kvx_ucx_log_take(kvx_ucx_log_line_t *out) {
  pthread_mutex_lock(&kvx_log_mu);
  if (kvx_log_count == 0) {
    pthread_mutex_unlock(&kvx_log_mu);
    return 0;
  }
  *out = kvx_log_ring[kvx_log_head];
  kvx_log_head = (kvx_log_head + 1) % KVX_UCX_LOG_QUEUE;
  kvx_log_count--;
  pthread_mutex_unlock(&kvx_log_mu);
  return 1;
}

uint64_t kvx_ucx_log_take_dropped(void) {
  pthread_mutex_lock(&kvx_log_mu);
  uint64_t n = kvx_log_dropped;
  kvx_log_dropped = 0;
  pthread_mutex_unlock(&kvx_log_mu);
  return n;
}
