// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

var (
	_ transport.RMAGenerations  = (*ucxTransport)(nil)
	_ transport.GenerationWords = (*ucxTransport)(nil)
)

// ucxGenWords is how many exposures may hold a generation word at once, and how many
// generation reads may be in flight; the region holds both (64 KiB).
const ucxGenWords = 4096

// ucxGens is the UCX transport's generation region, under ucxTransport.mu: words [0,
// ucxGenWords) are exposures' generation words that peers read, words [ucxGenWords,
// 2*ucxGenWords) are where this side's reads of peers' words land. Mapped by UCX on first use,
// its key packed once.
type ucxGens struct {
	mem     *native.Memory
	key     []byte
	free    []int // exposure words free for reuse
	next    int
	landing []int // landing words free
	value   atomic.Uint64
	held    atomic.Int64 // exposure words held, read without mu (GenerationWords)
}

func (g *ucxGens) word(i int) *uint64 {
	return (*uint64)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(g.mem.Bytes())), 8*i))
}

// gensLocked maps the region on first use.
func (t *ucxTransport) gensLocked() (*ucxGens, error) {
	g := &t.gens
	if g.mem != nil {
		return g, nil
	}
	mem, err := t.uctx.Allocate(8 * 2 * ucxGenWords)
	if err != nil {
		return nil, fmt.Errorf("kvxfer: mapping the generation words: %w", err)
	}
	key, err := mem.PackRemoteKey()
	if err != nil {
		_ = mem.Close()
		return nil, fmt.Errorf("kvxfer: packing the generation words' key: %w", err)
	}
	g.mem, g.key = mem, key
	for i := 2*ucxGenWords - 1; i >= ucxGenWords; i-- {
		g.landing = append(g.landing, i)
	}
	return g, nil
}

// ExposeGeneration implements transport.RMAGenerations with a word of the transport's generation
// region: the value is this transport's next, stored atomically; end stores the one after.
func (t *ucxTransport) ExposeGeneration() (uint64, []byte, uint64, func(), error) {
	if err := t.rmaRefused("a generation word"); err != nil {
		return 0, nil, 0, nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, nil, 0, nil, transport.ErrClosed
	}
	g, err := t.gensLocked()
	if err != nil {
		return 0, nil, 0, nil, err
	}
	slot := g.next
	if k := len(g.free); k > 0 {
		slot, g.free = g.free[k-1], g.free[:k-1]
	} else if slot >= ucxGenWords {
		return 0, nil, 0, nil, fmt.Errorf("%w: all %d in use", transport.ErrNoGenerationWord, ucxGenWords)
	} else {
		g.next++
	}
	w := g.word(slot)
	value := g.value.Add(1)
	atomic.StoreUint64(w, value)
	g.held.Add(1)
	var once sync.Once
	mem := g.mem
	end := func() {
		once.Do(func() {
			defer g.held.Add(-1) // after mu: the word is no longer held either way
			t.mu.Lock()
			defer t.mu.Unlock()
			if g.mem != mem { // Close unmapped the region (closeGens): no peer reads it any more
				return
			}
			atomic.StoreUint64(w, g.value.Add(1)) // a value no exposure was given, before any reuse
			g.free = append(g.free, slot)
		})
	}
	return uint64(uintptr(unsafe.Pointer(w))), g.key, value, end, nil
}

// GenerationWords implements transport.GenerationWords: the exposure words held now, of
// ucxGenWords. It takes no lock: the engine's Health asks, and never blocks.
func (t *ucxTransport) GenerationWords() (held, total int) {
	return int(t.gens.held.Load()), ucxGenWords
}

// PrepareReadGeneration implements transport.RMAGenerations: it unpacks key on the transport's own
// endpoint to from now, beside the pool's key, rather than after the data gets. Unpacking a
// shared-memory key attaches the peer's segment through /proc/<pid>: done after the peer died
// (its data gets, from a segment already attached, can still succeed), UCX 1.13 fails the
// unpack and then crashes the process in its own clean-up (seen in
// TestUCXDirect_PeerKilledMidTransfer).
func (t *ucxTransport) PrepareReadGeneration(from transport.Peer, key []byte) error {
	if err := t.rmaRefused("a generation word's key"); err != nil {
		return err
	}
	if err := t.ensureEndpoint(from); err != nil { // made outside mu, as PostGet's
		return err
	}
	return t.ensureKey(from, 0, key) // unpacked outside mu too
}

// PostReadGeneration implements transport.RMAGenerations with one fenced ucp_get_nbx of 8 bytes into a
// landing word of the generation region: the fence orders it after every get this worker
// posted before it. A word this process maps is loaded from the mapping instead.
func (t *ucxTransport) PostReadGeneration(from transport.Peer, tag transport.Tag, key []byte, addr uint64, done func(transport.Completion, uint64)) (transport.OpID, error) {
	if err := t.rmaRefused("a read of a generation word"); err != nil {
		return 0, err
	}
	if err := t.ensureEndpoint(from); err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, transport.ErrClosed
	}
	g, err := t.gensLocked()
	if err != nil {
		return 0, err
	}
	if len(g.landing) == 0 {
		return 0, fmt.Errorf("kvxfer: %d generation reads in flight already", ucxGenWords)
	}
	ep, err := t.endpointLocked(from)
	if err != nil {
		return 0, err
	}
	rk, err := t.remoteKeyLocked(from, 0, ep, key) // lane 0: the transport's own worker
	if err != nil {
		return 0, err
	}
	// A word this process maps (the peer's region seen over shared memory) is read here, as
	// MapRemote's views are: a UCX get of it may be emulated, answered by the peer's worker
	// (UCX 1.22 has no RMA lane over shared memory with peer error handling), which a sender
	// frozen after its last byte was read would never answer. The engine reads the word only
	// after every get of the transfer completed, so no fence is needed to order it after them.
	var view []byte
	if addr%8 == 0 {
		if view, err = rk.rk.View(addr, 8); err != nil {
			return 0, fmt.Errorf("%w: %.16s: mapping its generation word: %w", transport.ErrProtocol, from, err)
		}
	}
	slot := g.landing[len(g.landing)-1]
	g.landing = g.landing[:len(g.landing)-1]
	w := g.word(slot)
	atomic.StoreUint64(w, 0)
	t.nextOp++
	op := &ucxOp{id: t.nextOp, send: true, peer: from, size: 8}
	rk.inflight++
	land := func(c transport.Completion) {
		v := atomic.LoadUint64(w)
		t.mu.Lock()
		g.landing = append(g.landing, slot)
		t.mu.Unlock()
		done(c, v)
	}
	if view != nil {
		atomic.StoreUint64(w, atomic.LoadUint64((*uint64)(unsafe.Pointer(unsafe.SliceData(view)))))
		// Reported as a finished process_vm_readv get is: deliverCMA releases the key's use.
		op.cma = &ucxCMAGet{key: rk, started: true, finished: true}
		op.done = land
		t.ops[op.id] = op
		t.push(ucxReport{cma: op})
		return op.id, nil
	}
	op.done = func(c transport.Completion) {
		if c.Memory == transport.MemoryBusy {
			done(c, 0)
			return
		}
		t.keyUnused(rk)
		land(c)
	}
	op.req = ep.GetFenced(g.mem, int64(8*slot), 8, addr, rk.rk)
	t.ops[op.id] = op
	t.byReq[op.req] = op
	return op.id, nil
}

// closeGens unmaps the generation region once the worker is gone (Close).
func (t *ucxTransport) closeGens() error {
	t.mu.Lock()
	mem := t.gens.mem
	t.gens.mem = nil
	t.mu.Unlock()
	if mem == nil {
		return nil
	}
	return mem.Close()
}
