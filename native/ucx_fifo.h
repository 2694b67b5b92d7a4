// SPDX-License-Identifier: Apache-2.0
// The shared-memory receive FIFO of a dead local peer (docs/ucx.md, "Sends to a killed
// shared-memory peer"). No UCX header: the layout is UCX's, read from its source.
#ifndef KVX_UCX_FIFO_H
#define KVX_UCX_FIFO_H

#include <stddef.h>
#include <stdint.h>

enum {
  KVX_FIFO_OK = 0,         /* done (for a release: the tail now equals the head) */
  KVX_FIFO_NOT_A_FIFO = 1, /* the bytes are not the FIFO control block of pid: untouched */
};

/* kvx_ucx_mm_fifo_release empties the receive FIFO whose segment this process maps at
 * [base, base+len), the FIFO of the process pid, which the caller has found dead: it moves
 * the FIFO's tail (what its reader consumed) to its head, so that a sender waiting for room
 * (UCX's flush of an endpoint to the dead peer) sees room. It checks the block first: the
 * owner's pid, and head and tail no more than fifo_size apart; anything else is left as it
 * is. *released is how many elements were still unread. */
int kvx_ucx_mm_fifo_release(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t *released);

/* kvx_ucx_mm_fifo_unwritten finds, in the receive FIFO of pid mapped at [base, base+len), the
 * first element between its tail and its head that a writer claimed and has not written yet
 * (its owner bit not yet at the element's lap): *index, or *head_out (the head) when every
 * claimed element is written. fifo_size and elem_size are UCX_MM_FIFO_SIZE and
 * UCX_MM_FIFO_ELEM_SIZE. KVX_FIFO_NOT_A_FIFO when the bytes are not such a FIFO. */
int kvx_ucx_mm_fifo_unwritten(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t elem_size,
                              uint64_t *index, uint64_t *head_out);

/* kvx_ucx_mm_fifo_fill writes element index of that FIFO, claimed and never written, as an
 * empty inline message with active message id am_id, its owner bit last: the reader takes it
 * and goes on to the elements after it. Nothing is written unless index lies between the tail
 * and the head and is still unwritten. */
int kvx_ucx_mm_fifo_fill(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t elem_size,
                         uint64_t index, uint8_t am_id);

#endif
