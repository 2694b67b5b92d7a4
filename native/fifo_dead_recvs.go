// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import "time"

// Receives a frozen local peer's death lets go of (docs/ucx.md, "A frozen peer that is killed
// later").
//
// A receive that UCX failed after it had matched a message, because this side closed the
// endpoint while the peer lived (a frozen peer, force-closed), is suspended (Request.suspend): a
// peer that resumes may still write into it (UCX 1.13 was seen to, over TCP), so its memory
// stays pinned until the worker closes. A local peer's process that has ended writes nothing
// more, and what it wrote before reaches this worker through its own shared-memory receive
// FIFOs, read in order: once the process is seen gone, and at a later look this worker has
// read every element written to its FIFOs (it went idle, its progress finding none to read,
// and no element waits claimed and unwritten), nothing of that peer can reach the receive any
// more. The watch then lets go of the endpoint's suspended receives, with the worker open, and
// a receive UCX fails later on that endpoint (purged once the dead peer's FIFO was emptied) is
// released at once, as for a peer UCX reported dead. A peer over TCP has no such record: its
// suspended receives stay pinned until the worker closes.

// localProc is a local peer's process as its FIFO records name it at Connect (the kernel's
// view: procfs, IPC_STAT), and which of this worker's own FIFOs it writes into.
type localProc struct {
	pid         int
	started     uint64 // the process's start time: a reused pid is another process
	posix, sysv bool   // it has a FIFO of that transport, so it may write into ours
}

// localProcOf is the process segs (recordPeerFIFOs) name, or nil where there is none.
func localProcOf(segs []*peerFIFOSeg) *localProc {
	var p *localProc
	for _, s := range segs {
		if p == nil {
			p = &localProc{pid: s.pid, started: s.started}
		}
		if s.pid != p.pid || s.started != p.started {
			return nil // two processes: the records disagree, none is trusted
		}
		if s.transport == "sysv" {
			p.sysv = true
		} else {
			p.posix = true
		}
	}
	return p
}

// suspectPeer is an endpoint to a local peer with suspended receives.
type suspectPeer struct {
	ep   *Endpoint
	gone bool // a look found the process gone; its receives go at a later look
}

// watchSuspect (loop only) watches the endpoint of a receive just suspended, once, where its
// peer is a local process.
func (w *Worker) watchSuspect(ep *Endpoint) {
	if ep == nil || ep.peerProc == nil || ep.suspectWatched {
		return
	}
	ep.suspectWatched = true
	w.fifos.peers = append(w.fifos.peers, &suspectPeer{ep: ep})
}

// pollSuspects (loop only, as the worker goes idle, after watchFIFOs' looks) looks at the
// watched endpoints, at most every fifoWatchEvery: a peer seen gone at an earlier look, with
// this worker's own FIFOs drained now, has its endpoint's suspended receives let go of.
func (w *Worker) pollSuspects() {
	f := &w.fifos
	if len(f.peers) == 0 {
		return
	}
	now := time.Now()
	if now.Before(f.nextPeers) {
		return
	}
	f.nextPeers = now.Add(fifoWatchEvery)
	keep := f.peers[:0]
	for _, s := range f.peers {
		p := s.ep.peerProc
		switch {
		case !s.gone:
			s.gone = (&peerFIFOSeg{pid: p.pid, started: p.started}).gone()
			keep = append(keep, s)
		case !w.ownFIFO.drained(p.posix, p.sysv):
			keep = append(keep, s)
		default:
			s.ep.peerGone = true
			for r := range w.suspects {
				if r.ep == s.ep {
					delete(w.suspects, r)
					r.settleSuspect()
				}
			}
		}
	}
	clear(f.peers[len(keep):])
	f.peers = keep
}

// drained (loop only, as the worker goes idle) reports whether every element written to this
// worker's own FIFOs of the transports asked for has been read: each is looked up and no
// element of it waits claimed and unwritten (the last progress found none ready to read, so
// the reader is at the head). A FIFO that cannot be looked at is not drained.
func (o *ownFIFOs) drained(posix, sysv bool) bool {
	return (!posix || o.posix.drained()) && (!sysv || o.sysv.drained())
}

func (o *ownFIFO) drained() bool {
	if !o.set || o.seg == nil || o.b == nil {
		return false
	}
	idx, head, ok := fifoUnwritten(mappingOf(o.b), o.seg.pid, o.size, o.elem)
	return ok && idx == head
}
