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
	"sync/atomic"
	"unsafe"
)

// The operations a Request stands for: tagged messages (contiguous, IOV, bytes), RMA (put,
// get, fenced get, flush) and the remote keys RMA needs. A Request's life is in ucx_request.go.

// TagSend sends mem[off, off+n) as one tagged message.
func (ep *Endpoint) TagSend(mem *Memory, off, n int64, tag uint64) *Request {
	r, p, err := ep.w.prepare(opTagSend, ep, mem, off, n)
	if err != nil {
		return ep.w.failed(opTagSend, err)
	}
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		// With the region's memory handle: see kvx_ucx_tag_send_mapped (UCX 1.22 never
		// completed a rendezvous send on a force-closed endpoint without it).
		st := C.kvx_ucx_tag_send_mapped(ep.cep, C.uint64_t(tag), p, C.size_t(n), mem.memh, C.uint64_t(r.handle), &creq)
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
	// Zeroed: Go stores pointers into it below, and a pointer store runs the garbage
	// collector's write barrier, which also reads the old value; malloc's leftovers can look
	// like a pointer into the Go heap and make the runtime abort ("found bad pointer in Go heap").
	arr := C.calloc(C.size_t(len(segs)), C.size_t(unsafe.Sizeof(C.ucp_dt_iov_t{})))
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
		// With the region's memory handle: see kvx_ucx_tag_recv_mapped.
		st := C.kvx_ucx_tag_recv_mapped(w.cw, C.uint64_t(tag), C.uint64_t(mask), p, C.size_t(n),
			mem.memh, C.uint64_t(r.handle), &creq, &got)
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
	r.cbuf, r.awaited = arr, true
	return r.post(func() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
		var creq unsafe.Pointer
		var got C.size_t
		st := C.kvx_ucx_tag_recv_iov(w.cw, C.uint64_t(tag), C.uint64_t(mask), (*C.ucp_dt_iov_t)(arr),
			C.size_t(len(segs)), mem.memh, C.uint64_t(r.handle), &creq, &got)
		return st, creq, got
	})
}

// TagRecvBytes posts a receive of a small message of at most maxLen bytes into C memory;
// Data returns a Go copy once Done is closed. ep may be nil (an unbound receive).
func (w *Worker) TagRecvBytes(ep *Endpoint, maxLen int, tag, mask uint64) *Request {
	if maxLen < 0 {
		return w.failed(opTagRecv, fmt.Errorf("%w: tag recv: negative length", ErrInvalidArgument))
	}
	r := w.newRecvBytes(ep, maxLen, tag, mask)
	return r.post(r.recvBytes)
}

// newRecvBytes makes a TagRecvBytes request, its C buffer allocated, not yet posted.
func (w *Worker) newRecvBytes(ep *Endpoint, maxLen int, tag, mask uint64) *Request {
	r := w.newRequest(opTagRecv, nil, ep)
	r.cbuf = C.malloc(C.size_t(max(maxLen, 1)))
	r.copyOut = true
	r.recv = recvSpec{maxLen: maxLen, tag: tag, mask: mask}
	return r
}

// recvBytes (the loop) posts a newRecvBytes request to UCX.
func (r *Request) recvBytes() (C.ucs_status_t, unsafe.Pointer, C.size_t) {
	var creq unsafe.Pointer
	var got C.size_t
	st := C.kvx_ucx_tag_recv(r.w.cw, C.uint64_t(r.recv.tag), C.uint64_t(r.recv.mask), r.cbuf, C.size_t(r.recv.maxLen),
		C.uint64_t(r.handle), &creq, &got)
	return st, creq, got
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
	if err := ep.w.ctx.rmaRefused(kind); err != nil {
		return ep.w.failed(kind, err)
	}
	if rkey == nil || rkey.ep != ep {
		return ep.w.failed(kind, fmt.Errorf("%w: %v: the remote key must be unpacked on this endpoint", ErrInvalidArgument, kind))
	}
	if err := rkey.checkRange(remoteAddr, n); err != nil {
		return ep.w.failed(kind, fmt.Errorf("%v: %w", kind, err))
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

// rmaRefused is the error of a put or get on a context opened without RMA (ContextConfig.NoRMA),
// or nil. UCX 1.13 refuses such an operation itself, but UCX 1.22 as the wheel builds it checks
// no feature flags: it would send the operation's active messages to the peer anyway, and a
// get from a peer without RMA is never answered (it ends only with its endpoint).
func (c *Context) rmaRefused(kind opKind) error {
	if !c.cfg.NoRMA {
		return nil
	}
	return fmt.Errorf("%w: %v: the context was opened without RMA (ContextConfig.NoRMA)", ErrInvalidArgument, kind)
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
	ep     *Endpoint
	rkey   C.ucp_rkey_h // loop-owned
	mapped bool
	seg    *keySegment // the shared-memory segment the key names, checked before UCX attached it; nil: none
}

// Mapped reports whether a transport maps the key's memory into this process (ucp_rkey_ptr,
// asked once at unpack): posix's attached segment does for memory UCX allocated, and gets
// through such a key are loads. Without a mapping, UCX 1.13 over shared memory has no lane
// that gets from it natively and emulates gets with active messages: memory the peer
// registered (Context.Register) rather than allocated is such.
func (rk *RemoteKey) Mapped() bool { return rk.mapped }

// bounds is the peer's memory that a mapped key was checked to name: the segment's address in
// the peer and its size (the length a posix key declares, no more than its file has; a sysv
// segment's real size).
func (rk *RemoteKey) bounds() (base, size uint64, ok bool) {
	if !rk.mapped || rk.seg == nil {
		return 0, 0, false
	}
	return rk.seg.base, rk.seg.size, true
}

// checkRange refuses, with a *BoundsError, a range of n bytes at remoteAddr that does not lie
// inside the segment a mapped key names. UCX's shared-memory transports turn a remote address
// into a local pointer by adding an offset and check nothing, so a get or a view through a
// mapped key outside its segment would read whatever this process has there (or fault).
// Through a key that is not mapped, the peer's side serves the range and this process's
// memory is not at stake.
func (rk *RemoteKey) checkRange(remoteAddr uint64, n int64) error {
	if !rk.mapped || n <= 0 {
		return nil // a key that maps nothing; a size that prepare refuses
	}
	if base, size, ok := rk.bounds(); !ok || !contains(base, size, remoteAddr, uint64(n)) {
		return &BoundsError{Addr: remoteAddr, Len: uint64(n), Base: base, Size: size} // a mapped key always has bounds
	}
	return nil
}

// View returns n bytes of the peer's memory at remoteAddr as this process maps them, where the
// key is Mapped (ucp_rkey_ptr of the range's first and last byte, contiguous); nil and no error
// where it is not, or n is not positive. A range outside the segment the key names is refused
// with a *BoundsError (ErrOutOfBounds): the segment's address and length come from the key,
// checked against the segment's real size before UCX attached it. Loads from the view read the
// peer's memory, as a get through the key would; the mapping lasts as long as the key (Close)
// and outlives the peer's process. The caller must not Close the key while it reads, and
// writes nothing through it. A peer can still shrink its own posix segment file after the key
// was checked; a read past the new end faults (docs/security.md).
func (rk *RemoteKey) View(remoteAddr uint64, n int) ([]byte, error) {
	if !rk.mapped || n <= 0 || rk.rkey == nil {
		return nil, nil
	}
	if err := rk.checkRange(remoteAddr, int64(n)); err != nil {
		return nil, err
	}
	first := C.kvx_ucx_rkey_ptr(rk.rkey, C.uint64_t(remoteAddr))
	last := C.kvx_ucx_rkey_ptr(rk.rkey, C.uint64_t(remoteAddr+uint64(n-1)))
	if first == nil || last == nil || uintptr(last)-uintptr(first) != uintptr(n-1) {
		return nil, nil
	}
	return unsafe.Slice((*byte)(first), n), nil
}

// UnpackRemoteKey unpacks a key the peer made with Memory.PackRemoteKey. The key is checked
// before UCX sees it (CheckRemoteKey, against the peer's worker address), and so is the
// shared-memory segment it names, if this process will attach it: one UCX would assert on,
// read past or fail to attach (which crashes UCX 1.13) is refused with a *RemoteKeyError
// (ErrBadRemoteKey). The segment checked is held until UCX has attached it (keySegment.hold),
// so a peer that releases it or dies in between cannot make UCX's attach fail.
func (ep *Endpoint) UnpackRemoteKey(ctx context.Context, packed []byte) (*RemoteKey, error) {
	if len(packed) == 0 {
		return nil, fmt.Errorf("%w: empty remote key", ErrInvalidArgument)
	}
	seg, err := parseRemoteKey(packed, ep.peerAddr, ep.w.address)
	if err != nil {
		return nil, fmt.Errorf("unpack remote key: %w", err)
	}
	attach, release := packed, func() {}
	if seg != nil && seg.reachable {
		if attach, release, err = seg.hold(packed); err != nil {
			return nil, fmt.Errorf("unpack remote key: %w", err)
		}
		if afterSegmentCheck != nil {
			afterSegmentCheck()
		}
	}
	// The loop's command and this caller (when ctx ends first) race to claim the held
	// segment: the command unpacks only if it claims it first, the loser of the race leaves
	// it, and whichever claimed it releases it once UCX no longer needs it.
	var claimed atomic.Bool
	rk := &RemoteKey{ep: ep}
	buf := C.CBytes(attach)
	callErr := ep.w.call(ctx, func() {
		defer C.free(buf)
		if !claimed.CompareAndSwap(false, true) {
			return // the caller gave up on this command and released the segment
		}
		defer release() // UCX attached the segment (or failed) by now: the mapping holds it
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
			return
		}
		rk.mapped, err = hostMapping(packed, C.kvx_ucx_rkey_mapped(rk.rkey, 0) != 0, seg)
		if err != nil {
			// UCX mapped memory this check did not see it would attach: no bound is known.
			C.kvx_ucx_rkey_destroy(rk.rkey)
			rk.rkey = nil
			err = fmt.Errorf("unpack remote key: %w", err)
			return
		}
		rk.seg = seg
	})
	if callErr != nil {
		if claimed.CompareAndSwap(false, true) {
			release() // the command never ran and now never will unpack
		}
		return nil, callErr
	}
	if err != nil {
		return nil, err
	}
	return rk, nil
}

// hostMapping decides, once UCX unpacked a key (checked: its memory type byte is known), whether
// it maps the peer's memory into this process for in-place reads: only host memory does. UCX
// "maps" a cuda_ipc key too (ucp_rkey_ptr gives the IPC-opened device pointer), which the CPU
// must never read through (the second GPU run's two-process device transfers were refused as an
// unbound mapping): such a key is used for gets only. A host key UCX maps where the check found
// no segment it would attach has no known bound, and is refused.
func hostMapping(packed []byte, ucxMapped bool, seg *keySegment) (bool, error) {
	if !ucxMapped || packed[8] != rkeyMemoryHost {
		return false, nil
	}
	if seg == nil || !seg.reachable {
		return false, &RemoteKeyError{0, "UCX maps memory through the key where this check found no segment to bound it"}
	}
	return true, nil
}

// afterSegmentCheck, when set (tests only), runs between the check of a key's segment and UCX's
// attach of it.
var afterSegmentCheck func()

// Close destroys the unpacked key. Operations using it must have completed.
func (rk *RemoteKey) Close() {
	_ = rk.ep.w.submit(func() {
		if rk.rkey != nil && !rk.ep.w.dead {
			C.kvx_ucx_rkey_destroy(rk.rkey)
		}
		rk.rkey = nil
	})
}
