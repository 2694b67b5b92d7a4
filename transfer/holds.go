// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"sync"
	"unsafe"
)

// This file keeps the KV blocks that transfers the engine remembers may still touch: those of
// a handle whose outcome is decided but which is not quiescent (quarantined), and those
// poisoned for good (L9). A new Send or Receive over one of them is refused (ErrBlocksBusy),
// so a caller that reuses blocks before Quiesced closes, or ever after they were poisoned, is
// told at once instead of racing the transport. Transfers still running are not checked: their
// caller knows they run, and two Sends may read the same blocks. Device pools (Spec.Device) are
// held the same way, named by their device address.

// poolKey names a pool: two specs name the same pool when their keys match.
type poolKey struct {
	host   *byte  // a host pool's first byte
	device uint64 // a device pool's address (Spec.Device.Addr)
}

// blockSpan is one sub-transfer's blocks in its pool, fixed when the request starts.
type blockSpan struct {
	pool   poolKey
	blocks []int32
}

// blockKey names one block of one pool.
type blockKey struct {
	pool poolKey
	id   int32
}

// blockHold is what remembered handles hold of one block.
type blockHold struct {
	readers, writers int32     // quarantined Sends and Receives over it
	holder           RequestID // the latest of them, named in the error
	poisoned         bool      // for good: the entry never goes
	poisonedBy       RequestID
}

// blockHolds indexes the held blocks. Its lock is taken last: under the engine's or a
// handle's lock, never the other way round.
type blockHolds struct {
	mu sync.Mutex
	m  map[blockKey]*blockHold
}

// spansOf returns the blocks a spec's sub-transfers name in its pool: its device pool (by
// address), else its host pool; none for a host spec with a Mover (the engine cannot tell one
// pool behind a Mover from another) or no pool.
func spansOf(spec Spec, subs []SubSpec) []blockSpan {
	var pool poolKey
	switch {
	case spec.Device.set():
		pool.device = spec.Device.Addr
	case spec.Mover != nil || len(spec.Pool) == 0:
		return nil
	default:
		pool.host = unsafe.SliceData(spec.Pool)
	}
	spans := make([]blockSpan, len(subs))
	for i, s := range subs {
		spans[i] = blockSpan{pool: pool, blocks: s.Plan.Blocks()}
	}
	return spans
}

// check refuses a new request over blocks a remembered handle holds: any poisoned block, and,
// for a Receive (which writes), any held one; a Send (which reads) only where a quarantined
// Receive may still write.
func (b *blockHolds) check(id RequestID, spans []blockSpan, receive bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.m) == 0 {
		return nil
	}
	for _, s := range spans {
		for _, blk := range s.blocks {
			hold := b.m[blockKey{s.pool, blk}]
			switch {
			case hold == nil:
			case hold.poisoned:
				return &blocksBusyError{ID: id, Block: blk, Holder: hold.poisonedBy, Poisoned: true}
			case hold.writers > 0 || receive:
				return &blocksBusyError{ID: id, Block: blk, Holder: hold.holder}
			}
		}
	}
	return nil
}

// hold records a handle's blocks as held (it was quarantined).
func (b *blockHolds) hold(h *Handle) {
	if len(h.spans) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range h.spans {
		for _, blk := range s.blocks {
			hold := b.atLocked(blockKey{s.pool, blk})
			if h.receive {
				hold.writers++
			} else {
				hold.readers++
			}
			hold.holder = h.id
		}
	}
}

// release drops a handle's holds (it quiesced); poisoned blocks stay.
func (b *blockHolds) release(h *Handle) {
	if len(h.spans) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range h.spans {
		for _, blk := range s.blocks {
			k := blockKey{s.pool, blk}
			hold := b.m[k]
			if hold == nil {
				continue
			}
			if h.receive {
				hold.writers--
			} else {
				hold.readers--
			}
			if hold.readers == 0 && hold.writers == 0 && !hold.poisoned {
				delete(b.m, k)
			}
		}
	}
}

// atLocked is the hold of block k, made on first use.
func (b *blockHolds) atLocked(k blockKey) *blockHold {
	if b.m == nil {
		b.m = make(map[blockKey]*blockHold)
	}
	hold := b.m[k]
	if hold == nil {
		hold = &blockHold{}
		b.m[k] = hold
	}
	return hold
}

// poison marks a handle's blocks poisoned for good and returns how many were not already.
func (b *blockHolds) poison(h *Handle) int64 {
	var n int64
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range h.spans {
		for _, blk := range s.blocks {
			hold := b.atLocked(blockKey{s.pool, blk})
			if !hold.poisoned {
				hold.poisoned, hold.poisonedBy = true, h.id
				n++
			}
		}
	}
	return n
}
