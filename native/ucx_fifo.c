// SPDX-License-Identifier: Apache-2.0
// The shared-memory receive FIFO of a dead local peer, as this process maps it (see
// ucx_fifo.h and docs/ucx.md, "Sends to a killed shared-memory peer").

#include "ucx_fifo.h"

#include <stdint.h>
#include <string.h>

/* The FIFO control block at the start of a posix FIFO segment (uct_mm_fifo_ctl_t in
 * src/uct/sm/mm/base/mm_iface.h, the same in UCX 1.13.1 and 1.22.0): the head (where the next
 * sender writes; bit 63 asks the sender to signal the reader) fills the first two 64-byte
 * cache lines with the reader's signal socket address, then come the tail (what the reader
 * has consumed) and the reader's pid. The segment is mapped at a page boundary, so the block
 * is at its first byte (uct_mm_iface_set_fifo_ptrs aligns up to a cache line). */
enum {
  fifo_head_offset = 0,
  fifo_tail_offset = 128,
  fifo_pid_offset = 136,
  fifo_ctl_bytes = 192,
};
#define FIFO_HEAD_EVENT_ARMED (UINT64_C(1) << 63)

int kvx_ucx_mm_fifo_release(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t *released) {
  *released = 0;
  if (base == 0 || base % 64 != 0 || len < fifo_ctl_bytes || pid <= 0 || fifo_size == 0) {
    return KVX_FIFO_NOT_A_FIFO;
  }
  unsigned char *ctl = (unsigned char *)base;
  int32_t owner;
  memcpy(&owner, ctl + fifo_pid_offset, sizeof(owner));
  if (owner != pid) {
    return KVX_FIFO_NOT_A_FIFO; /* another segment, or another process's FIFO */
  }
  volatile uint64_t *head_p = (volatile uint64_t *)(ctl + fifo_head_offset);
  volatile uint64_t *tail_p = (volatile uint64_t *)(ctl + fifo_tail_offset);
  uint64_t head = __atomic_load_n(head_p, __ATOMIC_ACQUIRE) & ~FIFO_HEAD_EVENT_ARMED;
  uint64_t tail = __atomic_load_n(tail_p, __ATOMIC_ACQUIRE);
  uint64_t used = head - tail;
  if (used > fifo_size) {
    return KVX_FIFO_NOT_A_FIFO; /* not the counters of a FIFO this size: leave it */
  }
  /* Only the reader moves the tail, and the reader is dead: every element the senders have
   * claimed up to head counts as consumed. A sender that claims one meanwhile moves head
   * past this value, which leaves the tail behind it, as a live reader would. */
  __atomic_store_n(tail_p, head, __ATOMIC_RELEASE);
  *released = used;
  return KVX_FIFO_RELEASED;
}
