// SPDX-License-Identifier: Apache-2.0

package mem

import (
	"encoding/binary"
	"fmt"
	"sync"
	"unsafe"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

var _ transport.RMATransport = (*Transport)(nil)

// memKeyMagic starts a Transport's remote key; the id of the pool in the owner's
// AllowDirect set follows.
const memKeyMagic = "kvxmemrma"

// RMAKeyBytes is the length of every remote key RMAKey and ExposeGeneration return.
const RMAKeyBytes = len(memKeyMagic) + 4

// RMAKey implements transport.RMATransport for a pool named to AllowDirect (or a part of one): the key
// names that pool, the address is pool[0]'s.
func (t *Transport) RMAKey(pool []byte) (uint64, []byte, error) {
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
	return 0, nil, fmt.Errorf("%w: rma key for a pool not named to AllowDirect", transport.ErrInvalidSpec)
}

// PostGet implements transport.RMATransport. The get goes on the wire at once, as a pair with a
// stand-in for the peer's side, so the network's faults apply to it as to a chunk (keyed by
// tag): Delay, Hang (until Resume), FailAfter, IgnoreCancel and NeverQuiesce. A get outside
// the pool the key names fails here, never reads past it.
func (t *Transport) PostGet(from transport.Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (transport.OpID, error) {
	return t.postGet(from, tag, key, addr, dst, false, done)
}

// postGet is PostGet, or with gen a generation read into the transport's own memory.
func (t *Transport) postGet(from transport.Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, gen bool, done func(transport.Completion)) (transport.OpID, error) {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := t.checkLocked(from); err != nil {
		return 0, err
	}
	if !gen && !t.directLocked(dst) {
		return 0, fmt.Errorf("%w: get into memory not named to AllowDirect", transport.ErrInvalidSpec)
	}
	owner := n.eps[from]
	if len(key) != len(memKeyMagic)+4 || string(key[:len(memKeyMagic)]) != memKeyMagic {
		return 0, fmt.Errorf("%w: %d-byte key is not a memtransport rma key", transport.ErrInvalidSpec, len(key))
	}
	i := binary.LittleEndian.Uint32(key[len(memKeyMagic):])
	pool, ok := owner.direct[i]
	if !ok {
		return 0, fmt.Errorf("%w: rma key names pool %d, which %s does not allow (now)", transport.ErrInvalidSpec, i, from)
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(pool))))
	if addr < base || addr-base > uint64(len(pool)) || uint64(len(dst)) > uint64(len(pool))-(addr-base) {
		return 0, fmt.Errorf("%w: get [%#x, +%d) outside the %d-byte pool at %#x", transport.ErrInvalidSpec, addr, len(dst), len(pool), base)
	}
	off := addr - base
	l := n.link(from, t.addr)
	l.nextOp++
	op := &memOp{id: transport.OpID(l.idx+1)<<opLinkShift | l.nextOp, ep: t, link: l, tag: tag, buf: dst, cb: done}
	src := &memOp{ep: owner, send: true, link: l, tag: tag, buf: pool[off : off+uint64(len(dst))], cb: func(transport.Completion) {},
		fault: n.faultFor(FaultPoint{From: from, To: t.addr, Kind: transport.KindData, Tag: tag, Bytes: len(dst), Generation: gen})}
	l.ops[op.id] = op
	n.startWire(src, op)
	return op.id, nil
}

var _ transport.RMAGenerations = (*Transport)(nil)

// memGenWords is how many exposures of one Transport may hold a generation word at once,
// unless SetGenerationWords says otherwise.
const memGenWords = 4096

// memGens are a Transport's generation words: one region named to the direct set, so a
// peer's generation read is a get like any other (the network's faults apply to it).
type memGens struct {
	words []byte
	free  []int
	next  int
	limit int    // words in the region; 0: memGenWords
	value uint64 // the last value written; every value is written once
}

// SetGenerationWords makes the transport's generation region n words, so tests can run it
// out. Call it before the first exposure; later it changes nothing.
func (t *Transport) SetGenerationWords(n int) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if t.gens.words == nil && n > 0 {
		t.gens.limit = n
	}
}

var _ transport.GenerationWords = (*Transport)(nil)

// GenerationWords implements transport.GenerationWords.
func (t *Transport) GenerationWords() (held, total int) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	g := &t.gens
	total = g.limit
	if total == 0 {
		total = memGenWords
	}
	return g.next - len(g.free), total
}

// ExposeGeneration implements transport.RMAGenerations.
func (t *Transport) ExposeGeneration() (uint64, []byte, uint64, func(), error) {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	g := &t.gens
	if g.limit == 0 {
		g.limit = memGenWords
	}
	if g.words == nil {
		g.words = make([]byte, 8*g.limit)
		if t.direct == nil {
			t.direct = map[uint32][]byte{}
		}
		t.direct[t.nextDirect] = g.words
		t.nextDirect++
	}
	slot := g.next
	if k := len(g.free); k > 0 {
		slot, g.free = g.free[k-1], g.free[:k-1]
	} else if g.next++; slot >= g.limit {
		g.next--
		return 0, nil, 0, nil, fmt.Errorf("%w: all %d generation words in use", transport.ErrNoGenerationWord, g.limit)
	}
	word := g.words[8*slot : 8*slot+8]
	g.value++
	value := g.value
	binary.LittleEndian.PutUint64(word, value)
	var key []byte
	for id, d := range t.direct {
		if unsafe.SliceData(d) == unsafe.SliceData(g.words) {
			key = binary.LittleEndian.AppendUint32([]byte(memKeyMagic), id)
		}
	}
	var once sync.Once
	end := func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			g.value++
			binary.LittleEndian.PutUint64(word, g.value) // a value no exposure was given
			g.free = append(g.free, slot)
		})
	}
	return uint64(uintptr(unsafe.Pointer(&word[0]))), key, value, end, nil
}

// PrepareReadGeneration implements transport.RMAGenerations: nothing to prepare in memory.
func (t *Transport) PrepareReadGeneration(transport.Peer, []byte) error { return nil }

// PostReadGeneration implements transport.RMAGenerations: a get of the word into the transport's own
// memory. The network completes gets in order of their wire time, and the engine reads the
// word only once every data get has completed.
func (t *Transport) PostReadGeneration(from transport.Peer, tag transport.Tag, key []byte, addr uint64, done func(transport.Completion, uint64)) (transport.OpID, error) {
	buf := make([]byte, 8)
	return t.postGet(from, tag, key, addr, buf, true, func(c transport.Completion) {
		var v uint64
		if c.Err == nil && c.Memory == transport.MemoryDone {
			v = binary.LittleEndian.Uint64(buf)
		}
		done(c, v)
	})
}

var _ transport.RMAMapper = (*Transport)(nil)

// MapPeers makes MapRemote show peers' pools (on) or nothing (off, the default: every read is
// a get, which the network's faults reach), as a transport that maps a peer's memory into this
// process would.
func (t *Transport) MapPeers(on bool) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	t.mapping = on
}

// MapRemote implements transport.RMAMapper: after MapPeers(true) the view is the owner's pool
// itself (one process), bounded by the pool the key names (a range outside it is refused, never
// shown); before, it is nil, as for memory not mapped here. No fault applies to the reads
// through a view: they are the caller's own loads.
func (t *Transport) MapRemote(from transport.Peer, key []byte, addr uint64, n int) ([]byte, func(), error) {
	net := t.net
	net.mu.Lock()
	defer net.mu.Unlock()
	if err := t.checkLocked(from); err != nil {
		return nil, nil, err
	}
	if !t.mapping {
		return nil, nil, nil
	}
	if len(key) != len(memKeyMagic)+4 || string(key[:len(memKeyMagic)]) != memKeyMagic {
		return nil, nil, fmt.Errorf("%w: %d-byte key is not a memtransport rma key", transport.ErrInvalidSpec, len(key))
	}
	owner := net.eps[from]
	pool, ok := owner.direct[binary.LittleEndian.Uint32(key[len(memKeyMagic):])]
	if !ok {
		return nil, nil, fmt.Errorf("%w: the rma key names a pool %s does not allow (now)", transport.ErrInvalidSpec, from)
	}
	if owner.gens.words != nil && unsafe.SliceData(pool) == unsafe.SliceData(owner.gens.words) {
		// The generation words stay gets, which the network's faults reach: the lifecycle
		// tests freeze and delay the read of the word on the in-place path.
		return nil, nil, nil
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(pool))))
	if n <= 0 || addr < base || addr-base > uint64(len(pool)) || uint64(n) > uint64(len(pool))-(addr-base) {
		return nil, nil, fmt.Errorf("%w: view [%#x, +%d) outside the %d-byte pool at %#x", transport.ErrInvalidSpec, addr, n, len(pool), base)
	}
	off := addr - base
	return pool[off : off+uint64(n) : off+uint64(n)], func() {}, nil
}
