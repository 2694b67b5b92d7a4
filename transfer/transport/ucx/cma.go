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
// is a process on this host in this pid namespace (its worker address says which: native.
// AddressInfo), PostGet reads the pool with process_vm_readv on a goroutine, at most Lanes at
// once. Nothing changes on the wire; the sender cannot tell.

import (
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// CMAStats counts the gets this transport served with process_vm_readv.
type CMAStats struct {
	Gets    uint64 // gets read by process_vm_readv that succeeded
	Bytes   uint64 // their bytes
	Refused uint64 // pool keys whose first read the kernel refused (EPERM, ENOSYS, ...): UCX gets them
}

// ucxCMA is the transport's process_vm_readv state; the route decided for a key lives on its
// lane-0 ucxRemoteKey (cma).
type ucxCMA struct {
	self   native.AddressHost // this process, as its worker address says (ok: selfOK)
	selfOK bool
	slots  chan struct{}  // bounds the reads in flight: Lanes of them
	wg     sync.WaitGroup // reads in flight or waiting for a slot; Close waits for them
	// readv is unix.ProcessVMReadv; tests replace it (before the first get) to refuse reads.
	readv func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error)
	// alive is pidfd_send_signal(pidfd, 0): whether the process a pidfd names still runs;
	// tests replace it to report it gone.
	alive         func(pidfd int) error
	refusedLogged atomic.Bool
	gets, bytes   atomic.Uint64
	refused       atomic.Uint64
}

// ucxCMARoute is what was decided for a peer's key: read by process_vm_readv from pid, or not.
// pidfd (when use) names that very process, so a read is known to have read the peer and not a
// process that got its pid after it died: closed with the key (retireKeyLocked).
type ucxCMARoute struct {
	decided bool
	use     bool
	pid     int
	pidfd   int
}

// ucxCMAGet is a get PostGet handed to process_vm_readv. started and finished are under
// Transport.mu.
type ucxCMAGet struct {
	key      *ucxRemoteKey // its inflight counts this read
	pid      int
	pidfd    int
	addr     uint64
	dst      []byte
	release  func() // the hold on dst's region
	started  bool
	finished bool
}

// initCMA readies the process_vm_readv route (New).
func (t *Transport) initCMA() {
	t.cma.self, t.cma.selfOK = native.AddressInfo(t.addr, t.addr)
	t.cma.slots = make(chan struct{}, max(1, t.cfg.Lanes))
	t.cma.readv = unix.ProcessVMReadv
	t.cma.alive = func(pidfd int) error { return unix.PidfdSendSignal(pidfd, 0, nil, 0) }
}

// CMAStats reports the gets served by process_vm_readv so far.
func (t *Transport) CMAStats() CMAStats {
	return CMAStats{Gets: t.cma.gets.Load(), Bytes: t.cma.bytes.Load(), Refused: t.cma.refused.Load()}
}

// cmaRoute decides, once per peer key, whether gets from it go by process_vm_readv: when the
// key has no shared-memory mapping here (native.RemoteKey.Mapped), UCX would emulate its gets
// (no native get lane, or only shared-memory lanes, none of which reach registered memory in
// UCX 1.13), and the peer's worker address names a process on this host in this pid
// namespace. A pidfd opened on that pid and a first read of one byte at addr check the kernel
// allows it (pidfd_open since Linux 5.3; ptrace access: EPERM under Yama's ptrace_scope or
// across users); a refused one leaves the key to UCX, logged once.
func (t *Transport) cmaRoute(from transport.Peer, key []byte, addr uint64) (*ucxRemoteKey, bool) {
	if !t.cma.selfOK {
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
		return k, k.cma.use
	}
	mapped := k.rk.Mapped()
	t.mu.Unlock()
	route := ucxCMARoute{decided: true, pidfd: -1}
	if !mapped {
		route.pid, route.use = t.cmaPeer(from)
	}
	if route.use {
		if err := t.cmaProbe(&route, addr); err != nil {
			t.cma.refused.Add(1)
			if !t.cma.refusedLogged.Swap(true) {
				t.log.Warn("ucx: process_vm_readv refused; gets from caller-registered pools go through UCX's emulation",
					zap.Int("pid", route.pid), zap.Error(err))
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rma.keys[id] != k || k.dead || k.cma.decided { // retired, or decided by another get meanwhile
		closeRoute(&route)
		return k, k.cma.use && !k.dead
	}
	k.cma = route
	return k, route.use
}

// cmaProbe opens the pidfd of route's process and reads one byte at addr from it; on an error
// route is left unused.
func (t *Transport) cmaProbe(route *ucxCMARoute, addr uint64) error {
	fd, err := unix.PidfdOpen(route.pid, 0)
	if err != nil {
		route.use = false
		return fmt.Errorf("pidfd_open: %w", err)
	}
	route.pidfd = fd
	if _, err := t.cmaRead(route.pid, make([]byte, 1), addr); err != nil {
		closeRoute(route)
		return err
	}
	if err := t.cma.alive(fd); err != nil {
		closeRoute(route)
		return fmt.Errorf("pidfd_send_signal: %w", err)
	}
	return nil
}

// closeRoute closes route's pidfd, if it has one, and leaves it unused.
func closeRoute(route *ucxCMARoute) {
	if route.pidfd > 0 {
		_ = unix.Close(route.pidfd)
	}
	route.use, route.pidfd = false, -1
}

// cmaPeer is the pid of peer when process_vm_readv could read it and UCX would otherwise
// emulate gets to it.
func (t *Transport) cmaPeer(peer transport.Peer) (int, bool) {
	addr, err := hex.DecodeString(string(peer))
	if err != nil {
		return 0, false
	}
	t.mu.Lock()
	local := t.addr
	t.mu.Unlock()
	h, ok := native.AddressInfo(addr, local)
	if !ok || !t.cma.self.SameProcessSpace(h) {
		return 0, false
	}
	l, ok := t.getLanes(peer)
	if !ok || (l.native && !l.sharedMemoryOnly) {
		return 0, false // a network or RDMA lane gets from registered memory itself
	}
	return h.PID, true
}

// postCMAGet posts a get that process_vm_readv serves; taken is false when dst cannot be read
// into that way (device memory), and the caller posts a UCX get.
func (t *Transport) postCMAGet(from transport.Peer, k *ucxRemoteKey, addr uint64, dst []byte, done func(transport.Completion)) (id transport.OpID, taken bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, true, transport.ErrClosed
	}
	if k.dead || !k.cma.use {
		return 0, false, nil // its endpoint failed meanwhile: UCX's get says so
	}
	mem, _, err := t.regionLocked(dst)
	if err != nil {
		return 0, true, err
	}
	if mem.Kind() != native.MemoryHost {
		return 0, false, nil
	}
	release, err := mem.Hold()
	if err != nil {
		return 0, true, fmt.Errorf("%w: %w", ErrUnregistered, err)
	}
	t.nextOp++
	op := &ucxOp{id: t.nextOp, send: true, peer: from, size: len(dst), done: done,
		cma: &ucxCMAGet{key: k, pid: k.cma.pid, pidfd: k.cma.pidfd, addr: addr, dst: dst, release: release}}
	k.inflight++
	t.ops[op.id] = op
	t.cma.wg.Add(1)
	go t.runCMAGet(op)
	return op.id, true, nil
}

// runCMAGet reads op's bytes once a slot is free, and reports its final completion through
// the report queue. A get cancelled (or closed) before it began reads nothing.
func (t *Transport) runCMAGet(op *ucxOp) {
	defer t.cma.wg.Done()
	g := op.cma
	t.cma.slots <- struct{}{}
	t.mu.Lock()
	if op.cancel || t.closed {
		g.finished = true
		t.mu.Unlock()
		<-t.cma.slots
		g.release()
		t.push(ucxReport{cma: op, err: fmt.Errorf("%w: the get had not begun", transport.ErrCancelled)})
		return
	}
	g.started = true
	t.mu.Unlock()
	n, err := t.cmaRead(g.pid, g.dst, g.addr)
	if err == nil {
		if gone := t.cma.alive(g.pidfd); gone != nil { // the pid may name another process now
			err = fmt.Errorf("%w: %w", unix.ESRCH, gone)
		}
	}
	<-t.cma.slots
	t.mu.Lock()
	g.finished = true
	t.mu.Unlock()
	g.release() // the syscall returned: nothing writes dst any more
	switch {
	case errors.Is(err, unix.ESRCH):
		err = fmt.Errorf("%w: %.16s: process %d is gone: %w", transport.ErrPeerLost, op.peer, g.pid, err)
		t.dropPeerKeys(op.peer)
	case err != nil:
		err = fmt.Errorf("%w: process_vm_readv of [%#x, +%d) from process %d, %d bytes read: %w",
			transport.ErrBadRegion, g.addr, len(g.dst), g.pid, n, err)
	default:
		t.cma.gets.Add(1)
		t.cma.bytes.Add(uint64(n))
	}
	t.push(ucxReport{cma: op, err: err})
}

// cmaRead reads len(dst) bytes at addr of process pid into dst, in as many calls as the kernel
// needs (it stops short at a fault, or past MAX_RW_COUNT). It returns the bytes read.
func (t *Transport) cmaRead(pid int, dst []byte, addr uint64) (int, error) {
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

// deliverCMA delivers a process_vm_readv get's final completion.
func (t *Transport) deliverCMA(op *ucxOp, err error) {
	t.mu.Lock()
	live := t.ops[op.id] == op
	delete(t.ops, op.id)
	t.mu.Unlock()
	if !live {
		return
	}
	t.keyUnused(op.cma.key)
	c := transport.Completion{Err: err, Memory: transport.MemoryDone}
	if err == nil {
		c.Bytes = op.size
	}
	op.done(c)
}

// cancelCMALocked is Cancel for a process_vm_readv get: one running reports MemoryBusy now, as
// a UCX get does (a syscall cannot be stopped), and its final completion when it returns; one
// not begun reads nothing and reports cancelled when its goroutine finds it so.
func (t *Transport) cancelCMALocked(op *ucxOp) (busy bool) {
	return op.cma.started && !op.cma.finished
}

// dropPeerKeys retires every key unpacked from peer, on every lane, once a read by
// process_vm_readv proved the peer's process gone: nothing can be read through them again,
// and the peer's endpoints may not report its death for a while (UCX's keepalive), which is
// when dropKeysOnFailure would have retired them. A key some get still uses goes with its
// last get (keyUnused).
func (t *Transport) dropPeerKeys(peer transport.Peer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, k := range t.rma.keys {
		if id.peer == peer {
			delete(t.rma.keys, id)
			t.retireKeyLocked(k)
		}
	}
}
