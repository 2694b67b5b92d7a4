// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include <stdlib.h>
#include "ucx.h"
*/
import "C"

import (
	"context"
	"fmt"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"unsafe"
)

type opKind int

const (
	opTagSend opKind = iota
	opTagRecv
	opPut
	opGet
	opFlush
	opClose
)

func (k opKind) String() string {
	return [...]string{"tag send", "tag recv", "put", "get", "flush", "endpoint close"}[k]
}

// Request is one UCX operation. It is created at once by the posting method and completes
// exactly once (invariant L6): Done closes, then Err and Length are final. Its memory stays
// pinned (Memory.Close refuses) until then.
type Request struct {
	w      *Worker
	kind   opKind
	ep     *Endpoint // the endpoint it runs on, or the one a receive is bound to
	mem    *Memory   // pinned until completion
	handle cgo.Handle
	done   chan struct{}

	// Loop-owned until done closes.
	creq      unsafe.Pointer // the live UCX request, nil once its callback ran
	tracked   bool
	finished  bool
	abandoned bool // reported failed while UCX still holds it (see Abandoned)
	// cleanCancel: UCX completed the receive inside our ucp_request_cancel, so it had not
	// matched any message and nothing can ever write into it.
	cleanCancel bool
	settled     atomic.Bool    // UCX released the request and its memory (see Settled)
	cbuf        unsafe.Pointer // C memory the operation owns: a message copy or an iov array
	copyOut     bool           // cbuf is a TagRecvBytes buffer: copy it into data on success
	onDone      func(error)

	// Final once done is closed.
	err    error
	length int64
	data   []byte // what TagRecvBytes received
}

func (w *Worker) newRequest(kind opKind, mem *Memory, ep *Endpoint) *Request {
	r := &Request{w: w, kind: kind, mem: mem, ep: ep, done: make(chan struct{})}
	r.handle = cgo.NewHandle(r)
	return r
}

// Done is closed when the request has completed, failed or been cancelled.
func (r *Request) Done() <-chan struct{} { return r.done }

// Completed reports whether the request is done. It never blocks.
func (r *Request) Completed() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Err is the request's outcome once Done is closed: nil on success, else an error matching
// ErrCancelled, ErrPeerUnreachable, ErrClosed, ... Before that it returns nil.
func (r *Request) Err() error {
	if !r.Completed() {
		return nil
	}
	return r.err
}

// Length is the number of bytes received (receives) once Done is closed.
func (r *Request) Length() int64 {
	if !r.Completed() {
		return 0
	}
	return r.length
}

// Data returns the message a TagRecvBytes received, once Done is closed.
func (r *Request) Data() []byte {
	if !r.Completed() {
		return nil
	}
	return r.data
}

// Wait blocks until the request is done or ctx ends, whichever is first. On ctx's end it
// returns an error matching ErrTimeout; the request itself goes on.
func (r *Request) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("%w: %v still pending: %w", ErrTimeout, r.kind, ctx.Err())
	}
}

// Cancel asks UCX to cancel the request and returns at once. Only a tagged receive that has
// not matched a message can really be cancelled: it then completes with ErrCancelled. A send,
// put or get in flight cannot be (UCX 1.13 has no way): it completes on its own, or with an
// error when its endpoint is force-closed. Cancel reports whether the request is of a kind
// UCX can cancel; either way, wait for Done before reusing its memory.
func (r *Request) Cancel() bool {
	if r.kind != opTagRecv {
		return false
	}
	_ = r.w.submit(func() { r.w.cancel(r) })
	return true
}

func (r *Request) cancellable() bool { return !r.finished && r.creq != nil && !r.w.dead }

// track (loop only) takes what a post returned: UCS_INPROGRESS keeps the live request until
// its callback; anything else is the request's one completion, now.
func (w *Worker) track(r *Request, st C.ucs_status_t, creq unsafe.Pointer, length C.size_t) {
	if st == C.UCS_INPROGRESS {
		if creq == nil {
			return // called back from inside the post: already finished
		}
		r.creq = creq
		r.tracked = true
		w.pending[r] = struct{}{}
		if r.ep != nil {
			if r.kind == opTagRecv {
				r.ep.recvs[r] = struct{}{}
			} else {
				r.ep.ops[r] = struct{}{}
			}
		}
		return
	}
	r.finish(statusErr(r.kind.String(), st), int64(length))
}

// finish is the request's single completion: it runs once, on the loop (or, for a request
// never handed to the loop, on the caller's goroutine).
func (r *Request) finish(err error, length int64) {
	if r.finished {
		return
	}
	r.finished = true
	if r.tracked {
		delete(r.w.pending, r)
		if r.ep != nil {
			if r.kind == opTagRecv {
				delete(r.ep.recvs, r)
			} else {
				delete(r.ep.ops, r)
			}
		}
	}
	r.handle.Delete()
	// w.cancelling is the loop's; only a tracked request finishes on the loop, and only a
	// tracked one (it has a UCX request) can be the one being cancelled.
	if r.tracked && r.w.cancelling == r {
		r.cleanCancel = true
	}
	if r.kind == opTagRecv && err != nil && !r.cleanCancel && r.ep != nil && r.ep.closing && !r.ep.peerFailed {
		r.suspend(err)
		return
	}
	if r.cbuf != nil {
		if r.copyOut && err == nil {
			r.data = C.GoBytes(r.cbuf, C.int(length))
		}
		C.free(r.cbuf)
		r.cbuf = nil
	}
	if r.mem != nil {
		r.mem.unpin()
	}
	r.settled.Store(true)
	if r.abandoned {
		// The caller was told at abandon time; now UCX has let go too.
		r.w.notify(r)
		return
	}
	r.err = err
	r.length = length
	if r.onDone != nil {
		r.onDone(err)
	}
	close(r.done)
	r.w.notify(r)
}

// suspend (loop only) ends a receive that UCX failed when we closed its endpoint under it
// after it had matched a message, while the peer may still be alive (frozen, not dead): UCX
// 1.13 was seen, over TCP, to keep writing such a receive's fragments into its buffer when the
// peer resumed. The caller learns now, as for an abandoned request; the memory (and any C
// buffer) stays pinned until the worker is closed, when nothing can write any more.
func (r *Request) suspend(err error) {
	r.w.suspects[r] = struct{}{}
	if r.abandoned {
		return // the caller was told when it was abandoned
	}
	r.abandoned = true
	r.err = fmt.Errorf("%v failed after it matched, with a live peer that may still write into it; its memory stays pinned until the worker closes: %w", r.kind, err)
	if r.onDone != nil {
		r.onDone(r.err)
	}
	close(r.done)
	r.w.notify(r)
}

// settleSuspect (loop only, after the worker is destroyed) releases a suspended receive.
func (r *Request) settleSuspect() {
	if r.cbuf != nil {
		C.free(r.cbuf)
		r.cbuf = nil
	}
	if r.mem != nil {
		r.mem.unpin()
	}
	r.settled.Store(true)
	r.w.notify(r)
}

// cancel (loop only) asks UCX to cancel r, noting whether UCX completed it on the spot.
func (w *Worker) cancel(r *Request) {
	if !r.cancellable() {
		return
	}
	w.posting(func() {
		w.cancelling = r
		C.kvx_ucx_cancel(w.cw, r.creq)
		w.cancelling = nil
	})
}

// Settled reports whether UCX has released the request and no longer touches its memory.
// It is true once Done is closed, except for an abandoned request, which settles later (when
// UCX calls it back, or when the worker is closed). It never blocks.
func (r *Request) Settled() bool { return r.settled.Load() }

// abandon (loop only) reports a request failed although UCX still holds it: its endpoint was
// closed, yet UCX 1.13 keeps some requests (a rendezvous send queued behind a frozen or dead
// shared-memory peer) without ever calling back. The caller learns at once, so no wait is
// unbounded; the memory stays pinned until UCX lets go (its callback, or Worker.Close), so
// nothing is released that UCX may still read or write (L2, L9).
func (r *Request) abandon(why error) {
	if r.finished || r.abandoned {
		return
	}
	r.abandoned = true
	r.err = fmt.Errorf("%v abandoned: UCX still holds it after its endpoint closed, its memory stays pinned: %w", r.kind, why)
	if r.onDone != nil {
		r.onDone(r.err)
	}
	close(r.done)
	r.w.notify(r)
}

// Abandoned reports, once Done is closed, whether the request failed while UCX may still
// touch its memory: Memory.InUse counts it until UCX lets go. A transport must treat such
// memory as not quiescent (poison it) rather than reuse it.
func (r *Request) Abandoned() bool {
	if !r.Completed() {
		return false
	}
	return r.abandoned
}

// onCallback runs on the loop when ucx.c reports the request completed. ucx.c frees the UCX
// request right after this returns.
func (r *Request) onCallback(status C.int, length C.size_t) {
	r.creq = nil
	r.finish(statusErr(r.kind.String(), C.ucs_status_t(status)), int64(length))
}

// post hands a prepared request to the loop. do runs there and returns what the nbx call
// returned. If the worker is closed, the request completes with ErrClosed at once.
func (r *Request) post(do func() (C.ucs_status_t, unsafe.Pointer, C.size_t)) *Request {
	err := r.w.submit(func() {
		if r.w.dead {
			r.finish(ErrClosed, 0)
			return
		}
		if r.ep != nil && (r.ep.released || r.ep.closing) {
			err := r.ep.Err()
			if err == nil {
				err = ErrClosed
			}
			r.finish(fmt.Errorf("%v on a failed endpoint: %w", r.kind, err), 0)
			return
		}
		r.w.posting(func() {
			st, creq, n := do()
			r.w.track(r, st, creq, n)
		})
	})
	if err != nil {
		r.finish(err, 0)
	}
	return r
}

// failed returns a request that completed with err without reaching UCX.
func (w *Worker) failed(kind opKind, err error) *Request {
	r := w.newRequest(kind, nil, nil)
	r.finish(err, 0)
	return r
}

// prepare validates a memory range and pins the memory for a new request.
func (w *Worker) prepare(kind opKind, ep *Endpoint, mem *Memory, off, n int64) (*Request, unsafe.Pointer, error) {
	if mem == nil {
		return nil, nil, fmt.Errorf("%w: %v: nil memory", ErrInvalidArgument, kind)
	}
	if off < 0 || n < 0 || off > mem.size || n > mem.size-off {
		return nil, nil, fmt.Errorf("%w: %v: range [%d, +%d) outside the %d-byte region",
			ErrInvalidArgument, kind, off, n, mem.size)
	}
	if err := mem.pin(); err != nil {
		return nil, nil, err
	}
	return w.newRequest(kind, mem, ep), unsafe.Add(mem.addr, off), nil
}

// TagSend sends mem[off, off+n) as one tagged message.
func (ep *Endpoint) TagSend(mem *Memory, off, n int64, tag uint64) *Request {
	r, p, err := ep.w.prepare(opTagSend, ep, mem, off, n)
	if err != nil {
		return ep.w.failed(opTagSend, err)
	}
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		st := C.kvx_ucx_tag_send(ep.cep, C.uint64_t(tag), p, C.size_t(n), C.uint64_t(r.handle), &creq)
		return st, creq, 0
	})
}

// Segment is a byte range of a Memory region.
type Segment struct {
	Offset int64
	Length int64
}

// iovFor builds a C iov array over segs of mem; the caller owns (frees) it.
func iovFor(kind opKind, mem *Memory, segs []Segment) (unsafe.Pointer, int64, error) {
	if len(segs) == 0 {
		return nil, 0, fmt.Errorf("%w: %v: no segments", ErrInvalidArgument, kind)
	}
	var total int64
	for i, s := range segs {
		if s.Offset < 0 || s.Length < 0 || s.Offset > mem.size || s.Length > mem.size-s.Offset {
			return nil, 0, fmt.Errorf("%w: %v: segment %d [%d, +%d) outside the %d-byte region",
				ErrInvalidArgument, kind, i, s.Offset, s.Length, mem.size)
		}
		total += s.Length
	}
	arr := C.malloc(C.size_t(len(segs)) * C.size_t(unsafe.Sizeof(C.ucp_dt_iov_t{})))
	iov := unsafe.Slice((*C.ucp_dt_iov_t)(arr), len(segs))
	for i, s := range segs {
		iov[i].buffer = unsafe.Add(mem.addr, s.Offset)
		iov[i].length = C.size_t(s.Length)
	}
	return arr, total, nil
}

// TagSendIOV sends the segments of mem, in order, as one tagged message: UCX reads the
// pieces in place (no gather copy), which is the one-copy path for KV blocks that lie
// scattered in a registered pool.
func (ep *Endpoint) TagSendIOV(mem *Memory, segs []Segment, tag uint64) *Request {
	if mem == nil {
		return ep.w.failed(opTagSend, fmt.Errorf("%w: tag send: nil memory", ErrInvalidArgument))
	}
	arr, _, err := iovFor(opTagSend, mem, segs)
	if err != nil {
		return ep.w.failed(opTagSend, err)
	}
	if err := mem.pin(); err != nil {
		C.free(arr)
		return ep.w.failed(opTagSend, err)
	}
	r := ep.w.newRequest(opTagSend, mem, ep)
	r.cbuf = arr
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		st := C.kvx_ucx_tag_send_iov(ep.cep, C.uint64_t(tag), (*C.ucp_dt_iov_t)(arr), C.size_t(len(segs)),
			C.uint64_t(r.handle), &creq)
		return st, creq, 0
	})
}

// TagSendBytes sends a small message from Go memory: it is copied into C memory first,
// because Go memory is never handed to an asynchronous UCX call.
func (ep *Endpoint) TagSendBytes(b []byte, tag uint64) *Request {
	r := ep.w.newRequest(opTagSend, nil, ep)
	r.cbuf = C.malloc(C.size_t(max(len(b), 1)))
	copy(unsafe.Slice((*byte)(r.cbuf), len(b)), b)
	n := len(b)
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		st := C.kvx_ucx_tag_send(ep.cep, C.uint64_t(tag), r.cbuf, C.size_t(n), C.uint64_t(r.handle), &creq)
		return st, creq, 0
	})
}

// TagRecv posts a receive of one message matching tag under mask into mem[off, off+n). A
// receive bound to an endpoint (Endpoint.TagRecv) is also cancelled when that endpoint fails
// or closes; this one only by Cancel or Worker.Close.
func (w *Worker) TagRecv(mem *Memory, off, n int64, tag, mask uint64) *Request {
	return w.tagRecv(nil, mem, off, n, tag, mask)
}

// TagRecv posts a receive (see Worker.TagRecv) bound to ep: when the peer fails or the
// endpoint is closed, the receive is cancelled if it has not matched yet.
func (ep *Endpoint) TagRecv(mem *Memory, off, n int64, tag, mask uint64) *Request {
	return ep.w.tagRecv(ep, mem, off, n, tag, mask)
}

func (w *Worker) tagRecv(ep *Endpoint, mem *Memory, off, n int64, tag, mask uint64) *Request {
	r, p, err := w.prepare(opTagRecv, ep, mem, off, n)
	if err != nil {
		return w.failed(opTagRecv, err)
	}
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		var got C.size_t
		st := C.kvx_ucx_tag_recv(w.cw, C.uint64_t(tag), C.uint64_t(mask), p, C.size_t(n),
			C.uint64_t(r.handle), &creq, &got)
		return st, creq, got
	})
}

// TagRecvIOV posts a receive that scatters one message over the segments of mem, in order.
func (ep *Endpoint) TagRecvIOV(mem *Memory, segs []Segment, tag, mask uint64) *Request {
	w := ep.w
	if mem == nil {
		return w.failed(opTagRecv, fmt.Errorf("%w: tag recv: nil memory", ErrInvalidArgument))
	}
	arr, _, err := iovFor(opTagRecv, mem, segs)
	if err != nil {
		return w.failed(opTagRecv, err)
	}
	if err := mem.pin(); err != nil {
		C.free(arr)
		return w.failed(opTagRecv, err)
	}
	r := w.newRequest(opTagRecv, mem, ep)
	r.cbuf = arr
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		var got C.size_t
		st := C.kvx_ucx_tag_recv_iov(w.cw, C.uint64_t(tag), C.uint64_t(mask), (*C.ucp_dt_iov_t)(arr),
			C.size_t(len(segs)), C.uint64_t(r.handle), &creq, &got)
		return st, creq, got
	})
}

// TagRecvBytes posts a receive of a small message of at most maxLen bytes into C memory;
// Data returns a Go copy once Done is closed. ep may be nil (an unbound receive).
func (w *Worker) TagRecvBytes(ep *Endpoint, maxLen int, tag, mask uint64) *Request {
	if maxLen < 0 {
		return w.failed(opTagRecv, fmt.Errorf("%w: tag recv: negative length", ErrInvalidArgument))
	}
	r := w.newRequest(opTagRecv, nil, ep)
	r.cbuf = C.malloc(C.size_t(max(maxLen, 1)))
	r.copyOut = true
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		var got C.size_t
		st := C.kvx_ucx_tag_recv(w.cw, C.uint64_t(tag), C.uint64_t(mask), r.cbuf, C.size_t(maxLen),
			C.uint64_t(r.handle), &creq, &got)
		return st, creq, got
	})
}

// Put writes mem[off, off+n) to the peer's registered memory at remoteAddr. It is locally
// complete when Done closes; Flush makes it remotely complete.
func (ep *Endpoint) Put(mem *Memory, off, n int64, remoteAddr uint64, rkey *RemoteKey) *Request {
	return ep.rma(opPut, mem, off, n, remoteAddr, rkey)
}

// Get reads n bytes at remoteAddr of the peer's registered memory into mem[off, off+n).
func (ep *Endpoint) Get(mem *Memory, off, n int64, remoteAddr uint64, rkey *RemoteKey) *Request {
	return ep.rma(opGet, mem, off, n, remoteAddr, rkey)
}

// GetFenced is Get behind a fence (ucp_worker_fence): it reads only after every operation
// posted on the worker before it, such as the gets whose data a generation word validates.
func (ep *Endpoint) GetFenced(mem *Memory, off, n int64, remoteAddr uint64, rkey *RemoteKey) *Request {
	return ep.rmaOp(opGet, true, mem, off, n, remoteAddr, rkey)
}

func (ep *Endpoint) rma(kind opKind, mem *Memory, off, n int64, remoteAddr uint64, rkey *RemoteKey) *Request {
	return ep.rmaOp(kind, false, mem, off, n, remoteAddr, rkey)
}

func (ep *Endpoint) rmaOp(kind opKind, fenced bool, mem *Memory, off, n int64, remoteAddr uint64, rkey *RemoteKey) *Request {
	if rkey == nil || rkey.ep != ep {
		return ep.w.failed(kind, fmt.Errorf("%w: %v: the remote key must be unpacked on this endpoint", ErrInvalidArgument, kind))
	}
	r, p, err := ep.w.prepare(kind, ep, mem, off, n)
	if err != nil {
		return ep.w.failed(kind, err)
	}
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		if rkey.rkey == nil {
			return C.UCS_ERR_INVALID_PARAM, nil, 0
		}
		var creq unsafe.Pointer
		var st C.ucs_status_t
		switch {
		case kind == opPut:
			st = C.kvx_ucx_put(ep.cep, p, C.size_t(n), C.uint64_t(remoteAddr), rkey.rkey, C.uint64_t(r.handle), &creq)
		case fenced:
			st = C.kvx_ucx_get_fenced(ep.cep, p, C.size_t(n), C.uint64_t(remoteAddr), rkey.rkey, C.uint64_t(r.handle), &creq)
		default:
			st = C.kvx_ucx_get(ep.cep, p, C.size_t(n), C.uint64_t(remoteAddr), rkey.rkey, C.uint64_t(r.handle), &creq)
		}
		return st, creq, 0
	})
}

// Flush completes once every put and get issued on the endpoint before it is complete at
// the peer too.
func (ep *Endpoint) Flush() *Request {
	r := ep.w.newRequest(opFlush, nil, ep)
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		st := C.kvx_ucx_ep_flush(ep.cep, C.uint64_t(r.handle), &creq)
		return st, creq, 0
	})
}

// RemoteKey is a peer's packed memory key unpacked on one endpoint, for Put and Get.
type RemoteKey struct {
	ep   *Endpoint
	rkey C.ucp_rkey_h // loop-owned
}

// UnpackRemoteKey unpacks a key the peer made with Memory.PackRemoteKey.
func (ep *Endpoint) UnpackRemoteKey(ctx context.Context, packed []byte) (*RemoteKey, error) {
	if len(packed) == 0 {
		return nil, fmt.Errorf("%w: empty remote key", ErrInvalidArgument)
	}
	rk := &RemoteKey{ep: ep}
	var err error
	buf := C.CBytes(packed)
	callErr := ep.w.call(ctx, func() {
		defer C.free(buf)
		if ep.w.dead || ep.released {
			err = ErrClosed
			return
		}
		if ep.cep.failed != 0 || ep.closing {
			// UCX 1.13 dereferences a failed endpoint's lanes in ucp_ep_rkey_unpack (SIGSEGV,
			// seen when a key was first unpacked after its peer was killed).
			err = fmt.Errorf("%w: unpack remote key: the endpoint failed or is closing", ErrClosed)
			if ep.peerFailed {
				err = fmt.Errorf("%w: unpack remote key: the endpoint failed", ErrPeerUnreachable)
			}
			return
		}
		if st := C.kvx_ucx_rkey_unpack(ep.cep, buf, &rk.rkey); st != C.UCS_OK {
			err = statusErr("unpack remote key", st)
		}
	})
	if callErr != nil {
		return nil, callErr
	}
	return rk, err
}

// Close destroys the unpacked key. Operations using it must have completed.
func (rk *RemoteKey) Close() {
	_ = rk.ep.w.submit(func() {
		if rk.rkey != nil && !rk.ep.w.dead {
			C.kvx_ucx_rkey_destroy(rk.rkey)
		}
		rk.rkey = nil
	})
}

// MemoryKind is where a memory region lives.
type MemoryKind int

// Memory kinds, as UCX's ucs_memory_type_t.
const (
	MemoryHost MemoryKind = iota // host memory
	MemoryCUDA                   // CUDA device memory (needs a CUDA-enabled UCX)
)

// Memory is a region UCX can send from, receive into and expose for RMA: allocated by UCX
// (Allocate) or the caller's memory registered once (Register). Close refuses while a request
// still uses it.
type Memory struct {
	ctx   *Context
	memh  C.ucp_mem_h
	addr  unsafe.Pointer
	size  int64
	kind  MemoryKind
	mu    sync.Mutex
	pins  int
	freed bool
}

// Allocate maps size bytes of host memory through UCX (ucp_mem_map with ALLOCATE): RMA
// into it is faster than into memory registered afterwards.
func (c *Context) Allocate(size int64) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: allocate %d bytes: size must be positive", ErrInvalidArgument, size)
	}
	if err := c.acquire(0, 1); err != nil {
		return nil, err
	}
	m := &Memory{ctx: c, size: size, kind: MemoryHost}
	if st := C.kvx_ucx_mem_alloc(c.ctx, C.size_t(size), &m.memh, &m.addr); st != C.UCS_OK {
		_ = c.acquire(0, -1)
		return nil, statusErr(fmt.Sprintf("allocate %d bytes", size), st)
	}
	return m, nil
}

// Register registers size bytes at addr, memory the caller allocated outside Go's heap (C
// memory, a CUDA allocation, an mmap). It must stay valid until Close. Register once per
// pool, never per block.
func (c *Context) Register(addr unsafe.Pointer, size int64, kind MemoryKind) (*Memory, error) {
	if addr == nil || size <= 0 {
		return nil, fmt.Errorf("%w: register [%p, +%d): need an address and a positive size", ErrInvalidArgument, addr, size)
	}
	mt, err := c.checkKind(kind) // device memory only with a UCX that reaches it (ucx_device.go)
	if err != nil {
		return nil, err
	}
	if err := c.acquire(0, 1); err != nil {
		return nil, err
	}
	m := &Memory{ctx: c, size: size, kind: kind, addr: addr}
	if st := C.kvx_ucx_mem_register(c.ctx, m.addr, C.size_t(size), mt, &m.memh); st != C.UCS_OK {
		_ = c.acquire(0, -1)
		return nil, statusErr("register memory", st)
	}
	return m, nil
}

// Len is the region's size in bytes.
func (m *Memory) Len() int64 { return m.size }

// Addr is the region's address, what a peer needs (with the packed key) for RMA.
func (m *Memory) Addr() uint64 { return uint64(uintptr(m.addr)) }

// Kind is where the region lives.
func (m *Memory) Kind() MemoryKind { return m.kind }

// Bytes is the region as a byte slice, for host memory; nil for device memory. It is only
// valid until Close, and must not be written while a request uses the range.
func (m *Memory) Bytes() []byte {
	if m.kind != MemoryHost {
		return nil
	}
	return unsafe.Slice((*byte)(m.addr), m.size)
}

// PackRemoteKey packs the region's remote key for a peer's UnpackRemoteKey.
func (m *Memory) PackRemoteKey() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return nil, ErrClosed
	}
	var buf unsafe.Pointer
	var n C.size_t
	if st := C.kvx_ucx_rkey_pack(m.ctx.ctx, m.memh, &buf, &n); st != C.UCS_OK {
		return nil, statusErr("pack remote key", st)
	}
	defer C.free(buf)
	return C.GoBytes(buf, C.int(n)), nil
}

func (m *Memory) pin() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return fmt.Errorf("%w: memory region", ErrClosed)
	}
	m.pins++
	return nil
}

func (m *Memory) unpin() {
	m.mu.Lock()
	m.pins--
	m.mu.Unlock()
}

// InUse is how many requests use the region now. It never blocks for long.
func (m *Memory) InUse() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pins
}

// Close unmaps the region (and frees it, if Allocate made it). It returns ErrBusy while a
// request still uses it: memory is never released under UCX (invariant L2).
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return nil
	}
	if m.pins > 0 {
		return fmt.Errorf("%w: %d requests still use the region", ErrBusy, m.pins)
	}
	m.freed = true
	st := C.kvx_ucx_mem_release(m.ctx.ctx, m.memh)
	_ = m.ctx.acquire(0, -1)
	return statusErr("release memory", st)
}

// FillPattern writes the test pattern of stream bytes [streamOff, streamOff+n) with seed into
// the region at off. Tests and the benchmark peer use it to check every byte moved.
func (m *Memory) FillPattern(off, n int64, streamOff uint64, seed uint64) error {
	if m.kind != MemoryHost || off < 0 || n < 0 || off > m.size || n > m.size-off {
		return fmt.Errorf("%w: fill [%d, +%d) of a %d-byte region", ErrInvalidArgument, off, n, m.size)
	}
	C.kvx_ucx_pattern_fill(unsafe.Add(m.addr, off), C.uint64_t(streamOff), C.size_t(n), C.uint64_t(seed))
	return nil
}

// CheckPattern returns the offset (relative to off) of the first byte in [off, off+n) that
// differs from the test pattern, or -1 when all match.
func (m *Memory) CheckPattern(off, n int64, streamOff uint64, seed uint64) (int64, error) {
	if m.kind != MemoryHost || off < 0 || n < 0 || off > m.size || n > m.size-off {
		return 0, fmt.Errorf("%w: check [%d, +%d) of a %d-byte region", ErrInvalidArgument, off, n, m.size)
	}
	return int64(C.kvx_ucx_pattern_check(unsafe.Add(m.addr, off), C.uint64_t(streamOff), C.size_t(n), C.uint64_t(seed))), nil
}
