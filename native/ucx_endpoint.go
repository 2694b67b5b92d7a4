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
	"time"
	"unsafe"

	"go.uber.org/zap"
)

// An Endpoint's life: Connect, the error report (from UCX's callback, deferred while a post
// is under way), and its close. The worker and context are in ucx.go.

// Connect creates an endpoint to the worker at addr, with peer error handling: if the peer
// dies, every operation on the endpoint completes with an error and Failed closes. An address
// this UCX cannot read (CheckAddress) is refused with an *AddressError before UCX sees it,
// since UCX trusts the bytes and aborts the process on some garbage; so is a peer on this host
// whose shared-memory receive FIFO differs in size from this process's (ContextConfig.ShmFIFOSize).
func (w *Worker) Connect(ctx context.Context, addr []byte) (*Endpoint, error) {
	if len(addr) == 0 {
		return nil, fmt.Errorf("%w: empty worker address", ErrInvalidArgument)
	}
	if err := CheckAddress(addr, w.address); err != nil { // UCX would read past it or abort
		return nil, err
	}
	if err := checkPeerFIFO(addr, w.address); err != nil { // UCX would overrun or lose messages
		return nil, err
	}
	ep := &Endpoint{w: w, peerAddr: append([]byte(nil), addr...), failed: make(chan struct{}), closed: make(chan struct{}),
		recvs: make(map[*Request]struct{}), ops: make(map[*Request]struct{}), peerFIFOs: recordPeerFIFOs(addr, w.address)}
	ep.peerProc = localProcOf(ep.peerFIFOs)
	var err error
	caddr := C.CBytes(addr)
	callErr := w.call(ctx, func() {
		defer C.free(caddr)
		if w.dead {
			closeFIFOSegs(ep.peerFIFOs)
			err = ErrClosed
			return
		}
		ep.handle = cgo.NewHandle(ep)
		if st := C.kvx_ucx_ep_create(w.cw, caddr, C.size_t(len(addr)), C.uint64_t(ep.handle), &ep.cep); st != C.UCS_OK {
			ep.handle.Delete()
			closeFIFOSegs(ep.peerFIFOs)
			err = statusErr("create endpoint", st)
			return
		}
		w.endpoints[ep] = struct{}{}
	})
	if callErr != nil {
		// The command may still run later; if it does, the endpoint is closed by shutdown or
		// by its own failure, never leaked: it is in w.endpoints.
		return nil, callErr
	}
	if err != nil {
		return nil, err
	}
	return ep, nil
}

// Endpoint is a connection to one peer worker. Its operations return Requests at once.
type Endpoint struct {
	w        *Worker
	cep      *C.kvx_ucx_ep_t
	handle   cgo.Handle
	peerAddr []byte // the peer's worker address, which says how to read its remote keys

	failOnce   sync.Once
	failed     chan struct{} // closed when the peer failed or the endpoint was closed
	failErr    atomic.Pointer[error]
	closed     chan struct{}         // closed when UCX released the endpoint
	closing    bool                  // loop-owned: a close was started
	peerFailed bool                  // loop-owned: UCX reported the peer failed (not our own close)
	departed   bool                  // loop-owned: the peer said it sends nothing more (ForceCloseDeparted)
	released   bool                  // loop-owned
	recvs      map[*Request]struct{} // loop-owned: receives bound to the endpoint
	ops        map[*Request]struct{} // loop-owned: sends, puts, gets, flushes not yet completed
	peerFIFOs  []*peerFIFOSeg        // a local peer's receive FIFOs (posix, sysv), emptied once its process is gone; none when not local
	// peerProc is the local peer's process its FIFO records named at Connect (nil when not
	// local); peerGone (loop-owned): it was seen gone with this worker's FIFOs drained since, so
	// nothing it sent can still arrive; suspectWatched (loop-owned): the watch has the endpoint
	// for its suspended receives (fifo_dead_recvs.go).
	peerProc       *localProc
	peerGone       bool
	suspectWatched bool
}

// Failed is closed once the endpoint can no longer be used: the peer failed, or Close or
// ForceClose was called. Err says why.
func (ep *Endpoint) Failed() <-chan struct{} { return ep.failed }

// Err is why the endpoint failed, or nil while it is usable. It never blocks.
func (ep *Endpoint) Err() error {
	if p := ep.failErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (ep *Endpoint) fail(err error) {
	ep.failOnce.Do(func() {
		ep.failErr.Store(&err)
		close(ep.failed)
	})
}

// lateEPError is an endpoint failure UCX reported from inside a post, for after it.
type lateEPError struct {
	ep     *Endpoint
	status int // a ucs_status_t
}

// posting (loop only) runs f, which calls UCX to post, close or cancel, and then the
// endpoint failures UCX reported from inside it. UCX 1.13 fails a TCP endpoint inside the send
// that finds its connection reset (a killed peer), so the error handler runs in the middle of
// ucp_tag_send_nbx; closing the endpoint there would free the endpoint record the post still
// reads, and nest a second post inside the first. f is also where the request is tracked, so
// the close that follows finds it among the endpoint's operations.
func (w *Worker) posting(f func()) {
	w.inUCX++
	f()
	w.inUCX--
	if w.inUCX > 0 {
		return
	}
	for len(w.lateErrs) > 0 {
		e := w.lateErrs[0]
		w.lateErrs = w.lateErrs[1:]
		e.ep.onError(C.int(e.status))
	}
	w.lateErrs = nil
}

// reportError runs on the loop when UCX reports the peer failed: at once, or after the post
// UCX reported it from (see Worker.posting).
func (ep *Endpoint) reportError(status int) {
	if ep.w.inUCX > 0 {
		ep.w.lateErrs = append(ep.w.lateErrs, lateEPError{ep, status})
		return
	}
	ep.onError(C.int(status))
}

// onError handles UCX's report that the peer failed.
func (ep *Endpoint) onError(status C.int) {
	err := statusErr("endpoint", C.ucs_status_t(status))
	if ep.released {
		ep.fail(err) // closed (and its record freed) since UCX reported it
		return
	}
	if ep.w.destroying {
		ep.fail(err) // the worker is going away with every endpoint: nothing to close
		return
	}
	ep.peerFailed = true // the peer is gone: nothing it sent can still arrive
	ep.w.log.Warn("ucx endpoint failed", zap.Error(err))
	ep.startClose(true, err)
}

// startClose (loop only) fails the endpoint with why, cancels its receives, and starts a
// flush-and-close, or a forced close that completes its pending sends with an error.
func (ep *Endpoint) startClose(force bool, why error) {
	ep.fail(why)
	if force || ep.peerFailed {
		ep.releaseDeadPeerFIFO()
	}
	for r := range ep.recvs {
		ep.w.cancel(r)
	}
	if ep.closing || ep.released {
		return
	}
	ep.closing = true
	if ep.cep.failed != 0 {
		force = true // UCX allows only a forced close of a failed endpoint
	}
	f := C.int(0)
	if force {
		f = 1
	}
	r := ep.w.newRequest(opClose, nil, ep)
	r.onDone = func(error) { ep.release() }
	ep.w.posting(func() {
		var creq unsafe.Pointer
		st := C.kvx_ucx_ep_close(ep.cep, f, C.uint64_t(r.handle), &creq)
		ep.w.track(r, st, creq, 0)
	})
}

// release (loop only) frees the C endpoint once UCX is done with it. Requests on it that UCX
// still holds are abandoned: reported failed now, their memory pinned until UCX lets go.
func (ep *Endpoint) release() {
	if ep.released {
		return
	}
	ep.released = true
	dead := ep.w.dead
	why := ep.Err()
	if why == nil {
		why = ErrClosed
	}
	// UCX usually completes the endpoint's requests right after the close; give it a grace
	// period of progress before declaring the rest abandoned.
	if len(ep.ops)+len(ep.recvs) > 0 {
		left := make([]*Request, 0, len(ep.ops)+len(ep.recvs))
		for r := range ep.ops {
			left = append(left, r)
		}
		for r := range ep.recvs {
			left = append(left, r)
		}
		if !dead {
			for _, s := range ep.peerFIFOs {
				ep.w.fifos.add(s) // a local peer that lived at the close: should it die, let go of these
			}
			ep.peerFIFOs = nil
		}
		time.AfterFunc(ep.w.cfg.AbandonGrace, func() {
			_ = ep.w.submit(func() {
				for _, r := range left {
					r.abandon(why)
				}
			})
		})
	}
	closeFIFOSegs(ep.peerFIFOs) // none, or FIFOs nobody waits on any more
	ep.peerFIFOs = nil
	if dead {
		C.kvx_ucx_ep_free(ep.cep) // the worker, which the C record points to, is gone
	} else {
		C.kvx_ucx_ep_release(ep.cep)
	}
	ep.cep = nil
	ep.handle.Delete()
	delete(ep.w.endpoints, ep)
	close(ep.closed)
}

// Close flushes and disconnects the endpoint, waiting at most until ctx is done; on timeout
// it force-closes instead. Operations still pending complete with an error.
func (ep *Endpoint) Close(ctx context.Context) error {
	return ep.close(ctx, false)
}

// ForceClose drops the endpoint at once (UCP_EP_CLOSE_FLAG_FORCE): pending sends, puts and
// gets complete with an error, its receives are cancelled. This is how a frozen peer is cut
// off: nothing else stops an in-flight send.
func (ep *Endpoint) ForceClose(ctx context.Context) error {
	return ep.close(ctx, true)
}

// ForceCloseDeparted is ForceClose for a peer that has told this process, on a channel
// ordered after everything it sent here (a shared-memory endpoint: every local sender writes
// into this worker's one receive FIFO, read in order), that it sends nothing more: its sends
// ended. A receive the close fails after it matched a message then releases its memory, as
// for a peer UCX reported dead, instead of staying pinned until the worker closes (a live
// peer may still write into it, ForceClose's rule): everything that peer will ever write has
// arrived. The caller vouches for the order; over TCP it does not hold (the message may come
// on another connection than a fragment still on its way), and ForceClose is the one to use.
func (ep *Endpoint) ForceCloseDeparted(ctx context.Context) error {
	if err := ep.w.submit(func() { ep.departed = true }); err != nil {
		return nil // the worker is closing: it closes every endpoint itself
	}
	return ep.close(ctx, true)
}

func (ep *Endpoint) close(ctx context.Context, force bool) error {
	err := ep.w.submit(func() {
		if !ep.released {
			ep.startClose(force, fmt.Errorf("%w: endpoint closed", ErrClosed))
		}
	})
	if err != nil {
		return nil // the worker is closing: it closes every endpoint itself
	}
	select {
	case <-ep.closed:
		return nil
	case <-ep.w.stopped:
		return nil
	case <-ctx.Done():
		if !force {
			// A flush that does not finish in time means the peer stopped answering: cut it
			// off, with the worker's own bound on how long that may take.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ep.w.cfg.CloseTimeout)
			defer cancel()
			if err := ep.close(fctx, true); err != nil {
				return err
			}
		}
		return fmt.Errorf("%w: endpoint close: %w", ErrTimeout, ctx.Err())
	}
}

// Info returns the endpoint's lanes and the transport of each (ucp_ep_print_info), e.g. to
// check that loopback really uses shared memory.
func (ep *Endpoint) Info(ctx context.Context) (string, error) {
	var s string
	var err error
	callErr := ep.w.call(ctx, func() {
		if ep.released {
			err = ErrClosed
			return
		}
		p := C.kvx_ucx_ep_info(ep.cep)
		s = C.GoString(p)
		C.free(unsafe.Pointer(p))
	})
	if callErr != nil {
		return "", callErr
	}
	return s, err
}
