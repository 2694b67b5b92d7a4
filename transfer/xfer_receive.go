// SPDX-License-Identifier: Apache-2.0

package transfer

// The receiving side of a sub-transfer: request the blocks, post receives into staging slots,
// scatter each chunk. xfer.go has what both sides share: the loop, timers, abort, quarantine.

import (
	"fmt"

	"github.com/kvxfer/kvxfer/buffer"
	"go.uber.org/zap"
)

func (x *xfer) runReceive() {
	if !x.meet() { // negotiate.go: the peer speaks what the request needs
		return
	}
	if !x.reserveTags() {
		return
	}
	if x.directCapable() && x.peerHas(FeatureDirect) {
		x.runReceiveDirect()
		return
	}
	first, ok := x.lease()
	if !ok {
		return
	}
	x.setChunks(x.payloadCap(), x.stream)
	if x.layerCut {
		x.recvSeen = make([]bool, x.nChunks)
	}
	slots := x.extraSlots(first)
	for i, s := range slots {
		if !x.postRecv(s) {
			releaseAll(slots[i+1:]) // never posted
			break
		}
	}
	if !x.aborting { // a failed post has already told the peer to stop
		x.sendRequestInfo()
	}
	x.loop()
}

// runReceiveDirect is runReceive on the one-copy path: receives posted straight into the
// pool, PipelineDepth of them, and a request that says so.
func (x *xfer) runReceiveDirect() {
	if !x.startDirect() {
		return
	}
	x.direct = true
	elem := x.plan.Layout().ElemSize
	x.setChunks(x.eng.cfg.DirectChunkBytes/elem*elem, x.stream)
	if x.layerCut {
		x.recvSeen = make([]bool, x.nChunks)
	}
	if x.rmaAsk() { // rma.go: nothing is posted until the sender answers
		x.loop()
		x.rmaEnd()
		return
	}
	x.postRecvsAhead()
	if !x.aborting {
		x.sendRequestInfo()
	}
	x.loop()
}

func (x *xfer) sendRequestInfo() {
	ri := &RequestInfo{Header: x.head(), Shape: x.plan.Shape(),
		ChunkBytes: x.chunk, Depth: int64(x.eng.cfg.PipelineDepth), Held: x.held, HeldOf: x.heldOf}
	if x.layerCut {
		ri.Flags |= FlagLayerCut
	}
	if x.direct {
		ri.Flags |= FlagDirect
	}
	if !x.rmaRequest(ri) {
		return
	}
	if err := x.eng.tr.SendControl(x.peer, encode(ri)); err != nil {
		x.log().Debug("request-info not sent; will retry", zap.Error(err))
	}
}

// postRecv posts the receive of the next chunk into slot, or releases the slot when every
// chunk is posted. It returns false if the transfer is aborting.
func (x *xfer) postRecv(slot *buffer.Slot) bool {
	if x.direct {
		return x.postRecvDirect()
	}
	if x.nextSeq >= x.nChunks || x.aborting {
		releaseSlot(slot)
		return !x.aborting
	}
	rec := &opRec{seq: x.nextSeq, slot: slot}
	_, n := x.chunkRange(rec.seq)
	buf := slot.Bytes()[:DataHeaderBytes+n]
	id, err := x.eng.tr.PostRecv(x.peer, x.tag(rec.seq), buf,
		func(c Completion) { x.box.Push(event{op: rec, c: c}) })
	if err != nil {
		releaseSlot(slot) // never posted: the transport never saw it
		x.abort(transportErr(err), AbortInternal, x.eng.cfg.CancelGrace)
		return false
	}
	x.posted(rec, id)
	return true
}

func (x *xfer) receivedChunk(rec *opRec, c Completion) {
	dh, payload, err := DecodeData(rec.slot.Bytes()[:c.Bytes])
	off, n := x.chunkRange(rec.seq)
	if err == nil && (dh.Request != x.h.id || dh.Sub != x.wireSub || dh.Nonce != x.nonce || int(dh.Seq) != rec.seq || dh.Offset != off || dh.Length != n) {
		err = fmt.Errorf("chunk header %+v does not match seq %d at offset %d, %d bytes", dh, rec.seq, off, n)
	}
	if err != nil {
		releaseSlot(rec.slot)
		x.abort(&RequestError{ID: x.h.id, Err: fmt.Errorf("%w: %w", ErrProtocol, err)}, AbortProtocol, x.eng.cfg.CancelGrace)
		return
	}
	if err := x.mover.Scatter(x.plan, payload, off); err != nil {
		x.moverFailed(rec.slot, rec.seq, err)
		x.abort(&RequestError{ID: x.h.id, Err: fmt.Errorf("scatter: %w", err)}, AbortInternal, x.eng.cfg.CancelGrace)
		return
	}
	x.progress(n)
	x.markReceived(rec.seq)
	if !x.postRecv(rec.slot) {
		return
	}
	x.receivedAll()
}

// receivedAll completes a receive once its last chunk has landed, on whichever path it ran
// (staging, direct, RMA): every layer is ready, the sender is told (Done), the handle ends.
func (x *xfer) receivedAll() {
	if x.moved != x.nChunks {
		return
	}
	x.layersReady.Store(x.plan.Selection().Layers())
	_ = x.eng.tr.SendControl(x.peer, encode(&Done{Header: x.head(), Bytes: x.plan.Bytes()}))
	x.finish(EvComplete, nil)
}

// markReceived advances the scattered prefix of a streaming Receive and publishes the layers
// it covers.
func (x *xfer) markReceived(seq int) {
	if x.recvSeen == nil {
		return
	}
	x.recvSeen[seq] = true
	for x.recvPrefix < x.nChunks && x.recvSeen[x.recvPrefix] {
		x.recvPrefix++
	}
	if x.recvPrefix > 0 {
		off, n := x.chunkRange(x.recvPrefix - 1)
		x.layersReady.Store((off + n) / x.perLayer)
	}
}
