// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

var _ RMATransport = (*MemTransport)(nil)

// memKeyMagic starts a MemTransport's remote key; the id of the pool in the owner's
// AllowDirect set follows.
const memKeyMagic = "kvxmemrma"

// RMAKey implements RMATransport for a pool named to AllowDirect (or a part of one): the key
// names that pool, the address is pool[0]'s.
func (t *MemTransport) RMAKey(pool []byte) (uint64, []byte, error) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if len(pool) > 0 {
		p := uintptr(unsafe.Pointer(unsafe.SliceData(pool)))
		for i, d := range t.direct {
			q := uintptr(unsafe.Pointer(unsafe.SliceData(d)))
			if len(d) > 0 && p >= q && p+uintptr(len(pool)) <= q+uintptr(len(d)) {
				return uint64(p), binary.LittleEndian.AppendUint32([]byte(memKeyMagic), i), nil
			}
		}
	}
	return 0, nil, fmt.Errorf("%w: rma key for a pool not named to AllowDirect", ErrInvalidSpec)
}

// PostGet implements RMATransport. The get goes on the wire at once, as a pair with a
// stand-in for the peer's side, so the network's faults apply to it as to a chunk (keyed by
// tag): Delay, Hang (until Resume), FailAfter, IgnoreCancel and NeverQuiesce. A get outside
// the pool the key names fails here, never reads past it.
func (t *MemTransport) PostGet(from Peer, tag Tag, key []byte, addr uint64, dst []byte, done func(Completion)) (OpID, error) {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := t.checkLocked(from); err != nil {
		return 0, err
	}
	if !t.directLocked(dst) {
		return 0, fmt.Errorf("%w: get into memory not named to AllowDirect", ErrInvalidSpec)
	}
	owner := n.eps[from]
	if len(key) != len(memKeyMagic)+4 || string(key[:len(memKeyMagic)]) != memKeyMagic {
		return 0, fmt.Errorf("%w: %d-byte key is not a memtransport rma key", ErrInvalidSpec, len(key))
	}
	i := binary.LittleEndian.Uint32(key[len(memKeyMagic):])
	pool, ok := owner.direct[i]
	if !ok {
		return 0, fmt.Errorf("%w: rma key names pool %d, which %s does not allow (now)", ErrInvalidSpec, i, from)
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(pool))))
	if addr < base || addr-base > uint64(len(pool)) || uint64(len(dst)) > uint64(len(pool))-(addr-base) {
		return 0, fmt.Errorf("%w: get [%#x, +%d) outside the %d-byte pool at %#x", ErrInvalidSpec, addr, len(dst), len(pool), base)
	}
	off := addr - base
	l := n.link(from, t.addr)
	l.nextOp++
	op := &memOp{id: OpID(l.idx+1)<<opLinkShift | l.nextOp, ep: t, link: l, tag: tag, buf: dst, cb: done}
	src := &memOp{ep: owner, send: true, link: l, tag: tag, buf: pool[off : off+uint64(len(dst))], cb: func(Completion) {},
		fault: n.faultFor(FaultPoint{From: from, To: t.addr, Kind: KindData, Tag: tag, Bytes: len(dst)})}
	l.ops[op.id] = op
	n.startWire(src, op)
	return op.id, nil
}
