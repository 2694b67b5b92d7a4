// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"fmt"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// node is one engine of the soak with the instruments the checker reads: a transport wrapper
// that sees every staging buffer handed to the wire, and an observer that hears every poison
// and quarantine.
type node struct {
	name transfer.Peer
	eng  *transfer.Engine
	slot *slotTracker
	// mem is the in-process soak's transport under slot, to which a direct request names its
	// pools (nil in the peer-process soak).
	mem *mem.Transport

	quarantines atomic.Int64
	poisons     atomic.Int64

	lostMu sync.Mutex
	lost   map[transfer.Peer]chan struct{} // closed once the transport reported the peer lost
	lostAt map[transfer.Peer]time.Time     // when the observer heard it
	// onPoison, when set (before the engine starts), hears every poison the observer does,
	// slots and callers' blocks alike (fault hung-peer attributes them to requests).
	onPoison func(id transfer.RequestID, slot int, reason string)
	// maxPoisoned is the most poisoned slots Health has reported; it may only grow.
	maxPoisoned atomic.Int64
}

// slotTracker wraps a transport and tracks staging slots by index: a post whose buffer lies
// in a slot already poisoned is the bug the "poisoned slot never leased again" invariant
// forbids. Tracking by index rather than by a canary written into the slot is deliberate: a
// transport may legitimately still write into a poisoned slot (that is why it was poisoned).
type slotTracker struct {
	inner     transport.Transport
	base      uintptr
	size      uintptr
	slotBytes uintptr

	mu       sync.Mutex
	poisoned map[int]time.Time
	reused   []string // one line per post into a poisoned slot
	foreign  []string // posts of buffers outside the staging memory
}

var (
	_ transfer.Transport        = (*slotTracker)(nil)
	_ transport.TransportHealth = (*slotTracker)(nil)
	_ transport.RMATransport    = (*slotTracker)(nil)
)

func newSlotTracker(inner transfer.Transport, staging []byte, slotBytes int64) *slotTracker {
	return &slotTracker{
		inner: transportimpl.Of(inner).(transport.Transport), // the contract behind a ucx.Transport
		// The address is only compared, never dereferenced; staging stays referenced by the
		// engine for the tracker's whole life, and Go's heap does not move objects.
		base: uintptr(unsafe.Pointer(unsafe.SliceData(staging))), size: uintptr(len(staging)),
		slotBytes: uintptr(slotBytes), poisoned: map[int]time.Time{},
	}
}

// check records a post into a poisoned slot or outside the staging memory.
func (s *slotTracker) check(what string, tag transport.Tag, buf []byte) {
	if len(buf) == 0 {
		return
	}
	if !s.inStaging(buf) {
		s.addForeign(what, tag, "buffer outside the staging memory")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	idx := int((uintptr(unsafe.Pointer(unsafe.SliceData(buf))) - s.base) / s.slotBytes)
	if at, bad := s.poisoned[idx]; bad {
		s.reused = append(s.reused, fmt.Sprintf("%s of request %d chunk %d into slot %d, poisoned %v earlier",
			what, tag.Request, tag.Seq, idx, time.Since(at).Round(time.Millisecond)))
	}
}

func (s *slotTracker) markPoisoned(slot int) {
	s.mu.Lock()
	if _, ok := s.poisoned[slot]; !ok {
		s.poisoned[slot] = time.Now()
	}
	s.mu.Unlock()
}

func (s *slotTracker) findings() (poisoned int, reused, foreign []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.poisoned), append([]string(nil), s.reused...), append([]string(nil), s.foreign...)
}

// The one-copy path's operations go straight to the wrapped transport; it refuses memory
// that was not named to it, so a direct buffer is never a staging slot unless the staging
// memory was named, which checkDirect reports.

// rma returns the wrapped transport's one-copy side, or nil.
func (s *slotTracker) rma() transport.RMATransport {
	rt, _ := s.inner.(transport.RMATransport)
	return rt
}

// checkDirect records a one-copy operation on staging memory.
func (s *slotTracker) checkDirect(what string, tag transport.Tag, bufs ...[]byte) {
	for _, b := range bufs {
		if len(b) > 0 && s.inStaging(b) {
			s.addForeign(what, tag, "a one-copy operation on staging memory")
		}
	}
}

// inStaging reports whether buf starts in the staging memory.
func (s *slotTracker) inStaging(buf []byte) bool {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return p >= s.base && p < s.base+s.size
}

// addForeign records a post that does not belong where it went (the first 16 of them).
func (s *slotTracker) addForeign(what string, tag transport.Tag, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.foreign) < 16 {
		s.foreign = append(s.foreign, fmt.Sprintf("%s of request %d chunk %d: %s", what, tag.Request, tag.Seq, why))
	}
}

// Direct implements transport.DirectTransport.
func (s *slotTracker) Direct(pool []byte) bool { rt := s.rma(); return rt != nil && rt.Direct(pool) }

// PostSendIOV implements transport.DirectTransport.
func (s *slotTracker) PostSendIOV(to transfer.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	s.checkDirect("direct send", tag, iov...)
	return s.rma().PostSendIOV(to, tag, iov, done)
}

// PostRecvIOV implements transport.DirectTransport.
func (s *slotTracker) PostRecvIOV(from transfer.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	s.checkDirect("direct receive", tag, iov...)
	return s.rma().PostRecvIOV(from, tag, iov, done)
}

// RMAKey implements transport.RMATransport.
func (s *slotTracker) RMAKey(pool []byte) (uint64, []byte, error) { return s.rma().RMAKey(pool) }

// PostGet implements transport.RMATransport.
func (s *slotTracker) PostGet(from transfer.Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (transport.OpID, error) {
	s.checkDirect("get", tag, dst)
	return s.rma().PostGet(from, tag, key, addr, dst, done)
}

// Bind implements transfer.Transport.
func (s *slotTracker) Bind(in transport.Inbound) error { return s.inner.Bind(in) }

// SendControl implements transfer.Transport.
func (s *slotTracker) SendControl(to transfer.Peer, msg []byte) error {
	return s.inner.SendControl(to, msg)
}

// PostSend implements transfer.Transport.
func (s *slotTracker) PostSend(to transfer.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	s.check("send", tag, buf)
	return s.inner.PostSend(to, tag, buf, done)
}

// PostRecv implements transfer.Transport.
func (s *slotTracker) PostRecv(from transfer.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	s.check("receive", tag, buf)
	return s.inner.PostRecv(from, tag, buf, done)
}

// Cancel implements transfer.Transport.
func (s *slotTracker) Cancel(op transport.OpID) { s.inner.Cancel(op) }

// Close implements transfer.Transport.
func (s *slotTracker) Close(force bool) error { return s.inner.Close(force) }

// TransportHealth forwards the inner transport's report (UCX's receive probe), so the
// engine's Health says what it would without the tracker.
func (s *slotTracker) TransportHealth() error {
	if th, ok := s.inner.(transport.TransportHealth); ok {
		return th.TransportHealth()
	}
	return nil
}

// The node is its engine's observer.
var _ transfer.Observer = (*node)(nil)

// OnTransition implements transfer.Observer.
func (n *node) OnTransition(transfer.RequestID, int, transfer.State, transfer.State, transfer.Event) {
}

// OnCancel implements transfer.Observer.
func (n *node) OnCancel(transfer.RequestID, transfer.CancelOutcome) {}

// OnQuarantine implements transfer.Observer.
func (n *node) OnQuarantine(transfer.RequestID, int, error) { n.quarantines.Add(1) }

// OnPoison implements transfer.Observer.
func (n *node) OnPoison(id transfer.RequestID, slot int, reason string) {
	if n.onPoison != nil {
		n.onPoison(id, slot, reason)
	}
	if slot < 0 { // the caller's KV blocks of a one-copy transfer, not a slot: the handle counts them
		return
	}
	n.poisons.Add(1)
	n.slot.markPoisoned(slot)
}

var _ interface {
	OnPeerConnected(transfer.Peer)
	OnPeerLost(transfer.Peer, error)
} = (*node)(nil) // transfer.Observer's optional peer methods

// OnPeerConnected implements transfer.Observer's optional method.
func (n *node) OnPeerConnected(transfer.Peer) {}

// OnPeerLost implements transfer.Observer's optional method: peerLost's waiters hear of it.
func (n *node) OnPeerLost(peer transfer.Peer, _ error) {
	ch := n.lostChan(peer)
	n.lostMu.Lock()
	defer n.lostMu.Unlock()
	select {
	case <-ch:
	default:
		if n.lostAt == nil {
			n.lostAt = map[transfer.Peer]time.Time{}
		}
		n.lostAt[peer] = time.Now()
		close(ch)
	}
}

// heardLostAt is when the observer heard that peer was lost (ok false before it did).
func (n *node) heardLostAt(peer transfer.Peer) (at time.Time, ok bool) {
	n.lostMu.Lock()
	defer n.lostMu.Unlock()
	at, ok = n.lostAt[peer]
	return at, ok
}

// peerLost returns a channel closed once the engine's transport has reported peer lost.
func (n *node) peerLost(peer transfer.Peer) <-chan struct{} { return n.lostChan(peer) }

func (n *node) lostChan(peer transfer.Peer) chan struct{} {
	n.lostMu.Lock()
	defer n.lostMu.Unlock()
	if n.lost == nil {
		n.lost = map[transfer.Peer]chan struct{}{}
	}
	ch, ok := n.lost[peer]
	if !ok {
		ch = make(chan struct{})
		n.lost[peer] = ch
	}
	return ch
}

// OnProgress implements transfer.Observer.
func (n *node) OnProgress(transfer.RequestID, int64, time.Time) {}
