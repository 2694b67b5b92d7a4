// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"fmt"
	"unsafe"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

var _ transport.DirectTransport = (*ucxTransport)(nil)

// AllocatePool maps bytes of host memory through UCX (ucp_mem_map with ALLOCATE) for a KV
// pool the one-copy path can use: UCX must never be handed Go memory, and memory it
// allocated itself is the fastest it sends from and receives into. The slice views memory
// outside the Go heap; it stays valid until Close, which unmaps it (and reports an error,
// keeping it mapped, while UCX still uses it).
func (t *ucxTransport) AllocatePool(bytes int64) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, transport.ErrClosed
	}
	m, err := t.uctx.Allocate(bytes)
	if err != nil {
		return nil, fmt.Errorf("kvxfer: allocating a %d-byte KV pool: %w", bytes, err)
	}
	t.regions = append(t.regions, m)
	t.pools = append(t.pools, m)
	return m.Bytes(), nil
}

// Direct implements transport.DirectTransport: pool must lie in one region this transport mapped
// (staging or AllocatePool).
func (t *ucxTransport) Direct(pool []byte) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || len(pool) == 0 {
		return false
	}
	_, _, err := t.regionLocked(pool)
	return err == nil
}

// PostSendIOV implements transport.DirectTransport with one UCX tagged send of IOV datatype: UCX reads
// the pieces in place.
func (t *ucxTransport) PostSendIOV(to transport.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return t.postIOV(to, tag, iov, done, true)
}

// PostRecvIOV implements transport.DirectTransport with one UCX tagged receive of IOV datatype.
func (t *ucxTransport) PostRecvIOV(from transport.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return t.postIOV(from, tag, iov, done, false)
}

func (t *ucxTransport) postIOV(peer transport.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion), send bool) (transport.OpID, error) {
	if len(iov) == 0 {
		return 0, fmt.Errorf("%w: an empty IOV", transport.ErrInvalidSpec)
	}
	if err := t.ensureEndpoint(peer); err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, transport.ErrClosed
	}
	// native takes one region per operation: every piece must lie in the first one's.
	mem, _, err := t.regionLocked(iov[0])
	if err != nil {
		return 0, err
	}
	base := mem.Addr()
	segs := make([]native.Segment, len(iov))
	size := 0
	for i, b := range iov {
		p := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
		if len(b) == 0 || p < base || p+uint64(len(b)) > base+uint64(mem.Len()) {
			return 0, fmt.Errorf("%w: IOV piece %d [%#x, +%d) outside the region of piece 0", ErrUnregistered, i, p, len(b))
		}
		segs[i] = native.Segment{Offset: int64(p - base), Length: int64(len(b))}
		size += len(b)
	}
	ep, err := t.endpointLocked(peer)
	if err != nil {
		return 0, err
	}
	t.nextOp++
	op := &ucxOp{id: t.nextOp, send: send, peer: peer, size: size, done: done}
	if send {
		op.tag = ucxDataTag(t.self, tag)
		op.req = ep.TagSendIOV(mem, segs, op.tag)
	} else {
		op.tag = ucxDataTag(peer, tag)
		if other, live := t.recvTag[op.tag]; live {
			return 0, fmt.Errorf("%w: %w: receive tag %#x collides with live op %d", transport.ErrProtocol, transport.ErrTagCollision, op.tag, other)
		}
		t.recvTag[op.tag] = op.id
		t.retireDrainLocked(op.tag)
		op.req = ep.TagRecvIOV(mem, segs, op.tag, ^uint64(0))
	}
	t.ops[op.id] = op
	t.byReq[op.req] = op
	return op.id, nil
}
