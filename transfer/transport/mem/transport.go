// SPDX-License-Identifier: Apache-2.0

package mem

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/transfer/internal/queue"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Transport is one endpoint of a Network. It implements transport.Transport, and transport.DirectTransport
// for the pools named to AllowDirect.
type Transport struct {
	net  *Network
	addr transport.Peer

	// callbacks run in order on the endpoint's own goroutine (dispatch); closed by Close, after
	// which what reaches the endpoint is dropped.
	callbacks queue.Queue[func(transport.Inbound)]
	inMu      sync.Mutex
	in        transport.Inbound // guarded by inMu
	closed    chan struct{}
	exited    chan struct{}
	once      sync.Once
	// direct holds the pools AllowDirect named, by the id their RMA keys carry (ids are never
	// reused, so a key outlives ForgetDirect only as a key that names nothing); guarded by
	// net.mu.
	direct     map[uint32][]byte
	nextDirect uint32
	emulated   map[transport.Peer]bool // EmulateGets (emul.go); guarded by net.mu
	gens       memGens                 // rma.go: generation words, guarded by net.mu
	getLanes   int                     // SetGetLanes (emul.go); guarded by net.mu
	mapping    bool                    // MapPeers (rma.go); guarded by net.mu
}

var (
	_ transport.Transport       = (*Transport)(nil)
	_ transport.DirectTransport = (*Transport)(nil)
)

// AllowDirect lets the one-copy path use pool (and any part of it): Direct reports true for
// it. The in-memory network copies between Go slices anyway; the opt-in mirrors a real
// transport, where only mapped or registered memory qualifies, and lets tests have one side
// direct-capable and the other not.
func (t *Transport) AllowDirect(pool []byte) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if t.direct == nil {
		t.direct = map[uint32][]byte{}
	}
	t.direct[t.nextDirect] = pool
	t.nextDirect++
}

// ForgetDirect undoes AllowDirect for pool (the same slice: its first byte and length): new
// operations on it are refused and RMA keys naming it name nothing, as a real transport's are
// once the memory is unregistered. Operations already posted go on. It reports whether pool
// was allowed.
func (t *Transport) ForgetDirect(pool []byte) bool {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	for id, d := range t.direct {
		if len(d) == len(pool) && unsafe.SliceData(d) == unsafe.SliceData(pool) {
			delete(t.direct, id)
			return true
		}
	}
	return false
}

// Direct implements transport.DirectTransport.
func (t *Transport) Direct(pool []byte) bool {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	return t.directLocked(pool)
}

func (t *Transport) directLocked(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for _, d := range t.direct {
		q := uintptr(unsafe.Pointer(unsafe.SliceData(d)))
		if len(d) > 0 && p >= q && p+uintptr(len(b)) <= q+uintptr(len(d)) {
			return true
		}
	}
	return false
}

// PostSendIOV implements transport.DirectTransport.
func (t *Transport) PostSendIOV(to transport.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return t.postIOV(true, to, tag, iov, done)
}

// PostRecvIOV implements transport.DirectTransport.
func (t *Transport) PostRecvIOV(from transport.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return t.postIOV(false, from, tag, iov, done)
}

func (t *Transport) postIOV(send bool, peer transport.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	if len(iov) == 0 {
		return 0, fmt.Errorf("%w: an empty IOV", transport.ErrInvalidSpec)
	}
	t.net.mu.Lock()
	for i, b := range iov {
		if !t.directLocked(b) {
			t.net.mu.Unlock()
			return 0, fmt.Errorf("%w: IOV piece %d lies outside every pool named to AllowDirect", transport.ErrInvalidSpec, i)
		}
	}
	t.net.mu.Unlock()
	return t.postOp(send, peer, tag, nil, iov, done)
}

// deliver queues f for the endpoint's callback goroutine; after Close it is dropped.
func (t *Transport) deliver(f func(transport.Inbound)) { t.callbacks.Push(f) }

// dispatch runs callbacks in order on the endpoint's own goroutine until Close has drained
// them.
func (t *Transport) dispatch() {
	defer close(t.exited)
	ready := t.callbacks.Ready()
	var batch []func(transport.Inbound)
	for {
		closing := t.callbacks.Closed() // before the Take: one after Close takes the last
		batch = t.callbacks.Take(batch)
		t.inMu.Lock()
		in := t.in
		t.inMu.Unlock()
		for _, f := range batch {
			if in != nil { // an endpoint nobody bound drops what reaches it, like a dead host
				f(in)
			}
		}
		if closing && len(batch) == 0 {
			return
		}
		clear(batch)
		select {
		case <-ready:
		case <-t.closed:
		}
	}
}

// Bind implements transport.Transport.
func (t *Transport) Bind(in transport.Inbound) error {
	t.inMu.Lock()
	defer t.inMu.Unlock()
	if t.in != nil {
		return errors.New("kvxfer: memtransport already bound")
	}
	t.in = in
	return nil
}

func (t *Transport) checkLocked(peer transport.Peer) error {
	n := t.net
	switch {
	case t.isClosed():
		return transport.ErrClosed
	case n.lost[t.addr] || n.lost[peer]:
		return fmt.Errorf("%w: %s", transport.ErrPeerLost, peer)
	case n.eps[peer] == nil:
		return fmt.Errorf("%w: no endpoint %q", transport.ErrPeerLost, peer)
	}
	return nil
}

func (t *Transport) isClosed() bool {
	select {
	case <-t.closed:
		return true
	default:
		return false
	}
}

// SendControl implements transport.Transport.
func (t *Transport) SendControl(to transport.Peer, msg []byte) error {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := t.checkLocked(to); err != nil {
		return err
	}
	if n.maxControl > 0 && len(msg) > n.maxControl {
		return &transport.ControlSizeError{Bytes: len(msg), Room: n.maxControl}
	}
	kind := transport.Kind(0)
	if len(msg) > 3 {
		kind = transport.Kind(msg[3])
	}
	f := n.faultFor(FaultPoint{From: t.addr, To: to, Kind: kind, Bytes: len(msg)})
	if f.Drop {
		return nil
	}
	b := append([]byte(nil), msg...)
	dst := n.eps[to]
	copies := 1
	if f.Duplicate {
		copies = 2
	}
	for range copies {
		send := func() { dst.deliver(func(in transport.Inbound) { in.OnControl(t.addr, b) }) }
		if f.Delay > 0 {
			time.AfterFunc(f.Delay, send)
		} else {
			send()
		}
	}
	return nil
}

func (t *Transport) post(send bool, peer transport.Peer, tag transport.Tag, buf []byte, cb func(transport.Completion)) (transport.OpID, error) {
	return t.postOp(send, peer, tag, buf, nil, cb)
}

func (t *Transport) postOp(send bool, peer transport.Peer, tag transport.Tag, buf []byte, iov [][]byte, cb func(transport.Completion)) (transport.OpID, error) {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := t.checkLocked(peer); err != nil {
		return 0, err
	}
	var l *link
	if send {
		l = n.link(t.addr, peer)
	} else {
		l = n.link(peer, t.addr)
	}
	l.nextOp++
	op := &memOp{id: transport.OpID(l.idx+1)<<opLinkShift | l.nextOp, ep: t, send: send, link: l, tag: tag, buf: buf, iov: iov, cb: cb}
	if send {
		op.fault = n.faultFor(FaultPoint{From: t.addr, To: peer, Kind: transport.KindData, Tag: tag, Bytes: op.size()})
	}
	l.ops[op.id] = op
	other, mine := l.posted, l.unexpected
	if !send {
		other, mine = l.unexpected, l.posted
	}
	if q := other[tag]; len(q) > 0 {
		match := q[0]
		if len(q) == 1 {
			delete(other, tag)
		} else {
			other[tag] = q[1:]
		}
		if send {
			n.startWire(op, match)
		} else {
			n.startWire(match, op)
		}
	} else {
		mine[tag] = append(mine[tag], op)
	}
	return op.id, nil
}

// PostSend implements transport.Transport.
func (t *Transport) PostSend(to transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return t.post(true, to, tag, buf, done)
}

// PostRecv implements transport.Transport.
func (t *Transport) PostRecv(from transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return t.post(false, from, tag, buf, done)
}

// Cancel implements transport.Transport: an operation not on the wire stops at once (transport.ErrCancelled,
// transport.MemoryDone); one on the wire reports transport.MemoryBusy and finishes with the wire, unless its
// fault says IgnoreCancel (nothing happens) or NeverQuiesce (it never finishes).
func (t *Transport) Cancel(id transport.OpID) {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	i := int(id>>opLinkShift) - 1
	if i < 0 || i >= len(n.byIdx) {
		return
	}
	op := n.byIdx[i].ops[id]
	if op == nil || op.ep != t {
		return
	}
	f := n.wireFault(op)
	if f.IgnoreCancel {
		return
	}
	switch op.state {
	case opPending:
		n.unlist(op)
		n.complete(op, transport.ErrCancelled, 0, transport.MemoryDone)
	case opWire:
		if !op.busy {
			op.busy = true
			n.complete(op, transport.ErrCancelled, 0, transport.MemoryBusy)
		}
		if f.NeverQuiesce {
			op.neverFinal = true
		}
	}
}

// Close implements transport.Transport. Every operation of this endpoint gets its final verdict (memory
// done, or unknown under NeverQuiesce), the peers' operations paired with them fail with
// transport.ErrPeerLost, queued callbacks run, and the callback goroutine ends.
func (t *Transport) Close(force bool) error {
	first := false
	t.once.Do(func() { first = true })
	if !first {
		return nil
	}
	n := t.net
	n.mu.Lock()
	close(t.closed)
	for _, op := range n.sortedOps(func(l *link) bool { return l.from == t.addr || l.to == t.addr }) {
		if op.ep == t {
			n.cut(op, transport.ErrClosed)
		} else {
			n.cut(op, fmt.Errorf("%w: %s closed", transport.ErrPeerLost, t.addr))
		}
	}
	delete(n.eps, t.addr)
	n.mu.Unlock()
	t.callbacks.Close()
	<-t.exited // the goroutine only runs queued callbacks, which do not block
	return nil
}

// ControlRoom implements transport.ControlBound: the SetMaxControl bound, or the largest int.
func (t *Transport) ControlRoom() int {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if t.net.maxControl > 0 {
		return t.net.maxControl
	}
	return math.MaxInt
}

var _ transport.PeerCloser = (*Transport)(nil)

// ClosePeer implements transport.PeerCloser as UCX's endpoint force close does: every
// operation of this endpoint with peer, and the peer's operation paired with it on the wire,
// ends with transport.ErrPeerLost (memory done, or unknown under NeverQuiesce); what either side
// posts later is matched afresh.
func (t *Transport) ClosePeer(peer transport.Peer) {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if t.isClosed() {
		return
	}
	err := fmt.Errorf("%w: %s: connection closed", transport.ErrPeerLost, peer)
	for _, op := range n.sortedOps(func(l *link) bool {
		return (l.from == t.addr && l.to == peer) || (l.from == peer && l.to == t.addr)
	}) {
		if op.ep == t {
			n.cut(op, err)
		}
	}
}
