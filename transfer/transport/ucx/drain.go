// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

// Drain receives: what takes a late message of a cancelled UCX receive (Config.drainTimeout).

import (
	"errors"
	"time"

	"github.com/kvxfer/kvxfer/native"
)

// ucxDrain is one drain receive and the timer that cancels it.
type ucxDrain struct {
	tag   uint64
	req   *native.Request
	timer *time.Timer
}

// drainCounters counts the drain receives of a ucxTransport (see Config.drainTimeout).
type drainCounters struct {
	Started uint64 // drains posted for cancelled receives
	Drained uint64 // drains that took a late message, completing its sender's request
	Expired uint64 // drains cancelled at drainTimeout (or replaced by a live receive) unused
	Skipped uint64 // drains not posted because maxDrains were live
	Live    int    // drains posted now
}

// startDrainLocked posts a drain receive for the tag of a receive that was cancelled before
// any message matched it. Its sender may still send that message (it had not yet heard of the
// abort, or it was stopped and has just resumed): UCX 1.13 never completes a rendezvous send
// that no receive matches, and cannot cancel one, so the sender's slot would stay pinned until
// its quarantine poisoned it. The drain matches the late message into the transport's own
// memory (truncated: the bytes are not wanted), which completes the send at the sender with
// its memory released; the cancelled receive's buffer is never written. A drain ends when it
// matches, when a receive of the same tags is posted again (a caller that does not reserve
// tags), or after drainTimeout; while it lasts, ReserveTags refuses its hash.
func (t *ucxTransport) startDrainLocked(tag uint64) {
	family := t.drains[tag&^ucxSeqMask]
	if family[tag] != nil {
		return
	}
	if _, live := t.recvTag[tag]; live {
		return // a live receive takes the message
	}
	if len(t.drainByReq) >= t.cfg.maxDrains {
		t.drainStats.Skipped++
		return
	}
	req := t.w.TagRecvBytes(nil, ucxDrainBytes, tag, ^uint64(0))
	d := &ucxDrain{tag: tag, req: req}
	if family == nil {
		family = map[uint64]*ucxDrain{}
		t.drains[tag&^ucxSeqMask] = family
	}
	family[tag] = d
	t.drainByReq[req] = d
	t.drainStats.Started++
	d.timer = time.AfterFunc(t.cfg.drainTimeout, func() { req.Cancel() })
}

// retireDrainLocked cancels the drains of the transfer tag belongs to at and past its chunk,
// because a live receive now wants those tags (posted by a caller that did not reserve them:
// the engine reserves, and ReserveTags refuses a drained hash): the worker runs the cancels
// before that receive's post, so its chunks reach its own receives, not a drain left from an
// earlier transfer (a stale message a drain already took stays the drain's). A new transfer
// starts at chunk 0 and retires them all. The drains below it stay: an aborting staging
// receiver posts (and cancels at once) the receive of its next chunk to drain what its sender
// sent past it, and retiring the drain of an earlier chunk the sender had not sent yet
// stranded that send.
func (t *ucxTransport) retireDrainLocked(tag uint64) {
	family := t.drains[tag&^ucxSeqMask]
	for dt, d := range family {
		if dt&ucxSeqMask >= tag&ucxSeqMask {
			delete(family, dt)
			d.timer.Stop()
			d.req.Cancel()
		}
	}
	if family != nil && len(family) == 0 {
		delete(t.drains, tag&^ucxSeqMask)
	}
}

// drainDoneLocked forgets a drain UCX has reported on. One that took a message drains
// drainAhead chunks past it too: the send it completed freed its sender's slot, and a sender
// that has not heard of the abort yet sends its next chunk from it, past the drains the cancel
// started (a staging sender on a loaded host ran a pipeline past them, and its last send
// stranded into a poisoned slot). Not once a live receive retired the drain's transfer.
func (t *ucxTransport) drainDoneLocked(d *ucxDrain) {
	delete(t.drainByReq, d.req)
	retired := true
	if family := t.drains[d.tag&^ucxSeqMask]; family[d.tag] == d {
		retired = false
		delete(family, d.tag)
		if len(family) == 0 {
			delete(t.drains, d.tag&^ucxSeqMask)
		}
	}
	d.timer.Stop()
	if d.req.Err() != nil && !errors.Is(d.req.Err(), native.ErrTruncated) {
		t.drainStats.Expired++
		return
	}
	t.drainStats.Drained++
	if retired || t.closed {
		return
	}
	for k := range uint64(t.cfg.drainAhead) {
		if seq := d.tag&ucxSeqMask + k + 1; seq <= ucxSeqMask {
			t.startDrainLocked(d.tag&^ucxSeqMask | seq)
		}
	}
}

// drainSnapshot returns the drain counters (see Config.drainTimeout). It never blocks on UCX.
func (t *ucxTransport) drainSnapshot() drainCounters {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.drainStats
	s.Live = len(t.drainByReq)
	return s
}
