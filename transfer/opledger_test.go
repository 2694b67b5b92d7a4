// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// opLedger wraps a transport (and whichever of DirectTransport, RMATransport, RMAEmulation,
// TransportHealth and ControlBound it implements) and checks L6 on every operation an engine
// posts through it: sends, receives, IOV messages and RMA gets each get exactly one final
// completion (a memory verdict other than MemoryBusy), nothing after it, and a post that was
// refused never completes.
type opLedger struct {
	inner transport.Transport

	mu       sync.Mutex
	ops      []*ledgerOp
	kinds    map[string]int // posted operations by kind
	problems []string
}

type ledgerOp struct {
	kind          string
	tag           transport.Tag
	finals, busys int
	refused       bool
}

func newOpLedger(inner transport.Transport) *opLedger {
	return &opLedger{inner: inner, kinds: map[string]int{}}
}

func (l *opLedger) track(kind string, tag transport.Tag, done func(transport.Completion), post func(func(transport.Completion)) (transport.OpID, error)) (transport.OpID, error) {
	op := &ledgerOp{kind: kind, tag: tag}
	// The lock is not held across the post: a transport may complete an operation before
	// the post returns, on the posting goroutine.
	id, err := post(func(c transport.Completion) {
		l.mu.Lock()
		switch {
		case op.refused:
			l.problems = append(l.problems, fmt.Sprintf("%s of request %d chunk %d completed though its post was refused", kind, tag.Request, tag.Seq))
		case op.finals > 0:
			l.problems = append(l.problems, fmt.Sprintf("%s of request %d chunk %d reported %v after its final completion", kind, tag.Request, tag.Seq, c.Memory))
		}
		if c.Memory == transport.MemoryBusy {
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
func (l *opLedger) Bind(in transport.Inbound) error { return l.inner.Bind(in) }

// SendControl implements Transport.
func (l *opLedger) SendControl(to Peer, msg []byte) error { return l.inner.SendControl(to, msg) }

// PostSend implements Transport.
func (l *opLedger) PostSend(to Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return l.track("send", tag, done, func(cb func(transport.Completion)) (transport.OpID, error) { return l.inner.PostSend(to, tag, buf, cb) })
}

// PostRecv implements Transport.
func (l *opLedger) PostRecv(from Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return l.track("receive", tag, done, func(cb func(transport.Completion)) (transport.OpID, error) {
		return l.inner.PostRecv(from, tag, buf, cb)
	})
}

// Cancel implements Transport.
func (l *opLedger) Cancel(id transport.OpID) { l.inner.Cancel(id) }

// Close implements Transport.
func (l *opLedger) Close(force bool) error { return l.inner.Close(force) }

// Direct implements DirectTransport.
func (l *opLedger) Direct(pool []byte) bool {
	d, ok := l.inner.(transport.DirectTransport)
	return ok && d.Direct(pool)
}

// PostSendIOV implements DirectTransport.
func (l *opLedger) PostSendIOV(to Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return l.track("IOV send", tag, done, func(cb func(transport.Completion)) (transport.OpID, error) {
		return l.inner.(transport.DirectTransport).PostSendIOV(to, tag, iov, cb)
	})
}

// PostRecvIOV implements DirectTransport.
func (l *opLedger) PostRecvIOV(from Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return l.track("IOV receive", tag, done, func(cb func(transport.Completion)) (transport.OpID, error) {
		return l.inner.(transport.DirectTransport).PostRecvIOV(from, tag, iov, cb)
	})
}

// RMAKey implements RMATransport.
func (l *opLedger) RMAKey(pool []byte) (uint64, []byte, error) {
	r, ok := l.inner.(transport.RMATransport)
	if !ok {
		return 0, nil, fmt.Errorf("%T has no RMA", l.inner)
	}
	return r.RMAKey(pool)
}

// PostGet implements RMATransport.
func (l *opLedger) PostGet(from Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (transport.OpID, error) {
	return l.track("get", tag, done, func(cb func(transport.Completion)) (transport.OpID, error) {
		r, ok := l.inner.(transport.RMATransport)
		if !ok {
			return 0, fmt.Errorf("%T has no RMA", l.inner)
		}
		return r.PostGet(from, tag, key, addr, dst, cb)
	})
}

// ExposeGeneration implements RMAGenerations.
func (l *opLedger) ExposeGeneration() (uint64, []byte, uint64, func(), error) {
	g, ok := l.inner.(transport.RMAGenerations)
	if !ok {
		return 0, nil, 0, nil, fmt.Errorf("%T has no generation words", l.inner)
	}
	return g.ExposeGeneration()
}

// PrepareReadGeneration implements RMAGenerations.
func (l *opLedger) PrepareReadGeneration(from Peer, key []byte) error {
	g, ok := l.inner.(transport.RMAGenerations)
	if !ok {
		return fmt.Errorf("%T has no generation words", l.inner)
	}
	return g.PrepareReadGeneration(from, key)
}

// PostReadGeneration implements RMAGenerations; the read is an operation like any other.
func (l *opLedger) PostReadGeneration(from Peer, tag transport.Tag, key []byte, addr uint64, done func(transport.Completion, uint64)) (transport.OpID, error) {
	var value uint64 // written by the transport's callback before cb runs
	return l.track("generation read", tag, func(c transport.Completion) { done(c, value) }, func(cb func(transport.Completion)) (transport.OpID, error) {
		g, ok := l.inner.(transport.RMAGenerations)
		if !ok {
			return 0, fmt.Errorf("%T has no generation words", l.inner)
		}
		return g.PostReadGeneration(from, tag, key, addr, func(c transport.Completion, v uint64) { value = v; cb(c) })
	})
}

// GetsEmulated implements RMAEmulation (false where the inner transport cannot tell).
func (l *opLedger) GetsEmulated(peer Peer) bool {
	em, ok := l.inner.(transport.RMAEmulation)
	return ok && em.GetsEmulated(peer)
}

// TransportHealth implements TransportHealth (nil where the inner transport has none).
func (l *opLedger) TransportHealth() error {
	if th, ok := l.inner.(transport.TransportHealth); ok {
		return th.TransportHealth()
	}
	return nil
}

// ControlRoom implements ControlBound.
func (l *opLedger) ControlRoom() int {
	if cb, ok := l.inner.(transport.ControlBound); ok {
		return cb.ControlRoom()
	}
	return 1 << 30
}

var (
	_ transport.RMAEmulation    = (*opLedger)(nil)
	_ transport.RMAGenerations  = (*opLedger)(nil)
	_ transport.TransportHealth = (*opLedger)(nil)
	_ transport.ControlBound    = (*opLedger)(nil)
)

// finals counts the final reports among cs (those that are not MemoryBusy).
func finals(cs []transport.Completion) int {
	n := 0
	for _, c := range cs {
		if c.Memory != transport.MemoryBusy {
			n++
		}
	}
	return n
}
