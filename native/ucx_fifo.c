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

/* ctl_block returns the control block at base if [base, base+len) holds one of pid's, with
 * head and tail (the wake-up bit left out) no more than fifo_size apart; NULL otherwise. */
static unsigned char *ctl_block(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t *head,
                                uint64_t *tail) {
  if (base == 0 || base % 64 != 0 || len < fifo_ctl_bytes || pid <= 0 || fifo_size == 0) return NULL;
  unsigned char *ctl = (unsigned char *)base;
  int32_t owner;
  memcpy(&owner, ctl + fifo_pid_offset, sizeof(owner));
  if (owner != pid) return NULL; /* another segment, or another process's FIFO */
  *tail = __atomic_load_n((volatile uint64_t *)(ctl + fifo_tail_offset), __ATOMIC_ACQUIRE);
  *head = __atomic_load_n((volatile uint64_t *)(ctl + fifo_head_offset), __ATOMIC_ACQUIRE) & ~FIFO_HEAD_EVENT_ARMED;
  return *head - *tail <= fifo_size ? ctl : NULL; /* else not the counters of a FIFO this size */
}

int kvx_ucx_mm_fifo_release(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t *released) {
  *released = 0;
  uint64_t head, tail;
  unsigned char *ctl = ctl_block(base, len, pid, fifo_size, &head, &tail);
  if (ctl == NULL) return KVX_FIFO_NOT_A_FIFO;
  /* Only the reader moves the tail, and the reader is dead: every element the senders have
   * claimed up to head counts as consumed. A sender that claims one meanwhile moves head
   * past this value, which leaves the tail behind it, as a live reader would. */
  __atomic_store_n((volatile uint64_t *)(ctl + fifo_tail_offset), head, __ATOMIC_RELEASE);
  *released = head - tail;
  return KVX_FIFO_OK;
}

/* The elements follow the control block (UCT_MM_FIFO_CTL_SIZE: the block's 140 bytes, aligned
 * to 64, in both versions); each is fifo_elem_size bytes (UCX_MM_FIFO_ELEM_SIZE) and starts
 * with its flags (bit 0: the owner bit, bit 1: inline data), its active message id and a
 * 16-bit length (uct_mm_fifo_element_t). A writer claims index i by moving the head past it,
 * writes the element, and sets its owner bit to lap parity (i / fifo_size) & 1 last; the
 * reader waits at its index for that bit (uct_mm_iface_fifo_has_new_data). */
enum {
  fifo_elems_offset = 192,
  elem_flag_owner = 1,
  elem_flag_inline = 2,
};

/* fifo_of is ctl_block for a FIFO whose elements (fifo_size of elem_size bytes, a power of
 * two of them) lie within [base, base+len). */
static unsigned char *fifo_of(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t elem_size,
                              uint64_t *head, uint64_t *tail) {
  if ((fifo_size & (fifo_size - 1)) != 0 || elem_size < 8 || elem_size > 1 << 20 || len < fifo_elems_offset ||
      fifo_size > (len - fifo_elems_offset) / elem_size) {
    return NULL;
  }
  return ctl_block(base, len, pid, fifo_size, head, tail);
}

static volatile uint8_t *elem_flags(unsigned char *ctl, uint64_t fifo_size, uint64_t elem_size, uint64_t index) {
  return (volatile uint8_t *)(ctl + fifo_elems_offset + (index & (fifo_size - 1)) * elem_size);
}

static int elem_written(unsigned char *ctl, uint64_t fifo_size, uint64_t elem_size, uint64_t index) {
  uint8_t lap = (uint8_t)((index / fifo_size) & 1);
  return (__atomic_load_n(elem_flags(ctl, fifo_size, elem_size, index), __ATOMIC_ACQUIRE) & elem_flag_owner) == lap;
}

int kvx_ucx_mm_fifo_unwritten(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t elem_size,
                              uint64_t *index, uint64_t *head_out) {
  uint64_t head, tail;
  unsigned char *ctl = fifo_of(base, len, pid, fifo_size, elem_size, &head, &tail);
  if (ctl == NULL) return KVX_FIFO_NOT_A_FIFO;
  uint64_t i = tail;
  while (i != head && elem_written(ctl, fifo_size, elem_size, i)) i++;
  *index = i;
  *head_out = head;
  return KVX_FIFO_OK;
}

int kvx_ucx_mm_fifo_fill(uintptr_t base, size_t len, int32_t pid, uint64_t fifo_size, uint64_t elem_size,
                         uint64_t index, uint8_t am_id) {
  uint64_t head, tail;
  unsigned char *ctl = fifo_of(base, len, pid, fifo_size, elem_size, &head, &tail);
  if (ctl == NULL || index - tail >= head - tail || elem_written(ctl, fifo_size, elem_size, index)) {
    return KVX_FIFO_NOT_A_FIFO; /* not a claimed, unwritten element of this FIFO */
  }
  volatile uint8_t *flags = elem_flags(ctl, fifo_size, elem_size, index);
  uint16_t length = 0;
  flags[1] = am_id;
  memcpy((void *)(flags + 2), &length, sizeof(length));
  uint8_t lap = (uint8_t)((index / fifo_size) & 1);
  __atomic_store_n(flags, (uint8_t)(elem_flag_inline | lap), __ATOMIC_RELEASE);
  return KVX_FIFO_OK;
}
