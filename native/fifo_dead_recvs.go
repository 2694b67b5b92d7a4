// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

// Receives a frozen local peer's death lets go of (docs/ucx.md, "A frozen peer that is killed
// later").
//
// A receive that UCX failed after it had matched a message, because this side closed the
// endpoint while the peer lived (a frozen peer, force-closed), is suspended (Request.suspend): a
// peer that resumes may still write into it (UCX 1.13 was seen to, over TCP), so its memory
// stays pinned until the worker closes. A local peer's process that has ended writes nothing
// more, and what it wrote before reaches this worker through its own shared-memory receive
// FIFOs, read in order. So the watch lets go of the endpoint's suspended receives, with the
// worker open, in three looks (fifoWatchEvery apart, each as the worker goes idle): one sees
// the process gone; a later one sees no element of this worker's FIFOs claimed and unwritten,
// so every element the dead process claimed has been written; and the next one comes after a
// progress that found no written element unread (UCX's shared-memory progress reads every
// element whose owner bit says written, uct_mm_iface_poll_fifo), so all of them have been read.
// A receive UCX fails later on that endpoint (its rendezvous purged once the dead peer's FIFO
// was emptied) is released at once, as for a peer UCX reported dead. A peer over TCP has no
// such record: its suspended receives stay pinned until the worker closes.

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

// suspectPeer is an endpoint to a local peer with suspended receives: gone, a look found its
// process gone; written, a later look found every element claimed in this worker's FIFOs
// written. Its receives go at the look after that.
type suspectPeer struct {
	ep            *Endpoint
	gone, written bool
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
// watched endpoints, at most every fifoWatchEvery: a peer seen gone, and then every element
// claimed in this worker's own FIFOs written, at two earlier looks has its endpoint's
// suspended receives let go of.
func (w *Worker) pollSuspects() {
	f := &w.fifos
	if len(f.peers) == 0 || !watchDue(&f.nextPeers) {
		return
	}
	keep := f.peers[:0]
	for _, s := range f.peers {
		p := s.ep.peerProc
		switch {
		case !s.gone:
			s.gone = (&peerFIFOSeg{pid: p.pid, started: p.started}).gone()
			keep = append(keep, s)
		case !s.written:
			s.written = w.ownFIFO.written(p.posix, p.sysv)
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

// written (loop only) reports whether every element claimed so far in this worker's own FIFOs
// of the transports asked for has been written: each is looked up and no element of it waits
// claimed and unwritten (fifoUnwritten). A FIFO that cannot be looked at is not.
func (o *ownFIFOs) written(posix, sysv bool) bool {
	return (!posix || o.posix.written()) && (!sysv || o.sysv.written())
}

func (o *ownFIFO) written() bool {
	if !o.set || o.seg == nil || o.b == nil {
		return false
	}
	idx, head, ok := fifoUnwritten(mappingOf(o.b), o.seg.pid, o.size, o.elem)
	return ok && idx == head
}
