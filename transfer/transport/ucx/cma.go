// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

// Gets by process_vm_readv (cross-memory attach): where UCX would emulate the gets from a
// peer's pool on this host, the receiver reads the pool itself.
//
// UCX 1.13 over shared memory gets natively only through posix, which exposes to a peer only
// memory UCX allocated (ucp_mem_map with ALLOCATE); from memory the peer registered (a KV cache
// it mapped itself) UCX emulates gets with active messages, which the peer's worker answers
// with copies through both processes (0.3 of the bandwidth). Its cma transport reads another
// process's memory with one copy, but serves no gets in 1.13. So for such a key, when the peer
// is a process on this host in this pid namespace, PostGet reads the pool with
// process_vm_readv on a goroutine, at most Lanes at once. Nothing changes on the data wire;
// the sender cannot tell.
//
// A peer is untrusted input (docs/security.md, "Same-host reads (process_vm_readv)"): its
// worker address only says where to ask. Before the first read through a key the peer proves,
// through the kernel, which process it is and which ranges the key covers (cma_proof.go);
// every read lies inside those ranges (an ErrBadRegion and ErrProtocol otherwise), goes in pieces of at most
// cmaPieceBytes, each bounded by Config.CMAReadTimeout (a peer's memory may block a read for
// ever: userfaultfd, FUSE), and is checked against the proven process's pidfd after it.

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/internal/cmastats"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/internal/vectorget"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// cmaPieceBytes is the most one piece of a read moves: the unit Config.CMAReadTimeout bounds
// (one process_vm_readv call, or a few where a vector's pieces are many). 4 MiB is a
// millisecond's copy, so the bound says nothing about a read's size.
const cmaPieceBytes = 4 << 20

// cmaIOVMax is the most iovecs process_vm_readv takes on either side (the kernel's IOV_MAX).
const cmaIOVMax = 1024

// cmaRangeError: a get through the process_vm_readv route asked for a range outside every
// registration the peer proved its key covers. The get is refused before anything is read.
type cmaRangeError struct {
	Peer   transport.Peer
	Addr   uint64
	Len    int
	Ranges []string // the proven ranges, as [addr, +len)
}

func (e *cmaRangeError) Error() string {
	return fmt.Sprintf("kvxfer: %s: get of [%#x, +%d) lies outside the ranges the peer's key covers %v", e.Peer.Short(), e.Addr, e.Len, e.Ranges)
}

// Unwrap makes a *cmaRangeError a transport.ErrBadRegion, and a transport.ErrProtocol: the
// range came from the peer, which asked for memory it never registered, and the engine counts
// such refusals (Health.Numbers.ProtocolRefusals).
func (e *cmaRangeError) Unwrap() []error {
	return []error{transport.ErrBadRegion, transport.ErrProtocol}
}

// ucxCMA is the transport's process_vm_readv state; the route decided for a key lives on its
// lane-0 ucxRemoteKey (cma).
type ucxCMA struct {
	self   native.AddressHost // this process, as its worker address says (ok: selfOK)
	selfOK bool
	slots  chan struct{} // bounds the reads in flight: Lanes of them
	// wg counts the gets not yet final (a get the watchdog declared blocked is final); Close
	// waits for it, which each piece's bound bounds.
	wg sync.WaitGroup
	// readv is unix.ProcessVMReadv; tests replace it (before the first get) to refuse reads.
	readv func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error)
	// alive is pidfd_send_signal(pidfd, 0): whether the process a pidfd names still runs;
	// tests replace it to report it gone.
	alive func(pidfd int) error
	// peerPidfd says which process is on the other end of a proof's connection
	// (peerPidfdOf); tests replace it.
	peerPidfd func(conn *net.UnixConn) (pid, pidfd int, err error)
	// allowSelf lets a peer in this very process prove itself: tests only, whose two
	// transports share a process. Every other process refuses its own pid.
	allowSelf bool
	// answers bounds the challenges answered at once; answering counts them for Close.
	answers   chan struct{}
	answering sync.WaitGroup
	// stuck counts reads declared blocked whose system call has not returned: each holds an
	// OS thread. At Lanes of them no new read starts (the route is shut until one returns).
	stuck         atomic.Int64
	blockedPeers  sync.Map // transport.Peer -> true: a read from it blocked; no more reads
	refusedLogged atomic.Bool
	unproveLogged atomic.Bool
	blockedLogged atomic.Bool
	gets, bytes   atomic.Uint64
	refused       atomic.Uint64
	unproven      atomic.Uint64
	blocked       atomic.Uint64
}

// ucxCMARoute is what was decided for a peer's key: read by process_vm_readv from pid, or not.
// pidfd (when use) names the process that proved itself, so a read is known to have read the
// peer and not a process that got its pid after it died; ranges are what the key covers.
// mapped: the key's memory is mapped here (UCX gets it natively), so only vector gets
// (PostGetVector) take the route. Closed with the key (retireKeyLocked).
type ucxCMARoute struct {
	decided bool
	use     bool
	mapped  bool
	pid     int
	pidfd   int
	ranges  []cmaRange
}

// covers reports whether [addr, addr+n) lies inside one of the route's ranges.
func (r *ucxCMARoute) covers(addr uint64, n int) bool {
	for _, g := range r.ranges {
		if addr >= g.addr && addr-g.addr <= g.len && uint64(n) <= g.len-(addr-g.addr) {
			return true
		}
	}
	return false
}

func (r *ucxCMARoute) rangeNames() []string {
	s := make([]string, len(r.ranges))
	for i, g := range r.ranges {
		s[i] = fmt.Sprintf("[%#x, +%d)", g.addr, g.len)
	}
	return s
}

// ucxCMAGet is a get PostGet or PostGetVector handed to process_vm_readv: remote read in
// order into local, total bytes each. started, finished and blocked are under ucxTransport.mu.
type ucxCMAGet struct {
	key      *ucxRemoteKey // its inflight counts this read
	pid      int
	pidfd    int
	remote   []unix.RemoteIovec
	local    [][]byte
	total    int
	release  func() // the hold on local's region
	started  bool
	finished bool // its final completion is queued
	blocked  bool // declared blocked: final with memory unknown while its system call runs on
}

// initCMA readies the process_vm_readv route (New).
func (t *ucxTransport) initCMA() {
	t.cma.self, t.cma.selfOK = native.AddressInfo(t.addr, t.addr)
	t.cma.slots = make(chan struct{}, max(1, t.cfg.Lanes))
	t.cma.answers = make(chan struct{}, cmaProofAnswers)
	t.cma.readv = unix.ProcessVMReadv
	t.cma.alive = func(pidfd int) error { return unix.PidfdSendSignal(pidfd, 0, nil, 0) }
	t.cma.peerPidfd = func(conn *net.UnixConn) (int, int, error) { return peerPidfdOf(conn, true) }
}

// CMAStats reports the gets served by process_vm_readv so far.
func (t *ucxTransport) CMAStats() cmastats.Stats {
	return cmastats.Stats{Gets: t.cma.gets.Load(), Bytes: t.cma.bytes.Load(), Refused: t.cma.refused.Load(),
		Unproven: t.cma.unproven.Load(), Blocked: t.cma.blocked.Load()}
}

// shut reports whether no new read may start: too many reads are blocked, or one from peer was.
func (c *ucxCMA) shut(peer transport.Peer) bool {
	_, blocked := c.blockedPeers.Load(peer)
	return blocked || c.stuck.Load() >= int64(cap(c.slots))
}

// cmaRoute decides, once per peer key, whether gets from it go by process_vm_readv: when the
// key has no shared-memory mapping here (native.RemoteKey.Mapped), UCX would emulate its gets
// (no native get lane, or only shared-memory lanes, none of which reach registered memory in
// UCX 1.13), the peer's worker address says it is a process on this host in this pid
// namespace, and the peer proves it (proveCMA: the kernel names its process, and it names the
// ranges the key covers). A first read of one byte of the first range, bounded by
// Config.CMAReadTimeout, checks the kernel allows it (pidfd since Linux 5.3; ptrace access:
// EPERM under Yama's ptrace_scope or across users). A key that fails either is left to UCX,
// counted, and logged once.
//
// vector is a vector get's (PostGetVector): it takes the route from memory UCX maps here too,
// since one get per small piece costs far more than one process_vm_readv of many; a plain
// get from such memory stays UCX's.
func (t *ucxTransport) cmaRoute(from transport.Peer, key []byte, vector bool) (*ucxRemoteKey, bool) {
	if !t.cma.selfOK || t.cma.shut(from) {
		return nil, false
	}
	if t.ensureKey(from, 0, key) != nil {
		return nil, false // PostGet's own unpack says why
	}
	id := ucxKeyID{peer: from, key: string(key)}
	t.mu.Lock()
	k := t.rma.keys[id]
	if k == nil || k.rk == nil || k.dead {
		t.mu.Unlock()
		return nil, false
	}
	if k.cma.decided {
		t.mu.Unlock()
		return k, k.cma.use && (vector || !k.cma.mapped)
	}
	mapped := k.rk.Mapped()
	if mapped && !vector { // UCX gets it natively; a vector get may still decide the route
		t.mu.Unlock()
		return k, false
	}
	if wait := k.proving; wait != nil { // another get is deciding: one proof per key
		t.mu.Unlock()
		<-wait // bounded by cmaProofTimeout and the probe's read bound
		t.mu.Lock()
		defer t.mu.Unlock()
		return k, k.cma.use && !k.dead
	}
	proving := make(chan struct{})
	k.proving = proving
	t.mu.Unlock()
	route := ucxCMARoute{decided: true, pidfd: -1, mapped: mapped}
	if claimed, ok := t.cmaPeer(from); ok {
		t.proveRoute(&route, from, key, claimed)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	k.proving = nil
	close(proving)
	if t.rma.keys[id] != k || k.dead { // retired meanwhile
		closeRoute(&route)
		return k, false
	}
	k.cma = route
	return k, route.use
}

// proveRoute asks the peer for its proof and, given it, probes the first range: route.use says
// whether both passed.
func (t *ucxTransport) proveRoute(route *ucxCMARoute, from transport.Peer, key []byte, claimed int) {
	proof, err := t.proveCMA(from, key, claimed)
	if err != nil {
		t.cma.unproven.Add(1)
		if !t.cma.unproveLogged.Swap(true) {
			t.log.Warn("ucx: a peer on this host did not prove its process; gets from its caller-registered pools go through UCX's emulation",
				zap.String("peer", from.Short()), zap.Int("claimedPID", claimed), zap.Error(err))
		}
		return
	}
	route.pid, route.pidfd, route.ranges, route.use = proof.pid, proof.pidfd, proof.ranges, true
	if err := t.cmaProbe(route); err != nil {
		closeRoute(route)
		t.cma.refused.Add(1)
		if !t.cma.refusedLogged.Swap(true) {
			t.log.Warn("ucx: process_vm_readv refused; gets from caller-registered pools go through UCX's emulation",
				zap.Int("pid", proof.pid), zap.Error(err))
		}
	}
}

// cmaProbe reads one byte of route's first range, bounded by Config.CMAReadTimeout (a read
// that does not return is left to run on its goroutine, counted stuck), and checks the
// process is still the one that proved itself.
func (t *ucxTransport) cmaProbe(route *ucxCMARoute) error {
	type result struct{ err error }
	res := make(chan result, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		_, err := t.cmaRead(route.pid, make([]byte, 1), route.ranges[0].addr)
		res <- result{err}
		mu.Lock()
		if abandoned {
			t.cma.stuck.Add(-1)
		}
		mu.Unlock()
	}()
	timer := time.NewTimer(t.cfg.CMAReadTimeout)
	defer timer.Stop()
	select {
	case r := <-res:
		if r.err != nil {
			return r.err
		}
	case <-timer.C:
		mu.Lock()
		abandoned = true
		t.cma.stuck.Add(1)
		mu.Unlock()
		t.cma.blocked.Add(1)
		return fmt.Errorf("a one-byte read did not return within %v", t.cfg.CMAReadTimeout)
	}
	if err := t.cma.alive(route.pidfd); err != nil {
		return fmt.Errorf("pidfd_send_signal: %w", err)
	}
	return nil
}

// closeRoute closes route's pidfd, if it has one, and leaves it unused.
func closeRoute(route *ucxCMARoute) {
	if route.pidfd >= 0 && route.decided {
		_ = unix.Close(route.pidfd)
	}
	route.use, route.pidfd = false, -1
}

// cmaPeer is the pid peer's worker address claims, when process_vm_readv could read it and
// UCX would otherwise emulate gets to it. A claim only: proveCMA checks it.
func (t *ucxTransport) cmaPeer(peer transport.Peer) (int, bool) {
	addr, err := hex.DecodeString(string(peer))
	if err != nil {
		return 0, false
	}
	t.mu.Lock()
	local := t.addr
	t.mu.Unlock()
	h, ok := native.AddressInfo(addr, local)
	if !ok || !t.cma.self.SameProcessSpace(h) || (h.PID == t.cma.self.PID && !t.cma.allowSelf) {
		return 0, false // this very process is never read for a peer: no ptrace check guards it
	}
	l, ok := t.getLanes(peer)
	if !ok || (l.native && !l.sharedMemoryOnly) {
		return 0, false // a network or RDMA lane gets from registered memory itself
	}
	return h.PID, true
}

// postCMAGet posts a get that process_vm_readv serves; taken is false when dst cannot be read
// into that way (device memory), or no new read may start (ucxCMA.shut), and the caller posts a
// UCX get. A get outside the ranges the peer proves for key (asked again first,
// cma_reprove.go) is refused (*cmaRangeError).
func (t *ucxTransport) postCMAGet(from transport.Peer, k *ucxRemoteKey, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (id transport.OpID, taken bool, err error) {
	return t.postCMAProven(from, k, key, []unix.RemoteIovec{{Base: uintptr(addr), Len: len(dst)}}, [][]byte{dst}, len(dst), done)
}

// postCMA posts a read of remote, in order, into local (total bytes each, every entry
// non-empty), as postCMAGet says. Every remote range must lie inside a range the peer proved
// (*cmaRangeError otherwise, before anything is read), and every local piece inside one
// region this transport registered, which the read holds until its system call returned.
func (t *ucxTransport) postCMA(from transport.Peer, k *ucxRemoteKey, remote []unix.RemoteIovec, local [][]byte, total int, done func(transport.Completion)) (id transport.OpID, taken bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, true, transport.ErrClosed
	}
	if k.dead || !k.cma.use || t.cma.shut(from) {
		return 0, false, nil // its endpoint failed meanwhile: UCX's get says so
	}
	for _, r := range remote {
		if !k.cma.covers(uint64(r.Base), r.Len) {
			return 0, true, &cmaRangeError{Peer: from, Addr: uint64(r.Base), Len: r.Len, Ranges: k.cma.rangeNames()}
		}
	}
	mem, _, err := t.regionLocked(local[0])
	if err != nil {
		return 0, true, err
	}
	for _, l := range local[1:] {
		if p := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(l)))); p < mem.Addr() || p-mem.Addr() > uint64(mem.Len()) || uint64(len(l)) > uint64(mem.Len())-(p-mem.Addr()) {
			return 0, true, fmt.Errorf("%w: a vector get's pieces lie in more than one region: [%#x, +%d)", ErrUnregistered, p, len(l))
		}
	}
	if mem.Kind() != native.MemoryHost {
		return 0, false, nil
	}
	release, err := mem.Hold()
	if err != nil {
		return 0, true, fmt.Errorf("%w: %w", ErrUnregistered, err)
	}
	t.nextOp++
	op := &ucxOp{id: t.nextOp, send: true, peer: from, size: total, done: done,
		cma: &ucxCMAGet{key: k, pid: k.cma.pid, pidfd: k.cma.pidfd, remote: remote, local: local, total: total, release: release}}
	k.inflight++
	t.ops[op.id] = op
	t.cma.wg.Add(1)
	go t.runCMAGet(op)
	return op.id, true, nil
}

func init() {
	vectorget.Hooks.VectorGets = func(tr any, from transport.Peer, key []byte) bool {
		t, ok := tr.(*ucxTransport)
		return ok && t.vectorGets(from, key)
	}
	vectorget.Hooks.PostGetVector = func(tr any, from transport.Peer, tag transport.Tag, key []byte, src []vectorget.Range, dst [][]byte, done func(transport.Completion)) (transport.OpID, error) {
		t, ok := tr.(*ucxTransport)
		if !ok {
			return 0, fmt.Errorf("%w: %T has no vector gets", transport.ErrBadRegion, tr)
		}
		return t.postGetVector(from, tag, key, src, dst, done)
	}
}

// VectorGets is vectorget.Hooks.VectorGets for this transport: vector gets go by process_vm_readv only, so
// from must be a process on this host that process_vm_readv may read (cmaRoute). With a nil
// key it answers from the peer's worker address alone; with a key it decides the route for
// it (the peer's proof, bounded), from memory UCX maps here too.
func (t *ucxTransport) vectorGets(from transport.Peer, key []byte) bool {
	if t.noRMA { // a vector get is a get: none on a transport without RMA
		return false
	}
	if key == nil { // a kernel that refused one read (Yama's ptrace_scope, seccomp) refuses all
		if !t.cma.selfOK || t.cma.shut(from) || t.cma.refused.Load() > 0 {
			return false
		}
		_, ok := t.cmaPeer(from)
		return ok
	}
	if t.ensureEndpoint(from) != nil {
		return false
	}
	_, ok := t.cmaRoute(from, key, true)
	return ok
}

// PostGetVector is vectorget.Hooks.PostGetVector for this transport: one process_vm_readv read of src into
// dst, in calls of at most cmaIOVMax iovecs a side, in pieces each bounded by
// Config.CMAReadTimeout, with everything a get by process_vm_readv has (cma.go): every range
// checked against the ranges the peer proved (*cmaRangeError), the pidfd checked after,
// Cancel and Close as for such a get. Adjacent ranges of either list are merged first. It
// fails where VectorGets(from, key) would report false.
func (t *ucxTransport) postGetVector(from transport.Peer, _ transport.Tag, key []byte, src []vectorget.Range, dst [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	remote := make([]unix.RemoteIovec, 0, len(src))
	rtotal := 0
	for _, r := range src {
		if r.Len <= 0 || r.Addr+uint64(r.Len) < r.Addr {
			return 0, fmt.Errorf("%w: a vector get's range [%#x, +%d)", transport.ErrBadRegion, r.Addr, r.Len)
		}
		rtotal += r.Len
		if k := len(remote) - 1; k >= 0 && uint64(remote[k].Base)+uint64(remote[k].Len) == r.Addr {
			remote[k].Len += r.Len
			continue
		}
		remote = append(remote, unix.RemoteIovec{Base: uintptr(r.Addr), Len: r.Len})
	}
	local := make([][]byte, 0, len(dst))
	ltotal := 0
	for _, d := range dst {
		if len(d) == 0 {
			return 0, fmt.Errorf("%w: a vector get's empty destination piece", transport.ErrBadRegion)
		}
		ltotal += len(d)
		if k := len(local) - 1; k >= 0 && unsafe.SliceData(local[k]) != nil &&
			uintptr(unsafe.Pointer(unsafe.SliceData(local[k])))+uintptr(len(local[k])) == uintptr(unsafe.Pointer(unsafe.SliceData(d))) &&
			cap(local[k]) >= len(local[k])+len(d) {
			local[k] = local[k][:len(local[k])+len(d)]
			continue
		}
		local = append(local, d)
	}
	if rtotal != ltotal || rtotal == 0 {
		return 0, fmt.Errorf("%w: a vector get of %d bytes into %d", transport.ErrBadRegion, rtotal, ltotal)
	}
	if err := t.ensureEndpoint(from); err != nil {
		return 0, err
	}
	k, ok := t.cmaRoute(from, key, true)
	if !ok {
		return 0, fmt.Errorf("%w: %s: no process_vm_readv route to this peer's key, which vector gets need", transport.ErrBadRegion, from.Short())
	}
	id, taken, err := t.postCMAProven(from, k, key, remote, local, rtotal, done)
	if !taken {
		return 0, fmt.Errorf("%w: %s: the process_vm_readv route is shut (a read blocked) or the destination is not host memory", transport.ErrBadRegion, from.Short())
	}
	return id, err
}

// runCMAGet reads op's bytes once a slot is free, piece by piece, and reports its final
// completion through the report queue. A get cancelled (or closed) before it began reads
// nothing; one cancelled or closed between pieces reads no further piece. A piece that does
// not return within Config.CMAReadTimeout is declared blocked (cmaBlocked) and the get final
// with its memory unknown; the goroutine then only waits for the system call to give its
// destination back.
func (t *ucxTransport) runCMAGet(op *ucxOp) {
	g := op.cma
	t.cma.slots <- struct{}{} // each holder returns it within a piece's bound, or when declared blocked
	t.mu.Lock()
	if op.cancel || t.closed {
		g.finished = true
		t.mu.Unlock()
		<-t.cma.slots
		g.release()
		t.push(ucxReport{cma: op, err: fmt.Errorf("%w: the get had not begun", transport.ErrCancelled)})
		t.cma.wg.Done()
		return
	}
	g.started = true
	t.mu.Unlock()
	read, err := 0, error(nil)
	cur := &cmaCursor{local: g.local, remote: g.remote}
	watchdog := time.AfterFunc(t.cfg.CMAReadTimeout, func() { t.cmaBlocked(op) })
	for read < g.total && err == nil {
		piece := min(cmaPieceBytes, g.total-read)
		if read > 0 {
			t.mu.Lock()
			stop, closed := op.cancel, t.closed
			t.mu.Unlock()
			if stop || closed {
				err = fmt.Errorf("%w: stopped after %d of %d bytes", transport.ErrCancelled, read, g.total)
				if closed && !stop {
					err = fmt.Errorf("%w: closed after %d of %d bytes", transport.ErrClosed, read, g.total)
				}
				break
			}
			watchdog.Reset(t.cfg.CMAReadTimeout)
		}
		var n int
		n, err = t.cmaReadPiece(g.pid, cur, piece)
		read += n
		if !watchdog.Stop() {
			break // declared blocked meanwhile: final already
		}
	}
	t.mu.Lock()
	blocked := g.blocked
	g.finished = true
	t.mu.Unlock()
	if blocked { // its final is out; its slot was given back then
		g.release() // the system call returned: nothing writes dst any more
		t.cma.stuck.Add(-1)
		return
	}
	if err == nil {
		if gone := t.cma.alive(g.pidfd); gone != nil { // the pid may name another process now
			for _, l := range g.local {
				clear(l) // what it read may be another process's: none of it stays
			}
			err = fmt.Errorf("%w: %w", unix.ESRCH, gone)
		}
	}
	<-t.cma.slots
	g.release() // the syscall returned: nothing writes dst any more
	switch {
	case errors.Is(err, unix.ESRCH):
		err = fmt.Errorf("%w: %s: process %d is gone: %w", transport.ErrPeerLost, op.peer.Short(), g.pid, err)
		t.dropPeerKeys(op.peer)
	case errors.Is(err, transport.ErrCancelled), errors.Is(err, transport.ErrClosed):
	case err != nil:
		err = fmt.Errorf("%w: process_vm_readv of %s from process %d, %d bytes read: %w",
			transport.ErrBadRegion, g.names(), g.pid, read, err)
	default:
		t.cma.gets.Add(1)
		t.cma.bytes.Add(uint64(read))
	}
	t.push(ucxReport{cma: op, err: err})
	t.cma.wg.Done()
}

// cmaBlocked declares op's read blocked: a piece did not return within Config.CMAReadTimeout.
// The get is final now, failed with its memory unknown (its destination may still be written,
// so the engine poisons it: L9); its slot goes back, its peer's memory is read no more (and
// its gets go through UCX), and the goroutine stays counted stuck until the call returns.
func (t *ucxTransport) cmaBlocked(op *ucxOp) {
	g := op.cma
	t.mu.Lock()
	if g.finished {
		t.mu.Unlock()
		return
	}
	g.finished, g.blocked = true, true
	t.cma.stuck.Add(1) // under mu: the goroutine takes it back only after it saw blocked
	t.mu.Unlock()
	t.cma.blocked.Add(1)
	t.cma.blockedPeers.Store(op.peer, true)
	<-t.cma.slots
	if !t.cma.blockedLogged.Swap(true) {
		t.log.Warn("ucx: a process_vm_readv read did not return (the peer's memory blocks it: userfaultfd, FUSE?); its get failed with memory unknown, and that peer's memory is read through UCX from now on",
			zap.String("peer", op.peer.Short()), zap.Int("pid", g.pid), zap.Duration("timeout", t.cfg.CMAReadTimeout))
	}
	t.push(ucxReport{cma: op, cmaUnknown: true, err: fmt.Errorf("%w: %s: process_vm_readv of %s from process %d did not return within %v: its destination may still be written",
		transport.ErrQuiescenceUnknown, op.peer.Short(), g.names(), g.pid, t.cfg.CMAReadTimeout)})
	t.cma.wg.Done()
}

// cmaRead reads len(dst) bytes at addr of process pid into dst, in as many calls as the kernel
// needs (it stops short at a fault, or past MAX_RW_COUNT). It returns the bytes read.
func (t *ucxTransport) cmaRead(pid int, dst []byte, addr uint64) (int, error) {
	read := 0
	for read < len(dst) {
		local := []unix.Iovec{{Base: &dst[read]}}
		local[0].SetLen(len(dst) - read)
		remote := []unix.RemoteIovec{{Base: uintptr(addr) + uintptr(read), Len: len(dst) - read}}
		n, err := t.cma.readv(pid, local, remote, 0)
		if err != nil {
			return read, err
		}
		if n <= 0 {
			return read, unix.EFAULT
		}
		read += n
	}
	return read, nil
}

// names says which memory g reads, for an error: its one range, or its first and how many.
func (g *ucxCMAGet) names() string {
	r := g.remote[0]
	if len(g.remote) == 1 {
		return fmt.Sprintf("[%#x, +%d)", r.Base, r.Len)
	}
	return fmt.Sprintf("%d ranges (%d bytes) from [%#x, +%d)", len(g.remote), g.total, r.Base, r.Len)
}

// cmaCursor is how far a read of remote into local has come: local[li][lo:] and
// remote[ri] from ro on are next. liov and riov are the windows one call hands the kernel.
type cmaCursor struct {
	local  [][]byte
	remote []unix.RemoteIovec
	li, lo int
	ri, ro int
	liov   []unix.Iovec
	riov   []unix.RemoteIovec
}

// window fills liov and riov with the next bytes, at most budget and at most cmaIOVMax
// entries a side, the same count on both, and returns that count (0: nothing left).
func (c *cmaCursor) window(budget int) int {
	c.liov, c.riov = c.liov[:0], c.riov[:0]
	lbytes := 0
	for i, off := c.li, c.lo; i < len(c.local) && len(c.liov) < cmaIOVMax && lbytes < budget; i, off = i+1, 0 {
		n := min(len(c.local[i])-off, budget-lbytes)
		v := unix.Iovec{Base: &c.local[i][off]}
		v.SetLen(n)
		c.liov = append(c.liov, v)
		lbytes += n
	}
	rbytes := 0
	for i, off := c.ri, c.ro; i < len(c.remote) && len(c.riov) < cmaIOVMax && rbytes < lbytes; i, off = i+1, 0 {
		n := min(c.remote[i].Len-off, lbytes-rbytes)
		c.riov = append(c.riov, unix.RemoteIovec{Base: c.remote[i].Base + uintptr(off), Len: n})
		rbytes += n
	}
	if rbytes < lbytes { // the remote side ran out of entries first: the local one stops there
		left := rbytes
		for i := range c.liov {
			if n := int(c.liov[i].Len); n < left {
				left -= n
				continue
			}
			c.liov[i].SetLen(left)
			c.liov = c.liov[:i+1]
			break
		}
	}
	return rbytes
}

// advance moves the cursor n bytes on.
func (c *cmaCursor) advance(n int) {
	for left := n; left > 0; {
		k := min(len(c.local[c.li])-c.lo, left)
		if c.lo += k; c.lo == len(c.local[c.li]) {
			c.li, c.lo = c.li+1, 0
		}
		left -= k
	}
	for left := n; left > 0; {
		k := min(c.remote[c.ri].Len-c.ro, left)
		if c.ro += k; c.ro == c.remote[c.ri].Len {
			c.ri, c.ro = c.ri+1, 0
		}
		left -= k
	}
}

// cmaReadPiece reads the next piece bytes of c from process pid, in as many calls as the
// kernel needs (it stops short at a fault, or past MAX_RW_COUNT) or the iovec windows take
// (cmaIOVMax a call). It returns the bytes read.
func (t *ucxTransport) cmaReadPiece(pid int, c *cmaCursor, piece int) (int, error) {
	read := 0
	for read < piece {
		if c.window(piece-read) == 0 {
			return read, unix.EFAULT // the lists' totals disagree: postCMA's callers see they do not
		}
		n, err := t.cma.readv(pid, c.liov, c.riov, 0)
		if err != nil {
			return read, err
		}
		if n <= 0 {
			return read, unix.EFAULT
		}
		c.advance(n)
		read += n
	}
	return read, nil
}

// deliverCMA delivers a process_vm_readv get's final completion.
func (t *ucxTransport) deliverCMA(op *ucxOp, err error, unknown bool) {
	t.mu.Lock()
	live := t.ops[op.id] == op
	delete(t.ops, op.id)
	t.mu.Unlock()
	if !live {
		return
	}
	t.keyUnused(op.cma.key)
	c := transport.Completion{Err: err, Memory: transport.MemoryDone}
	if unknown {
		c.Memory = transport.MemoryUnknown
	}
	if err == nil {
		c.Bytes = op.size
	}
	op.done(c)
}

// cancelCMALocked is Cancel for a process_vm_readv get: one running reports MemoryBusy now, as
// a UCX get does (a system call cannot be stopped), and its final completion when its piece
// returns; one not begun reads nothing and reports cancelled when its goroutine finds it so.
func (t *ucxTransport) cancelCMALocked(op *ucxOp) (busy bool) {
	return op.cma.started && !op.cma.finished
}

// dropPeerKeys retires every key unpacked from peer, on every lane, once a read by
// process_vm_readv proved the peer's process gone: nothing can be read through them again,
// and the peer's endpoints may not report its death for a while (UCX's keepalive), which is
// when dropKeysOnFailure would have retired them. A key some get still uses goes with its
// last get (keyUnused).
func (t *ucxTransport) dropPeerKeys(peer transport.Peer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, k := range t.rma.keys {
		if id.peer == peer {
			delete(t.rma.keys, id)
			t.retireKeyLocked(k)
		}
	}
}

// closeCMA waits for the process_vm_readv gets to be final and the challenges being answered
// to end (Close): each get within one piece's Config.CMAReadTimeout (a blocked one is final
// once declared so, its thread left to the kernel), each answer within cmaProofTimeout.
func (t *ucxTransport) closeCMA() {
	t.cma.wg.Wait()
	t.cma.answering.Wait()
}
