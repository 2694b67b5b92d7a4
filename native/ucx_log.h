/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ucx_log.h: UCX's own log lines, taken from UCX's log dispatch (ucs_log_push_handler) into a
 * bounded queue that Go drains (native/ucx_log.go), instead of printed raw on stderr.
 *
 * UCX logs from whatever thread it runs on: a worker's progress, UCX's async thread. The
 * handler never waits on its reader: it formats the line, copies it into a free slot under a
 * lock held only for that copy, wakes the reader through a non-blocking pipe, and when every
 * slot is taken it drops the line and counts it. While routing is off (no Go logger), or for
 * a fatal line (UCX aborts after it), UCX's own handler prints the line as it would without
 * kvxfer.
 *
 * The handler is pushed once per process and never popped: it is static code with static
 * state, valid after every UCX context is destroyed (UCX may log while one is torn down).
 */
#ifndef KVX_UCX_LOG_H
#define KVX_UCX_LOG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVX_UCX_LOG_QUEUE 256   /* lines held before the handler drops */
#define KVX_UCX_LOG_FILE_MAX 48 /* a source file's base name, NUL included */
#define KVX_UCX_LOG_MSG_MAX 512 /* a line's text, NUL included; longer text is cut */

typedef struct kvx_ucx_log_line {
  int level;     /* ucs_log_level_t */
  unsigned line; /* source line in file */
  char file[KVX_UCX_LOG_FILE_MAX];
  char msg[KVX_UCX_LOG_MSG_MAX];
} kvx_ucx_log_line_t;

/* Creates the wake pipe and pushes the handler, the first time; later calls do nothing.
 * Returns the pipe's read end (non-blocking; one byte arrives when the queue goes from empty
 * to not empty), or -1 with errno set if the pipe could not be made. Routing starts off. */
int kvx_ucx_log_install(void);

/* Turns routing on (the handler queues lines and tells UCX not to print them) or off. */
void kvx_ucx_log_route(int on);

/* Moves the oldest queued line into *out and returns 1, or returns 0 if none is queued. */
int kvx_ucx_log_take(kvx_ucx_log_line_t *out);

/* Returns how many lines the handler dropped, full queue, since the last call. */
uint64_t kvx_ucx_log_take_dropped(void);

#ifdef __cplusplus
}
#endif

#endif /* KVX_UCX_LOG_H */
