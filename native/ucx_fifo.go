// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include "ucx_fifo.h"
*/
import "C"

import (
	"cmp"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The shared-memory receive FIFOs UCX leaves stuck when a local peer dies (docs/ucx.md): a
// dead peer's FIFO, which UCX's flush of an endpoint to it waits on, and this worker's own,
// which a peer killed in the middle of a write leaves at an element nobody will finish.

// fifoSizeOnce is shmFIFOSize as the process's contexts run with it: UCX takes it from the
// environment, which the first context sets (NewContext) and later ones keep.
var fifoSizeOnce = sync.OnceValue(shmFIFOSize)

// releaseDeadPeerFIFO (loop only) empties the shared-memory receive FIFOs of a peer whose
// process has ended. UCX completes the requests of a failed or force-closed endpoint (its
// sends, and the receives that matched a rendezvous of the peer's) only once its flush of the
// endpoint's lanes has, and the flush of a shared-memory lane waits for room in the peer's
// FIFO: a dead peer's stays full for good (its reader is gone), and the requests then stay
// with UCX, their memory pinned, until the worker closes (docs/ucx.md, "Sends to a killed
// shared-memory peer"). With the FIFO's tail moved to its head the flush completes, and UCX
// fails the requests. Both FIFOs a lane may write into are emptied, posix's and sysv's. A live
// peer's FIFO is never touched (a frozen one resumes reading it), nor a block that is not the
// dead pid's.
func (ep *Endpoint) releaseDeadPeerFIFO() {
	keep := ep.peerFIFOs[:0]
	for _, s := range ep.peerFIFOs {
		if !s.gone() {
			keep = append(keep, s)
			continue
		}
		ep.w.emptyDeadFIFO(s) // the process is gone for good: once is enough
		s.close()
	}
	clear(ep.peerFIFOs[len(keep):])
	ep.peerFIFOs = keep
}

// emptyDeadFIFO (loop only) empties the FIFO of s, a peer whose process is gone, through a
// mapping of its own: the sysv segment s holds attached, or a mapping of the posix file.
func (w *Worker) emptyDeadFIFO(s *peerFIFOSeg) {
	b, release, err := s.view()
	if err != nil {
		w.log.Warn("ucx: cannot map a dead shared-memory peer's FIFO to empty it", zap.Int("pid", s.pid), zap.Error(err))
		return
	}
	defer release()
	if n, ok := fifoRelease(mappingOf(b), s.pid, uint64(fifoSizeOnce())); ok && n > 0 {
		w.log.Info("ucx: emptied the receive FIFO of a dead shared-memory peer", zap.Int("pid", s.pid),
			zap.String("transport", cmp.Or(s.transport, "posix")), zap.Uint64("unread", n))
	}
}

// closeFIFOs (loop only, the worker destroyed) lets go of every FIFO segment it holds open.
func (w *Worker) closeFIFOs() {
	w.fifos.close()
	w.ownFIFO.close()
}

// fifoRelease moves the tail of the FIFO whose segment is mapped at m to its head, if m holds
// the FIFO control block of pid (kvx_ucx_mm_fifo_release): ok, and how many elements were unread.
func fifoRelease(m mapping, pid int, size uint64) (unread uint64, ok bool) {
	var n C.uint64_t
	r := C.kvx_ucx_mm_fifo_release(C.uintptr_t(m.base), C.size_t(m.len), C.int32_t(pid), C.uint64_t(size), &n)
	return uint64(n), r == C.KVX_FIFO_OK
}

// watchFIFOs (loop only, as the worker goes idle) runs the watch of dead peers' FIFOs, the
// look at this worker's own, and the watch of suspended receives' peers.
func (w *Worker) watchFIFOs() {
	w.fifos.poll(w.emptyDeadFIFO)
	w.ownFIFO.poll(w)
	w.pollSuspects()
}

// fifoStuckAfter is how long an element of this worker's FIFO must stay claimed and unwritten,
// with no process that maps the FIFO paused, before the worker writes it itself: a running
// writer writes an element a few instructions after it claims it.
const fifoStuckAfter = 2 * time.Second

// fifoPausedEvery is how often the look goes on while a paused process maps the FIFO.
const fifoPausedEvery = 5 * time.Second

// fifoFillAMID is the active message id of the empty message written into an element a dead
// writer left: one no UCP protocol uses (UCX 1.13 uses 0-26, 1.22 0-28, of UCT's 32), which
// UCT hands to its stub handler (a warning, nothing else).
const fifoFillAMID = 31

// ownFIFOs (loop-owned) are the looks at this worker's own receive FIFOs: posix's, and sysv's,
// which local peers write into wherever UCX gives their endpoints' active messages to sysv.
type ownFIFOs struct{ posix, sysv ownFIFO }

func (o *ownFIFOs) poll(w *Worker) {
	o.posix.poll(w, recordPeerFIFO, "posix")
	o.sysv.poll(w, recordPeerSysvFIFO, "sysv")
}

func (o *ownFIFOs) close() {
	o.posix.close()
	o.sysv.close()
}

// ownFIFO (loop-owned) looks at one of this worker's own shared-memory receive FIFOs for the
// wedge a local peer killed between claiming an element and writing it leaves: the worker
// reads in order and waits at that element for good, so nothing more arrives over shared
// memory from anyone (docs/ucx.md, "A killed local peer can wedge the survivor's shared-memory
// receive queue"). When the same element has stayed claimed and unwritten for fifoStuckAfter
// and no process that maps the FIFO is stopped (which could resume and finish the write), the
// writer is gone: the worker writes the element as an empty message and reads on.
type ownFIFO struct {
	set        bool // looked up (seg and b valid when found)
	seg        *peerFIFOSeg
	b          []byte // the FIFO segment, mapped or attached by this package (UCX's own mapping is UCX's)
	release    func() // lets go of b (peerFIFOSeg.view)
	size, elem uint64
	next       time.Time // the next look (fifoWatchEvery)
	stuck      uint64    // the element seen claimed and unwritten since since
	since      time.Time
	paused     bool // a look found a process that maps the FIFO paused (logged once)
}

// poll looks at the FIFO record finds in this worker's address (recordPeerFIFO or
// recordPeerSysvFIFO), if it is time.
func (o *ownFIFO) poll(w *Worker, record func(addr, local []byte) *peerFIFOSeg, transport string) {
	if o.set && o.seg == nil {
		return // no FIFO of ours of this transport to look at
	}
	now := time.Now()
	if now.Before(o.next) {
		return
	}
	o.next = now.Add(fifoWatchEvery)
	if !o.set {
		o.set = true
		o.size, o.elem = uint64(fifoSizeOnce()), uint64(shmFIFOElemSize())
		if o.seg = record(w.address, w.address); o.seg == nil || o.size == 0 || o.elem == 0 {
			o.close()
			return
		}
		var err error
		if o.b, o.release, err = o.seg.view(); err != nil {
			o.close()
			return
		}
	}
	idx, head, ok := fifoUnwritten(mappingOf(o.b), o.seg.pid, o.size, o.elem)
	if !ok || idx == head {
		o.since, o.paused = time.Time{}, false
		return
	}
	if o.since.IsZero() || idx != o.stuck {
		o.stuck, o.since, o.paused = idx, now, false
		return
	}
	if now.Sub(o.since) < fifoStuckAfter {
		return
	}
	if who, err := o.seg.pausedMapper(); err != nil || who != 0 {
		o.next = now.Add(fifoPausedEvery) // reading every process's maps is not for every 250 ms
		if !o.paused {
			o.paused = true
			w.log.Warn("ucx: this worker's shared-memory receive FIFO waits at an element a writer claimed and has not written; "+
				"a process that maps it is paused and may finish it, so it is left alone", zap.String("transport", transport),
				zap.Uint64("element", idx), zap.Duration("for", now.Sub(o.since)), zap.Int("paused pid", who), zap.Error(err))
		}
		return
	}
	if !fifoFill(mappingOf(o.b), o.seg.pid, o.size, o.elem, idx) {
		return
	}
	w.fifoFills.Add(1)
	w.log.Warn("ucx: wrote an element of this worker's shared-memory receive FIFO that a writer claimed and never wrote "+
		"(a local peer killed in the middle of a message): the worker reads on", zap.String("transport", transport),
		zap.Uint64("element", idx), zap.Uint64("head", head), zap.Duration("stuck for", now.Sub(o.since)))
	o.since = time.Time{}
}

// close unmaps the FIFO and lets go of its file (or detaches the sysv segment); the look is
// over for good.
func (o *ownFIFO) close() {
	if o.release != nil {
		o.release()
	}
	o.b, o.release = nil, nil
	o.seg.close()
	o.set, o.seg = true, nil
}

// fifoUnwritten is kvx_ucx_mm_fifo_unwritten: the first element of the FIFO at m claimed and
// not yet written, or head when there is none.
func fifoUnwritten(m mapping, pid int, size, elem uint64) (index, head uint64, ok bool) {
	var i, h C.uint64_t
	r := C.kvx_ucx_mm_fifo_unwritten(C.uintptr_t(m.base), C.size_t(m.len), C.int32_t(pid), C.uint64_t(size), C.uint64_t(elem), &i, &h)
	return uint64(i), uint64(h), r == C.KVX_FIFO_OK
}

// fifoFill is kvx_ucx_mm_fifo_fill with fifoFillAMID.
func fifoFill(m mapping, pid int, size, elem, index uint64) bool {
	return C.kvx_ucx_mm_fifo_fill(C.uintptr_t(m.base), C.size_t(m.len), C.int32_t(pid), C.uint64_t(size), C.uint64_t(elem),
		C.uint64_t(index), fifoFillAMID) == C.KVX_FIFO_OK
}
