// SPDX-License-Identifier: Apache-2.0

package transfer

// The staging path: every chunk goes through a staging slot of the engine's pool. The sender
// gathers a chunk from the caller's blocks into a slot (the Mover) behind a data header and
// sends it; the receiver receives it into a slot, checks the header and scatters the payload
// into its blocks. Each side holds up to PipelineDepth slots, each slot in one stage at a time:
// with the mover (gather or scatter, on the engine's mover workers, mover_pool.go) or with the
// transport (send or receive). The stages of different slots overlap: while chunk i is on the
// wire, chunk i+1 is gathered and, on the receiver, chunk i-1 scattered, and the transfer's
// loop only posts and settles. A slot goes back to the pool only once its operation is final
// and the mover is done with it.

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// stagingSend is the sending side of the staging path.
type stagingSend struct{ x *xfer }

// stagingReceive is the receiving side of the staging path.
type stagingReceive struct{ x *xfer }

var (
	_ stagedPath = stagingSend{}
	_ stagedPath = stagingReceive{}
	_ path       = stagingSend{}
	_ path       = stagingReceive{}
)

// startStagingSend leases the sender's slots and posts the first chunks, answering a request
// for the pull wire first (path_pull.go). It reports false, having told the receiver, if the
// transfer ended before it had a slot.
func (x *xfer) startStagingSend(ri *wire.RequestInfo) bool {
	first, ok := x.lease(stagingSend{x})
	if !ok {
		x.stoppedBeforeStart("could lease a staging slot")
		return false
	}
	if ri.Flags&wire.FlagPull != 0 && !x.answerPull() {
		releaseSlot(first)
		return true // aborting: the loop resolves it
	}
	slots := x.extraSlots(first)
	for i, s := range slots {
		if !x.path.post(s) {
			releaseAll(slots[i+1:]) // never posted
			break
		}
	}
	return true
}

// runReceiveStaging is runReceive on the staging path: receives posted into leased slots,
// then the request.
func (x *xfer) runReceiveStaging() {
	first, ok := x.lease(stagingReceive{x})
	if !ok {
		return
	}
	x.setChunks(x.payloadCap(), x.stream)
	if x.layerCut {
		x.recvSeen = make([]bool, x.nChunks)
	}
	slots := x.extraSlots(first)
	if x.pullWanted() {
		x.runReceivePull(slots) // path_pull.go
		return
	}
	x.postAndAsk(slots)
	x.loop()
}

func (stagingSend) kind() Path    { return PathStaging }
func (stagingReceive) kind() Path { return PathStaging }

// post gathers the next chunk into slot and posts it, or releases the slot when every chunk
// is posted. It returns false if the transfer is aborting.
func (p stagingSend) post(slot *buffer.Slot) bool {
	x := p.x
	if x.nextSeq >= x.nChunks || x.aborting {
		releaseSlot(slot)
		return !x.aborting
	}
	off, n := x.chunkRange(x.nextSeq)
	if off+n > x.readyBytes {
		if err := x.refreshReady(); err != nil {
			releaseSlot(slot)
			x.abort(err, wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
			return false
		}
		if off+n > x.readyBytes { // wait for the model, not the wire
			x.idle = append(x.idle, slot)
			return true
		}
	}
	rec := x.stagingRec(x.nextSeq, slot)
	rec.off, rec.buf = off, slot.Bytes()[wire.DataHeaderBytes:wire.DataHeaderBytes+n]
	x.nextSeq++ // taken now: the chunk is sent when its gather ends (moved)
	x.toMover(rec)
	return true
}

// moved sends a gathered chunk behind its data header.
func (p stagingSend) moved(rec *opRec) {
	x := p.x
	buf := x.stampChunk(rec)
	id, err := x.eng.tr.PostSend(x.peer, x.tag(rec.seq), buf, rec.done)
	if err != nil {
		releaseSlot(rec.slot)
		x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		return
	}
	x.trackStaging(rec, id)
}

// stampChunk writes the data header of a gathered chunk in front of its payload and returns
// the chunk as it goes on the wire: header and payload.
func (x *xfer) stampChunk(rec *opRec) []byte {
	n := int64(len(rec.buf))
	buf := rec.slot.Bytes()[:wire.DataHeaderBytes+n]
	dh := wire.DataHeader{Header: x.head(), Seq: uint32(rec.seq), Offset: rec.off, Length: n}
	_, _ = dh.AppendBinary(buf[:0])
	return buf
}

func (p stagingSend) completed(rec *opRec, _ transport.Completion) {
	p.x.spare = append(p.x.spare, rec) // its op is final and handled: the slot's next chunk takes it
	p.x.sentChunk(rec)
}

// post posts the receive of the next chunk into slot, or releases the slot when every chunk
// is posted. It returns false if the transfer is aborting.
func (p stagingReceive) post(slot *buffer.Slot) bool {
	x := p.x
	if x.nextSeq >= x.nChunks || x.aborting {
		releaseSlot(slot)
		return !x.aborting
	}
	return p.postChunk(slot)
}

// postChunk posts the receive of chunk x.nextSeq into slot (there is one). It returns false,
// having aborted the transfer, if the post fails.
func (p stagingReceive) postChunk(slot *buffer.Slot) bool {
	x := p.x
	rec := x.stagingRec(x.nextSeq, slot)
	_, n := x.chunkRange(rec.seq)
	buf := slot.Bytes()[:wire.DataHeaderBytes+n]
	id, err := x.eng.tr.PostRecv(x.peer, x.tag(rec.seq), buf, rec.done)
	if err != nil {
		releaseSlot(slot) // never posted: the transport never saw it
		x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		return false
	}
	x.trackStaging(rec, id)
	x.nextSeq++
	return true
}

// completed checks a received chunk's header and hands its payload to the mover to scatter.
func (p stagingReceive) completed(rec *opRec, c transport.Completion) {
	if p.x.checkChunk(rec, rec.slot.Bytes()[:c.Bytes]) {
		p.x.toMover(rec)
	}
}

// checkChunk checks the data header of the chunk received into rec's slot (b, header and
// payload) and points rec at its payload for the scatter. A chunk that is not this transfer's
// seq rec.seq releases the slot and fails the transfer as a protocol error.
func (x *xfer) checkChunk(rec *opRec, b []byte) bool {
	dh, payload, err := wire.DecodeData(b)
	off, n := x.chunkRange(rec.seq)
	if err == nil && (dh.Request != x.h.id || dh.Sub != x.wireSub || dh.Nonce != x.nonce || int(dh.Seq) != rec.seq || dh.Offset != off || dh.Length != n) {
		err = fmt.Errorf("chunk header %+v does not match seq %d at offset %d, %d bytes", dh, rec.seq, off, n)
	}
	if err != nil {
		releaseSlot(rec.slot)
		x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%w: %w", ErrProtocol, err)}, wire.AbortProtocol, x.eng.cfg.Tuning.CancelGrace)
		return false
	}
	rec.off, rec.buf = off, payload
	return true
}

// moved counts a scattered chunk and reuses its slot for the next receive.
func (p stagingReceive) moved(rec *opRec) {
	x := p.x
	x.progress(int64(len(rec.buf)))
	x.markReceived(rec.seq)
	x.spare = append(x.spare, rec) // its op is final and handled: the slot's next chunk takes it
	if !p.post(rec.slot) {
		return
	}
	x.receivedAll()
}

// toMover queues rec's copy on the engine's mover workers; its slot is the mover's until the
// copy's event comes back (movedDone).
func (x *xfer) toMover(rec *opRec) {
	x.moving++
	if x.readsPeer(rec) {
		x.movingPeer++
	}
	x.eng.movers.submit(x, rec)
}

// readsPeer reports whether rec's copy reads the peer's memory in place (RMA ranges, or a
// pulled chunk scattered straight out of the sender's slot), which a cancelling receiver's
// abort must wait for; a scatter out of its own slot touches nothing of the sender's.
func (x *xfer) readsPeer(rec *opRec) bool { return rec.batch != nil || rec.inPlace || rec.share != nil }

// move runs on a mover worker: it copies rec's chunk and hands the result to the loop.
func (x *xfer) move(rec *opRec) {
	switch {
	case rec.share != nil: // a short request's ranges read in place, taken one by one (rma_inplace.go)
		rec.batch, rec.moveErr = rec.share.run()
	case rec.batch != nil && rec.vec != nil: // small pieces read in place (rma_vector.go)
		rec.moveErr = copyPieces(rec.vec, x.plan, rec.buf, x.pool, rec.batch)
	case rec.batch != nil: // RMA ranges read in place (rma_inplace.go): plain copies
		for _, g := range rec.batch {
			x.eng.copyFromPeer(x.pool[g.dst:g.dst+g.n], rec.buf[g.src:g.src+g.n])
		}
	case x.receive:
		rec.moveErr = x.mover.Scatter(x.plan, rec.buf, rec.off)
	default:
		rec.moveErr = x.mover.Gather(x.plan, rec.off, rec.buf)
	}
	x.box.Push(event{op: rec, moved: true})
}

// movedDone settles a copy that ended: a failed one fails the transfer (and poisons what the
// mover cannot say it let go, moverFailed); on an aborting transfer the slot goes back; else
// the path sends or counts the chunk.
func (x *xfer) movedDone(rec *opRec) {
	x.moving--
	err := rec.moveErr
	rec.moveErr = nil
	if x.readsPeer(rec) && !errors.Is(err, ErrQuiescenceUnknown) {
		x.movingPeer-- // a copy that may still read keeps the abort held until quarantine
	}
	if rec.unmap != nil && !errors.Is(err, ErrQuiescenceUnknown) { // a copy that may still read keeps its view for good
		rec.unmap()
		rec.unmap = nil
	}
	switch {
	case err != nil:
		x.moverFailed(rec.slot, rec.seq, err)
		what := "gather"
		if x.receive {
			what = "scatter"
		}
		if !x.aborting {
			x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%s: %w", what, err)}, wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		} else {
			x.maybeResolve()
		}
	case x.aborting:
		if x.drainAhead(rec.slot) {
			return
		}
		releaseSlot(rec.slot)
		x.maybeResolve()
	default:
		x.path.(stagedPath).moved(rec)
	}
}

// drainAhead is for a staging receiver that aborted with no receive outstanding (every slot was
// scattering, or its receives had taken their chunks before the abort's cancels reached the
// transport): its sender, a pipeline ahead, may have sent the next chunks, and no receive will
// take them. UCX keeps such a send for ever and cannot cancel it; only a receive that is
// cancelled, or that a message matched before its cancel, has the transport drain the chunks at
// and past it (UCX's drains). So the receive of the next chunk goes into slot, whose scatter (or
// receive) just ended, and is cancelled at once: the sender's sends end, instead of stranding it
// into quarantine and its slots into poison. Once per transfer; not when the peer was lost or the
// engine closes (as takeDeclined). It reports whether it took the slot.
func (x *xfer) drainAhead(slot *buffer.Slot) bool {
	p, ok := x.path.(stagingReceive)
	if !ok || x.drainPosted || x.outstanding > 0 || x.nextSeq >= x.nChunks ||
		errors.Is(x.cause, ErrPeerLost) || errors.Is(x.cause, ErrClosed) {
		return false
	}
	x.drainPosted = true
	if !p.postChunk(slot) { // released the slot; the abort it asks for is under way
		x.maybeResolve()
		return true
	}
	for _, op := range x.ops {
		if !op.final && op.slot == slot {
			x.eng.tr.Cancel(op.id)
		}
	}
	// The abort found nothing outstanding and set no clock; this receive needs one as any
	// abort's operations do: a message that matched it before its cancel (a frozen peer's)
	// may never end, and the transfer must quarantine, then poison the slot (L9, L11).
	if !x.quarantined && x.timers.grace.IsZero() {
		x.timers.grace = time.Now().Add(x.eng.cfg.Tuning.CancelGrace)
	}
	return true
}

// stagingRec is the record of chunk seq's operation in slot: one the transfer used before and
// is done with (x.spare), or a new one with its completion callback, so a staging transfer
// allocates a record per pipeline place, not per chunk. A record is reused only once its
// previous operation had its one final completion and the loop handled it (the transport
// reports each operation once, L6).
func (x *xfer) stagingRec(seq int, slot *buffer.Slot) *opRec {
	var rec *opRec
	if k := len(x.spare); k > 0 {
		rec = x.spare[k-1]
		x.spare[k-1] = nil
		x.spare = x.spare[:k-1]
	} else {
		rec = &opRec{final: true} // nothing posted yet: an abort has nothing to cancel
		rec.done = func(c transport.Completion) { x.box.Push(event{op: rec, c: c}) }
	}
	rec.seq, rec.slot, rec.id, rec.off, rec.buf, rec.inPlace = seq, slot, 0, 0, nil, false
	return rec
}

// trackStaging records a staging operation, just posted as id, as outstanding; a reused
// record is in x.ops already.
func (x *xfer) trackStaging(rec *opRec, id transport.OpID) {
	rec.id, rec.final = id, false
	if !rec.listed {
		rec.listed = true
		x.ops = append(x.ops, rec)
	}
	x.outstanding++
}

// postAndAsk posts a staging receive into each of slots, releasing those after a failed post,
// then asks the sender for the transfer, unless the failed post already told it to stop.
func (x *xfer) postAndAsk(slots []*buffer.Slot) {
	for i, s := range slots {
		if !x.path.post(s) {
			releaseAll(slots[i+1:]) // never posted
			break
		}
	}
	if !x.aborting { // a failed post has already told the peer to stop
		x.sendRequestInfo()
	}
}
