// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"sync"
)

// opLedger wraps a transport (and whichever of DirectTransport, RMATransport, RMAEmulation,
// TransportHealth and ControlBound it implements) and checks L6 on every operation an engine
// posts through it: sends, receives, IOV messages and RMA gets each get exactly one final
// completion (a memory verdict other than MemoryBusy), nothing after it, and a post that was
// refused never completes.
type opLedger struct {
	inner Transport

	mu       sync.Mutex
	ops      []*ledgerOp
	kinds    map[string]int // posted operations by kind
	problems []string
}

type ledgerOp struct {
	kind          string
	tag           Tag
	finals, busys int
	refused       bool
}

func newOpLedger(inner Transport) *opLedger {
	return &opLedger{inner: inner, kinds: map[string]int{}}
}

func (l *opLedger) track(kind string, tag Tag, done func(Completion), post func(func(Completion)) (OpID, error)) (OpID, error) {
	op := &ledgerOp{kind: kind, tag: tag}
	// The lock is not held across the post: a transport may complete an operation before
	// the post returns, on the posting goroutine.
	id, err := post(func(c Completion) {
		l.mu.Lock()
		switch {
		case op.refused:
			l.problems = append(l.problems, fmt.Sprintf("%s of request %d chunk %d completed though its post was refused", kind, tag.Request, tag.Seq))
		case op.finals > 0:
			l.problems = append(l.problems, fmt.Sprintf("%s of request %d chunk %d reported %v after its final completion", kind, tag.Request, tag.Seq, c.Memory))
		}
		if c.Memory == MemoryBusy {
			op.busys++
		} else {
			op.finals++
		}
		l.mu.Unlock()
		done(c)
	})
	l.mu.Lock()
	if err != nil {
		op.refused = true
		if op.finals+op.busys > 0 {
			l.problems = append(l.problems, fmt.Sprintf("%s of request %d chunk %d completed though its post was refused", kind, tag.Request, tag.Seq))
		}
	} else {
		l.ops = append(l.ops, op)
		l.kinds[kind]++
	}
	l.mu.Unlock()
	return id, err
}

// check returns every problem seen, and one for each posted operation without exactly one
// final completion. Call it once the engine is closed, when every operation must have ended.
func (l *opLedger) check() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]string(nil), l.problems...)
	for _, op := range l.ops {
		if op.finals != 1 {
			out = append(out, fmt.Sprintf("%s of request %d chunk %d: %d final completions", op.kind, op.tag.Request, op.tag.Seq, op.finals))
		}
	}
	return out
}

// open counts the posted operations without a final completion yet.
func (l *opLedger) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := 0
	for _, op := range l.ops {
		if op.finals == 0 {
			k++
		}
	}
	return k
}

func (l *opLedger) posted() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for k, v := range l.kinds {
		out[k] = v
	}
	return out
}

// Bind implements Transport.
func (l *opLedger) Bind(in Inbound) error { return l.inner.Bind(in) }

// SendControl implements Transport.
func (l *opLedger) SendControl(to Peer, msg []byte) error { return l.inner.SendControl(to, msg) }

// PostSend implements Transport.
func (l *opLedger) PostSend(to Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error) {
	return l.track("send", tag, done, func(cb func(Completion)) (OpID, error) { return l.inner.PostSend(to, tag, buf, cb) })
}

// PostRecv implements Transport.
func (l *opLedger) PostRecv(from Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error) {
	return l.track("receive", tag, done, func(cb func(Completion)) (OpID, error) { return l.inner.PostRecv(from, tag, buf, cb) })
}

// Cancel implements Transport.
func (l *opLedger) Cancel(id OpID) { l.inner.Cancel(id) }

// Close implements Transport.
func (l *opLedger) Close(force bool) error { return l.inner.Close(force) }

// Direct implements DirectTransport.
func (l *opLedger) Direct(pool []byte) bool {
	d, ok := l.inner.(DirectTransport)
	return ok && d.Direct(pool)
}

// PostSendIOV implements DirectTransport.
func (l *opLedger) PostSendIOV(to Peer, tag Tag, iov [][]byte, done func(Completion)) (OpID, error) {
	return l.track("IOV send", tag, done, func(cb func(Completion)) (OpID, error) {
		return l.inner.(DirectTransport).PostSendIOV(to, tag, iov, cb)
	})
}

// PostRecvIOV implements DirectTransport.
func (l *opLedger) PostRecvIOV(from Peer, tag Tag, iov [][]byte, done func(Completion)) (OpID, error) {
	return l.track("IOV receive", tag, done, func(cb func(Completion)) (OpID, error) {
		return l.inner.(DirectTransport).PostRecvIOV(from, tag, iov, cb)
	})
}

// RMAKey implements RMATransport.
func (l *opLedger) RMAKey(pool []byte) (uint64, []byte, error) {
	r, ok := l.inner.(RMATransport)
	if !ok {
		return 0, nil, fmt.Errorf("%T has no RMA", l.inner)
	}
	return r.RMAKey(pool)
}

// PostGet implements RMATransport.
func (l *opLedger) PostGet(from Peer, tag Tag, key []byte, addr uint64, dst []byte, done func(Completion)) (OpID, error) {
	return l.track("get", tag, done, func(cb func(Completion)) (OpID, error) {
		r, ok := l.inner.(RMATransport)
		if !ok {
			return 0, fmt.Errorf("%T has no RMA", l.inner)
		}
		return r.PostGet(from, tag, key, addr, dst, cb)
	})
}

// ExposeGeneration implements RMAGenerations.
func (l *opLedger) ExposeGeneration() (uint64, []byte, uint64, func(), error) {
	g, ok := l.inner.(RMAGenerations)
	if !ok {
		return 0, nil, 0, nil, fmt.Errorf("%T has no generation words", l.inner)
	}
	return g.ExposeGeneration()
}

// PrepareReadGeneration implements RMAGenerations.
func (l *opLedger) PrepareReadGeneration(from Peer, key []byte) error {
	g, ok := l.inner.(RMAGenerations)
	if !ok {
		return fmt.Errorf("%T has no generation words", l.inner)
	}
	return g.PrepareReadGeneration(from, key)
}

// PostReadGeneration implements RMAGenerations; the read is an operation like any other.
func (l *opLedger) PostReadGeneration(from Peer, tag Tag, key []byte, addr uint64, done func(Completion, uint64)) (OpID, error) {
	var value uint64 // written by the transport's callback before cb runs
	return l.track("generation read", tag, func(c Completion) { done(c, value) }, func(cb func(Completion)) (OpID, error) {
		g, ok := l.inner.(RMAGenerations)
		if !ok {
			return 0, fmt.Errorf("%T has no generation words", l.inner)
		}
		return g.PostReadGeneration(from, tag, key, addr, func(c Completion, v uint64) { value = v; cb(c) })
	})
}

// GetsEmulated implements RMAEmulation (false where the inner transport cannot tell).
func (l *opLedger) GetsEmulated(peer Peer) bool {
	em, ok := l.inner.(RMAEmulation)
	return ok && em.GetsEmulated(peer)
}

// TransportHealth implements TransportHealth (nil where the inner transport has none).
func (l *opLedger) TransportHealth() error {
	if th, ok := l.inner.(TransportHealth); ok {
		return th.TransportHealth()
	}
	return nil
}

// ControlRoom implements ControlBound.
func (l *opLedger) ControlRoom() int {
	if cb, ok := l.inner.(ControlBound); ok {
		return cb.ControlRoom()
	}
	return 1 << 30
}

var (
	_ RMAEmulation    = (*opLedger)(nil)
	_ RMAGenerations  = (*opLedger)(nil)
	_ TransportHealth = (*opLedger)(nil)
	_ ControlBound    = (*opLedger)(nil)
)

// finals counts the final reports among cs (those that are not MemoryBusy).
func finals(cs []Completion) int {
	n := 0
	for _, c := range cs {
		if c.Memory != MemoryBusy {
			n++
		}
	}
	return n
}
