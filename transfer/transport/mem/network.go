// SPDX-License-Identifier: Apache-2.0

package mem

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Network is an in-process network of Transports: engines in one process exchange real
// bytes through it, and tests make it fail the ways a real network does (see Fault). It keeps
// the transport.Transport contract exactly: every posted operation reports once with transport.MemoryDone or
// transport.MemoryUnknown (after at most one transport.MemoryBusy), callbacks run on the owning transport's own
// goroutine, and nothing waits without a bound.
//
// The wire model: a posted send is delivered to its peer at once and either matches a posted
// receive with the same tag or waits, unexpected, for one. A matched pair is "on the wire"
// until its bytes are copied: at once by default, after Fault.Delay, or (Fault.Hang) not until
// Resume or a force close. An operation not yet on the wire is cancellable (it reports
// transport.ErrCancelled, transport.MemoryDone); one on the wire is not: a cancel reports transport.MemoryBusy and the op
// finishes when the wire does, as a UCX send in progress would.
type Network struct {
	mu    sync.Mutex
	eps   map[transport.Peer]*Transport
	links map[[2]transport.Peer]*link // by (from, to)
	byIdx []*link                     // by index, for Cancel
	held  []*memOp                    // sends on the wire, hung until Resume
	lost  map[transport.Peer]bool
	fault func(FaultPoint) Fault
	// maxControl bounds control messages, as a real transport's buffers do (0: no bound).
	maxControl int
}

// link is one direction between two endpoints. Matching state lives per link, as a real
// transport keeps it per endpoint, so one busy or crowded pair of peers does not slow another.
type link struct {
	idx        int
	from, to   transport.Peer
	ops        map[transport.OpID]*memOp  // live operations of either side on this link
	posted     map[transport.Tag][]*memOp // receives waiting for a send
	unexpected map[transport.Tag][]*memOp // sends waiting for a receive
	nextOp     transport.OpID
}

// opLinkShift puts a link's index in an transport.OpID's high bits, so Cancel finds the link at once.
const opLinkShift = 40

func (n *Network) link(from, to transport.Peer) *link {
	l := n.links[[2]transport.Peer{from, to}]
	if l == nil {
		l = &link{idx: len(n.byIdx), from: from, to: to, ops: map[transport.OpID]*memOp{}, posted: map[transport.Tag][]*memOp{}, unexpected: map[transport.Tag][]*memOp{}}
		n.links[[2]transport.Peer{from, to}] = l
		n.byIdx = append(n.byIdx, l)
	}
	return l
}

// FaultPoint describes a message about to travel, for the fault function to judge.
type FaultPoint struct {
	From, To transport.Peer
	// transport.Kind is the message kind: transport.KindData for a chunk, a control kind otherwise.
	Kind transport.Kind
	// transport.Tag is the chunk's tag (zero for control messages).
	Tag   transport.Tag
	Bytes int
	// Generation marks the read of an RMA exposure's generation word (transport.RMAGenerations), a
	// transport.KindData get that carries no stream bytes.
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
	// transport.MemoryBusy and never a final verdict until a force close, which reports transport.MemoryUnknown.
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
	id         transport.OpID
	ep         *Transport
	send       bool
	link       *link
	tag        transport.Tag
	buf        []byte
	iov        [][]byte // a direct operation's pieces; nil: buf
	cb         func(transport.Completion)
	fault      Fault // a send's fault; applies to its wire pair
	state      int
	pair       *memOp
	timer      *time.Timer
	busy       bool // transport.MemoryBusy reported
	neverFinal bool // NeverQuiesce was triggered: no final until a force close
}

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{eps: map[transport.Peer]*Transport{}, links: map[[2]transport.Peer]*link{}, lost: map[transport.Peer]bool{}}
}

// SetFault installs the function that decides each message's fault (nil: none). It applies to
// messages sent from now on.
func (n *Network) SetFault(f func(FaultPoint) Fault) {
	n.mu.Lock()
	n.fault = f
	n.mu.Unlock()
}

// SetMaxControl bounds the control messages every endpoint sends from now on: SendControl
// refuses a larger one, and ControlRoom says n. Zero removes the bound.
func (n *Network) SetMaxControl(bytes int) {
	n.mu.Lock()
	n.maxControl = bytes
	n.mu.Unlock()
}

func (n *Network) faultFor(fp FaultPoint) Fault {
	if n.fault == nil {
		return Fault{}
	}
	return n.fault(fp)
}

// transport.Transport returns a new endpoint named addr, with its own callback goroutine (ended by
// Close).
func (n *Network) Transport(addr transport.Peer) *Transport {
	t := &Transport{net: n, addr: addr, closed: make(chan struct{}), exited: make(chan struct{})}
	n.mu.Lock()
	n.eps[addr] = t
	n.mu.Unlock()
	go t.dispatch()
	return t
}

// Endpoint returns the endpoint Transport made for addr, or nil.
func (n *Network) Endpoint(addr transport.Peer) *Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.eps[addr]
}

// Queued names an endpoint whose delivery queue holds callbacks not yet run, or returns ""
// when none does (the network is quiet as far as callbacks go).
func (n *Network) Queued() transport.Peer {
	n.mu.Lock()
	eps := make([]*Transport, 0, len(n.eps))
	for _, ep := range n.eps {
		eps = append(eps, ep)
	}
	n.mu.Unlock()
	for _, ep := range eps {
		if ep.callbacks.Len() > 0 || len(ep.callbacks.Ready()) > 0 {
			return ep.addr
		}
	}
	return ""
}

// Resume puts every hung chunk back in motion: its bytes are copied and both sides complete.
func (n *Network) Resume() {
	n.mu.Lock()
	defer n.mu.Unlock()
	held := n.held
	n.held = nil
	for _, s := range held {
		n.finishWire(s)
	}
}

// Pending returns the number of operations without a final verdict.
func (n *Network) Pending() int {
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
func (n *Network) OnWire() int {
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

// ReportPeerLost tells ep's engine alone that peer is lost, as a keepalive false alarm would:
// nothing on the network changes, and peer can still reach ep.
func (n *Network) ReportPeerLost(ep *Transport, peer transport.Peer, err error) {
	ep.deliver(func(in transport.Inbound) { in.OnPeerLost(peer, err) })
}

// Spoof delivers msg to the endpoint named to as if from had sent it, without from's
// knowledge: what a peer that lies about its address does over a transport whose frames name
// their sender themselves (UCX's control frames carry a self-declared worker address). Faults
// do not apply; it fails only when to is unknown.
func (n *Network) Spoof(from, to transport.Peer, msg []byte) error {
	n.mu.Lock()
	dst := n.eps[to]
	n.mu.Unlock()
	if dst == nil {
		return fmt.Errorf("%w: no endpoint %s", transport.ErrPeerLost, to)
	}
	b := append([]byte(nil), msg...)
	dst.deliver(func(in transport.Inbound) { in.OnControl(from, b) })
	return nil
}

// LosePeer cuts addr off: every operation to, from or of addr fails with transport.ErrPeerLost (memory
// done, or unknown under NeverQuiesce), later posts and control messages fail, and every
// endpoint hears OnPeerLost.
func (n *Network) LosePeer(addr transport.Peer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lost[addr] = true
	err := fmt.Errorf("%w: %s", transport.ErrPeerLost, addr)
	for _, op := range n.sortedOps(func(l *link) bool { return l.from == addr || l.to == addr }) {
		n.cut(op, err)
	}
	for p, ep := range n.eps {
		switch {
		case p != addr:
			ep.deliver(func(in transport.Inbound) { in.OnPeerLost(addr, err) })
		default:
			for other := range n.eps {
				if other != addr {
					ep.deliver(func(in transport.Inbound) { in.OnPeerLost(other, err) })
				}
			}
		}
	}
}

// sortedOps lists the live operations on the chosen links in id order, so failures are
// reported deterministically.
func (n *Network) sortedOps(on func(*link) bool) []*memOp {
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
func (n *Network) cut(op *memOp, err error) {
	for _, o := range []*memOp{op, op.pair} {
		if o == nil || o.state == opDone {
			continue
		}
		n.unlist(o)
		mem := transport.MemoryDone
		if o.neverFinal || (o.state == opWire && n.wireFault(o).NeverQuiesce) {
			mem = transport.MemoryUnknown
		}
		n.complete(o, err, 0, mem)
	}
}

func (n *Network) wireFault(op *memOp) Fault {
	if op.send {
		return op.fault
	}
	if op.pair != nil {
		return op.pair.fault
	}
	return Fault{}
}

// unlist removes op from whichever queue holds it. n.mu held.
func (n *Network) unlist(op *memOp) {
	remove := func(m map[transport.Tag][]*memOp) {
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
func (n *Network) complete(op *memOp, err error, bytes int, mem transport.Memory) {
	if mem != transport.MemoryBusy {
		op.state = opDone
		delete(op.link.ops, op.id)
	}
	cb, c := op.cb, transport.Completion{Err: err, Bytes: bytes, Memory: mem}
	op.ep.deliver(func(transport.Inbound) { cb(c) })
}

// startWire puts a matched pair on the wire. n.mu held.
func (n *Network) startWire(s, r *memOp) {
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
func (n *Network) finishWire(s *memOp) {
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
		n.complete(o, err, k, transport.MemoryDone)
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
