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

	"github.com/kvxfer/kvxfer/internal/hopstamp"
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
	awaited     bool           // a TagRecvIOV receive: its message wakes the worker (Worker.awaited)
	recv        recvSpec       // a TagRecvBytes receive's length, tag and mask
	standing    *standingChain // a standing receive's chain: its loop posts the next when it completes
	late        bool           // a standing receive that completed too far ahead: Next posts the next
	nextOnce    sync.Once      // Next's take of a standing receive
	onDone      func(error)

	// Final once done is closed.
	err    error
	length int64
	data   []byte   // what TagRecvBytes received
	next   *Request // a standing receive's successor (Next)
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
		if r.kind != opTagRecv {
			w.inFlight++
		}
		if r.awaited {
			w.awaited++
		}
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
		if r.kind != opTagRecv {
			r.w.inFlight--
		}
		if r.awaited {
			r.w.awaited--
		}
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
	if r.kind == opTagRecv && err != nil && !r.cleanCancel && r.ep != nil && r.ep.closing && !r.ep.peerFailed && !r.ep.departed && !r.ep.peerGone {
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
	if r.standing != nil && err == nil {
		r.next, r.late = r.w.standAgain(r)
	}
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
// buffer) stays pinned until the worker is closed, when nothing can write any more, or, for a
// local peer, until its process is seen gone and this worker's FIFOs drained after
// (pollSuspects).
func (r *Request) suspend(err error) {
	r.w.suspects[r] = struct{}{}
	r.w.watchSuspect(r.ep)
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

// queue queues f for the loop, then calls wake (waker.wake, or for a receive's post
// waker.wakeForReceive). It fails with ErrClosed once Close has begun, and never blocks past
// that.
func (w *Worker) queue(f func(), wake func()) error {
	select {
	case <-w.stopReq:
		return ErrClosed
	default:
	}
	select {
	case w.cmds <- f:
		hopstamp.MarkLast("submit queued")
		wake() // a full queue was woken for by whoever filled it
		hopstamp.MarkLast("submit woke")
		return nil
	case <-w.stopReq:
		return ErrClosed
	}
}

// post hands a prepared request to the loop. do runs there and returns what the nbx call
// returned. If the worker is closed, the request completes with ErrClosed at once. A receive's
// post wakes a sleeping loop only where it may match at once (waker.wakeForReceive).
func (r *Request) post(do func() (C.ucs_status_t, unsafe.Pointer, C.size_t)) *Request {
	wake := r.w.wake.wake
	if r.kind == opTagRecv {
		wake = r.w.wake.wakeForReceive
	}
	err := r.w.queue(func() {
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
	}, wake)
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
