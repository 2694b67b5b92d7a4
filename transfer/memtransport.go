// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"
	"unsafe"
)

// MemNetwork is an in-process network of MemTransports: engines in one process exchange real
// bytes through it, and tests make it fail the ways a real network does (see Fault). It keeps
// the Transport contract exactly: every posted operation reports once with MemoryDone or
// MemoryUnknown (after at most one MemoryBusy), callbacks run on the owning transport's own
// goroutine, and nothing waits without a bound.
//
// The wire model: a posted send is delivered to its peer at once and either matches a posted
// receive with the same tag or waits, unexpected, for one. A matched pair is "on the wire"
// until its bytes are copied: at once by default, after Fault.Delay, or (Fault.Hang) not until
// Resume or a force close. An operation not yet on the wire is cancellable (it reports
// ErrCancelled, MemoryDone); one on the wire is not: a cancel reports MemoryBusy and the op
// finishes when the wire does, as a UCX send in progress would.
type MemNetwork struct {
	mu    sync.Mutex
	eps   map[Peer]*MemTransport
	links map[[2]Peer]*link // by (from, to)
	byIdx []*link           // by index, for Cancel
	held  []*memOp          // sends on the wire, hung until Resume
	lost  map[Peer]bool
	fault func(FaultPoint) Fault
	// maxControl bounds control messages, as a real transport's buffers do (0: no bound).
	maxControl int
}

// link is one direction between two endpoints. Matching state lives per link, as a real
// transport keeps it per endpoint, so one busy or crowded pair of peers does not slow another.
type link struct {
	idx        int
	from, to   Peer
	ops        map[OpID]*memOp  // live operations of either side on this link
	posted     map[Tag][]*memOp // receives waiting for a send
	unexpected map[Tag][]*memOp // sends waiting for a receive
	nextOp     OpID
}

// opLinkShift puts a link's index in an OpID's high bits, so Cancel finds the link at once.
const opLinkShift = 40

func (n *MemNetwork) link(from, to Peer) *link {
	l := n.links[[2]Peer{from, to}]
	if l == nil {
		l = &link{idx: len(n.byIdx), from: from, to: to, ops: map[OpID]*memOp{}, posted: map[Tag][]*memOp{}, unexpected: map[Tag][]*memOp{}}
		n.links[[2]Peer{from, to}] = l
		n.byIdx = append(n.byIdx, l)
	}
	return l
}

// FaultPoint describes a message about to travel, for the fault function to judge.
type FaultPoint struct {
	From, To Peer
	// Kind is the message kind: KindData for a chunk, a control kind otherwise.
	Kind Kind
	// Tag is the chunk's tag (zero for control messages).
	Tag   Tag
	Bytes int
	// Generation marks the read of an RMA exposure's generation word (RMAGenerations), a
	// KindData get that carries no stream bytes.
	Generation bool
}

// Fault is what the network does to one message. The zero Fault delivers it normally.
type Fault struct {
	// Delay holds the message (a chunk on the wire, or a control message) this long.
	Delay time.Duration
	// Hang keeps a chunk on the wire until Resume, or until a force close ends it.
	Hang bool
	// FailAfter, when positive, copies only this many bytes of a chunk, then fails both
	// sides (memory done).
	FailAfter int
	// Drop loses a control message.
	Drop bool
	// Duplicate delivers a control message twice.
	Duplicate bool
	// IgnoreCancel makes cancels of the chunk's operations do nothing at all: it completes
	// late, successfully, after a cancel or a deadline.
	IgnoreCancel bool
	// NeverQuiesce makes the chunk's operations, once cancelled or cut off, report
	// MemoryBusy and never a final verdict until a force close, which reports MemoryUnknown.
	NeverQuiesce bool
}

// ErrInjected is the error of a failure the network was told to inject.
var ErrInjected = errors.New("kvxfer: injected transport failure")

const (
	opPending = iota // posted, not matched
	opWire           // matched, bytes not yet copied
	opDone           // final verdict given
)

type memOp struct {
	id         OpID
	ep         *MemTransport
	send       bool
	link       *link
	tag        Tag
	buf        []byte
	iov        [][]byte // a direct operation's pieces; nil: buf
	cb         func(Completion)
	fault      Fault // a send's fault; applies to its wire pair
	state      int
	pair       *memOp
	timer      *time.Timer
	busy       bool // MemoryBusy reported
	neverFinal bool // NeverQuiesce was triggered: no final until a force close
}

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{eps: map[Peer]*MemTransport{}, links: map[[2]Peer]*link{}, lost: map[Peer]bool{}}
}

// SetFault installs the function that decides each message's fault (nil: none). It applies to
// messages sent from now on.
func (n *MemNetwork) SetFault(f func(FaultPoint) Fault) {
	n.mu.Lock()
	n.fault = f
	n.mu.Unlock()
}

// SetMaxControl bounds the control messages every endpoint sends from now on: SendControl
// refuses a larger one, and ControlRoom says n. Zero removes the bound.
func (n *MemNetwork) SetMaxControl(bytes int) {
	n.mu.Lock()
	n.maxControl = bytes
	n.mu.Unlock()
}

// ControlRoom implements ControlBound: the SetMaxControl bound, or the largest int.
func (t *MemTransport) ControlRoom() int {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	if t.net.maxControl > 0 {
		return t.net.maxControl
	}
	return math.MaxInt
}

func (n *MemNetwork) faultFor(fp FaultPoint) Fault {
	if n.fault == nil {
		return Fault{}
	}
	return n.fault(fp)
}

// Transport returns a new endpoint named addr, with its own callback goroutine (ended by
// Close).
func (n *MemNetwork) Transport(addr Peer) *MemTransport {
	t := &MemTransport{net: n, addr: addr, notify: make(chan struct{}, 1), closed: make(chan struct{}), exited: make(chan struct{})}
	n.mu.Lock()
	n.eps[addr] = t
	n.mu.Unlock()
	go t.dispatch()
	return t
}

// Resume puts every hung chunk back in motion: its bytes are copied and both sides complete.
func (n *MemNetwork) Resume() {
	n.mu.Lock()
	defer n.mu.Unlock()
	held := n.held
	n.held = nil
	for _, s := range held {
		n.finishWire(s)
	}
}

// Pending returns the number of operations without a final verdict.
func (n *MemNetwork) Pending() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := 0
	for _, l := range n.byIdx {
		k += len(l.ops)
	}
	return k
}

// OnWire returns the number of operations matched and not yet finished: chunks in transit,
// delayed or hung.
func (n *MemNetwork) OnWire() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := 0
	for _, l := range n.byIdx {
		for _, op := range l.ops {
			if op.state == opWire {
				k++
			}
		}
	}
	return k
}

// LosePeer cuts addr off: every operation to, from or of addr fails with ErrPeerLost (memory
// done, or unknown under NeverQuiesce), later posts and control messages fail, and every
// endpoint hears OnPeerLost.
func (n *MemNetwork) LosePeer(addr Peer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lost[addr] = true
	err := fmt.Errorf("%w: %s", ErrPeerLost, addr)
	for _, op := range n.sortedOps(func(l *link) bool { return l.from == addr || l.to == addr }) {
		n.cut(op, err)
	}
	for p, ep := range n.eps {
		switch {
		case p != addr:
			ep.deliver(func(in Inbound) { in.OnPeerLost(addr, err) })
		default:
			for other := range n.eps {
				if other != addr {
					ep.deliver(func(in Inbound) { in.OnPeerLost(other, err) })
				}
			}
		}
	}
}

// sortedOps lists the live operations on the chosen links in id order, so failures are
// reported deterministically.
func (n *MemNetwork) sortedOps(on func(*link) bool) []*memOp {
	var ops []*memOp
	for _, l := range n.byIdx {
		if on(l) {
			for _, op := range l.ops {
				ops = append(ops, op)
			}
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].id < ops[j].id })
	return ops
}

// cut ends op (and, on the wire, its pair) because its endpoint or peer went away. n.mu held.
func (n *MemNetwork) cut(op *memOp, err error) {
	for _, o := range []*memOp{op, op.pair} {
		if o == nil || o.state == opDone {
			continue
		}
		n.unlist(o)
		mem := MemoryDone
		if o.neverFinal || (o.state == opWire && n.wireFault(o).NeverQuiesce) {
			mem = MemoryUnknown
		}
		n.complete(o, err, 0, mem)
	}
}

func (n *MemNetwork) wireFault(op *memOp) Fault {
	if op.send {
		return op.fault
	}
	if op.pair != nil {
		return op.pair.fault
	}
	return Fault{}
}

// unlist removes op from whichever queue holds it. n.mu held.
func (n *MemNetwork) unlist(op *memOp) {
	remove := func(m map[Tag][]*memOp) {
		q := m[op.tag]
		for i, o := range q {
			if o == op {
				q = append(q[:i:i], q[i+1:]...)
				break
			}
		}
		if len(q) == 0 {
			delete(m, op.tag)
		} else {
			m[op.tag] = q
		}
	}
	if op.state == opPending {
		if op.send {
			remove(op.link.unexpected)
		} else {
			remove(op.link.posted)
		}
	}
	if op.timer != nil {
		op.timer.Stop()
	}
	for i, s := range n.held {
		if s == op {
			n.held = append(n.held[:i:i], n.held[i+1:]...)
			break
		}
	}
}

// complete reports to op's owner. A final verdict retires the op. n.mu held.
func (n *MemNetwork) complete(op *memOp, err error, bytes int, mem Memory) {
	if mem != MemoryBusy {
		op.state = opDone
		delete(op.link.ops, op.id)
	}
	cb, c := op.cb, Completion{Err: err, Bytes: bytes, Memory: mem}
	op.ep.deliver(func(Inbound) { cb(c) })
}

// startWire puts a matched pair on the wire. n.mu held.
func (n *MemNetwork) startWire(s, r *memOp) {
	s.state, r.state = opWire, opWire
	s.pair, r.pair = r, s
	switch f := s.fault; {
	case f.Hang:
		n.held = append(n.held, s)
	case f.Delay > 0:
		s.timer = time.AfterFunc(f.Delay, func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.finishWire(s)
		})
	default:
		n.finishWire(s)
	}
}

// finishWire copies a pair's bytes and completes both sides. n.mu held.
func (n *MemNetwork) finishWire(s *memOp) {
	r := s.pair
	if s.state != opWire || r == nil || r.state != opWire {
		return
	}
	sn, rn := s.size(), r.size()
	k := min(sn, rn)
	var errS, errR error
	if f := s.fault.FailAfter; f > 0 && f < k {
		k = f
		errS = fmt.Errorf("%w: failed after %d bytes", ErrInjected, f)
		errR = errS
	} else if sn > rn {
		errR = fmt.Errorf("kvxfer: message of %d bytes truncated to the %d-byte receive", sn, rn)
		errS = errR
	}
	copyPieces(r.pieces(), s.pieces(), k)
	for _, o := range []*memOp{s, r} {
		err := errS
		if o == r {
			err = errR
		}
		if o.neverFinal {
			continue // cancelled under NeverQuiesce: it stays silent until a force close
		}
		n.complete(o, err, k, MemoryDone)
	}
	for _, o := range []*memOp{s, r} {
		if o.neverFinal {
			o.pair = nil
		}
	}
}

// pieces is the op's memory as a list of slices.
func (op *memOp) pieces() [][]byte {
	if op.iov != nil {
		return op.iov
	}
	return [][]byte{op.buf}
}

// size is the op's byte count.
func (op *memOp) size() int {
	n := 0
	for _, p := range op.pieces() {
		n += len(p)
	}
	return n
}

// copyPieces copies the first k bytes of src's concatenation into dst's.
func copyPieces(dst, src [][]byte, k int) {
	var di, si, doff, soff int
	for k > 0 && di < len(dst) && si < len(src) {
		c := copy(dst[di][doff:], src[si][soff:min(len(src[si]), soff+k)])
		k -= c
		doff += c
		soff += c
		if doff == len(dst[di]) {
			di, doff = di+1, 0
		}
		if soff == len(src[si]) {
			si, soff = si+1, 0
		}
	}
}

// MemTransport is one endpoint of a MemNetwork. It implements Transport, and DirectTransport
// for the pools named to AllowDirect.
type MemTransport struct {
	net  *MemNetwork
	addr Peer

	qmu     sync.Mutex
	queue   []func(Inbound)
	notify  chan struct{}
	in      Inbound
	closed  chan struct{}
	exited  chan struct{}
	closing bool
	once    sync.Once
	// direct holds the pools AllowDirect named, by the id their RMA keys carry (ids are never
	// reused, so a key outlives ForgetDirect only as a key that names nothing); guarded by
	// net.mu.
	direct     map[uint32][]byte
	nextDirect uint32
	emulated   map[Peer]bool // EmulateGets (memtransport_emul.go); guarded by net.mu
	gens       memGens       // rma_mem.go: generation words, guarded by net.mu
	getLanes   int           // SetGetLanes (memtransport_emul.go); guarded by net.mu
}

var (
	_ Transport       = (*MemTransport)(nil)
	_ DirectTransport = (*MemTransport)(nil)
)

// AllowDirect lets the one-copy path use pool (and any part of it): Direct reports true for
// it. The in-memory network copies between Go slices anyway; the opt-in mirrors a real
// transport, where only mapped or registered memory qualifies, and lets tests have one side
// direct-capable and the other not.
func (t *MemTransport) AllowDirect(pool []byte) {
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
func (t *MemTransport) ForgetDirect(pool []byte) bool {
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

// Direct implements DirectTransport.
func (t *MemTransport) Direct(pool []byte) bool {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	return t.directLocked(pool)
}

func (t *MemTransport) directLocked(b []byte) bool {
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

// PostSendIOV implements DirectTransport.
func (t *MemTransport) PostSendIOV(to Peer, tag Tag, iov [][]byte, done func(Completion)) (OpID, error) {
	return t.postIOV(true, to, tag, iov, done)
}

// PostRecvIOV implements DirectTransport.
func (t *MemTransport) PostRecvIOV(from Peer, tag Tag, iov [][]byte, done func(Completion)) (OpID, error) {
	return t.postIOV(false, from, tag, iov, done)
}

func (t *MemTransport) postIOV(send bool, peer Peer, tag Tag, iov [][]byte, done func(Completion)) (OpID, error) {
	if len(iov) == 0 {
		return 0, fmt.Errorf("%w: an empty IOV", ErrInvalidSpec)
	}
	t.net.mu.Lock()
	for i, b := range iov {
		if !t.directLocked(b) {
			t.net.mu.Unlock()
			return 0, fmt.Errorf("%w: IOV piece %d lies outside every pool named to AllowDirect", ErrInvalidSpec, i)
		}
	}
	t.net.mu.Unlock()
	return t.postOp(send, peer, tag, nil, iov, done)
}

// deliver queues f for the endpoint's callback goroutine; after Close it is dropped.
func (t *MemTransport) deliver(f func(Inbound)) {
	t.qmu.Lock()
	if t.closing {
		t.qmu.Unlock()
		return
	}
	t.queue = append(t.queue, f)
	t.qmu.Unlock()
	select {
	case t.notify <- struct{}{}:
	default:
	}
}

// dispatch runs callbacks in order on the endpoint's own goroutine until Close has drained
// them.
func (t *MemTransport) dispatch() {
	defer close(t.exited)
	for {
		t.qmu.Lock()
		q, in, closing := t.queue, t.in, t.closing
		t.queue = nil
		t.qmu.Unlock()
		for _, f := range q {
			if in != nil { // an endpoint nobody bound drops what reaches it, like a dead host
				f(in)
			}
		}
		if closing && len(q) == 0 {
			return
		}
		select {
		case <-t.notify:
		case <-t.closed:
		}
	}
}

// Bind implements Transport.
func (t *MemTransport) Bind(in Inbound) error {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	if t.in != nil {
		return errors.New("kvxfer: memtransport already bound")
	}
	t.in = in
	return nil
}

func (t *MemTransport) checkLocked(peer Peer) error {
	n := t.net
	switch {
	case t.isClosed():
		return ErrClosed
	case n.lost[t.addr] || n.lost[peer]:
		return fmt.Errorf("%w: %s", ErrPeerLost, peer)
	case n.eps[peer] == nil:
		return fmt.Errorf("%w: no endpoint %q", ErrPeerLost, peer)
	}
	return nil
}

func (t *MemTransport) isClosed() bool {
	select {
	case <-t.closed:
		return true
	default:
		return false
	}
}

// SendControl implements Transport.
func (t *MemTransport) SendControl(to Peer, msg []byte) error {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := t.checkLocked(to); err != nil {
		return err
	}
	if n.maxControl > 0 && len(msg) > n.maxControl {
		return &ControlSizeError{Bytes: len(msg), Room: n.maxControl}
	}
	kind := Kind(0)
	if len(msg) > 3 {
		kind = Kind(msg[3])
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
		send := func() { dst.deliver(func(in Inbound) { in.OnControl(t.addr, b) }) }
		if f.Delay > 0 {
			time.AfterFunc(f.Delay, send)
		} else {
			send()
		}
	}
	return nil
}

func (t *MemTransport) post(send bool, peer Peer, tag Tag, buf []byte, cb func(Completion)) (OpID, error) {
	return t.postOp(send, peer, tag, buf, nil, cb)
}

func (t *MemTransport) postOp(send bool, peer Peer, tag Tag, buf []byte, iov [][]byte, cb func(Completion)) (OpID, error) {
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
	op := &memOp{id: OpID(l.idx+1)<<opLinkShift | l.nextOp, ep: t, send: send, link: l, tag: tag, buf: buf, iov: iov, cb: cb}
	if send {
		op.fault = n.faultFor(FaultPoint{From: t.addr, To: peer, Kind: KindData, Tag: tag, Bytes: op.size()})
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

// PostSend implements Transport.
func (t *MemTransport) PostSend(to Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error) {
	return t.post(true, to, tag, buf, done)
}

// PostRecv implements Transport.
func (t *MemTransport) PostRecv(from Peer, tag Tag, buf []byte, done func(Completion)) (OpID, error) {
	return t.post(false, from, tag, buf, done)
}

// Cancel implements Transport: an operation not on the wire stops at once (ErrCancelled,
// MemoryDone); one on the wire reports MemoryBusy and finishes with the wire, unless its
// fault says IgnoreCancel (nothing happens) or NeverQuiesce (it never finishes).
func (t *MemTransport) Cancel(id OpID) {
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
		n.complete(op, ErrCancelled, 0, MemoryDone)
	case opWire:
		if !op.busy {
			op.busy = true
			n.complete(op, ErrCancelled, 0, MemoryBusy)
		}
		if f.NeverQuiesce {
			op.neverFinal = true
		}
	}
}

// Close implements Transport. Every operation of this endpoint gets its final verdict (memory
// done, or unknown under NeverQuiesce), the peers' operations paired with them fail with
// ErrPeerLost, queued callbacks run, and the callback goroutine ends.
func (t *MemTransport) Close(force bool) error {
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
			n.cut(op, ErrClosed)
		} else {
			n.cut(op, fmt.Errorf("%w: %s closed", ErrPeerLost, t.addr))
		}
	}
	delete(n.eps, t.addr)
	n.mu.Unlock()
	t.qmu.Lock()
	t.closing = true
	t.qmu.Unlock()
	<-t.exited // the goroutine only runs queued callbacks, which do not block
	return nil
}
