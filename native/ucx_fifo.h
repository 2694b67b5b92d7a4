// SPDX-License-Identifier: Apache-2.0
// The shared-memory receive FIFO of a dead local peer (docs/ucx.md, "Sends to a killed
// shared-memory peer"). No UCX header: the layout is UCX's, read from its source.
#ifndef KVX_UCX_FIFO_H
#define KVX_UCX_FIFO_H

#include <stddef.h>
#include <stdint.h>

enum {
  KVX_FIFO_RELEASED = 0,   /* the tail now equals the head */
  KVX_FIFO_NOT_A_FIFO = 1, /* the bytes are not the FIFO control block of pid: untouched */
};

/* kvx_ucx_mm_fifo_release empties the receive FIFO whose segment this process maps at
 * [base, base+len), the FIFO of the process pid, which the caller has found dead: it moves
 * the FIFO's tail (what its reader consumed) to its head, so that a sender waiting for room
 * (UCX's flush of an endpoint to the dead peer) sees room. It checks the block first: the
 * owner's pid, and head and tail no more than fifo_size apart; anything else is left as it
 * is. *released is how many elements were still unread. */
int kvx_ucx_mm_fifo_release(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t *released);

#endif
