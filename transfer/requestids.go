// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"
)

// RequestIDs maps a serving engine's string request ids ("cmpl-8f3a…") onto RequestIDs.
// An id is the first 8 bytes of the name's SHA-256, so every process derives the same id from
// the same name and prefill and decode need not pass it to each other. Two names whose ids
// collide are never live at once: Acquire refuses the second while the first is live (odds
// about n²/2⁶⁵ for n live names, 3·10⁻⁸ at a million), where the engine would otherwise take
// it for a duplicate of the first (L8). The zero value is ready; it is safe for concurrent use
// and holds only the live names.
type RequestIDs struct {
	hash func(string) uint64 // nil: SHA-256's first 8 bytes; tests make collisions with their own
	mu   sync.Mutex
	live map[RequestID]string
}

// Acquire returns name's id and marks it live until Release(name). It fails, with an error
// that matches ErrDuplicate and names both requests, when the id is already live: for name
// itself (a request the caller is already moving) or for another name.
func (r *RequestIDs) Acquire(name string) (RequestID, error) {
	id := r.id(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	if holder, ok := r.live[id]; ok {
		if holder == name {
			return 0, fmt.Errorf("request %q (id %d) is already live: %w", name, id, ErrDuplicate)
		}
		return 0, fmt.Errorf("request %q maps to id %d, live for request %q: %w", name, id, holder, ErrDuplicate)
	}
	if r.live == nil {
		r.live = map[RequestID]string{}
	}
	r.live[id] = name
	return id, nil
}

// Release ends name's id, once the request's handles are done with (after Quiesced, or a
// FreeNow cancel). Releasing a name that is not live does nothing.
func (r *RequestIDs) Release(name string) {
	id := r.id(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live[id] == name {
		delete(r.live, id)
	}
}

func (r *RequestIDs) id(name string) RequestID {
	if r.hash != nil {
		return RequestID(r.hash(name))
	}
	sum := sha256.Sum256([]byte(name))
	return RequestID(binary.BigEndian.Uint64(sum[:8]))
}
