// SPDX-License-Identifier: Apache-2.0

package transfer

// The direct (one-copy) path: each chunk is one tagged IOV message read straight out of the
// sender's pool and written straight into the receiver's, with no staging slot on either side
// (transport.DirectTransport). The receiver picks it when its transport can reach its pool in place,
// and says so in its request (FlagDirect); the sender follows. The RMA mode (path_rma.go)
// starts from here and falls back to it.

import (
	"fmt"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// directSend is the sending side of the direct path.
type directSend struct {
	x *xfer
	// decline is this sender's encoded refusal of the receiver's RMA request, sent again
	// when a repeated request shows it was lost; nil when none was refused.
	decline []byte
}

// directReceive is the receiving side of the direct path.
type directReceive struct{ x *xfer }

var (
	_ path     = (*directSend)(nil)
	_ peerTalk = (*directSend)(nil)
	_ path     = directReceive{}
)

// startDirect leaves Queued without a slot and puts the transfer on path p: a direct transfer
// holds none (so it needs none to make progress, and the slot accounting of L5 does not see
// it), only one of the engine's MaxConcurrent tokens (L13). It returns false if the transfer
// ended first.
func (x *xfer) startDirect(p path) bool {
	if !x.admit() {
		return false
	}
	if !x.apply(evAdvertise, nil) {
		return false
	}
	x.qcancel() // as lease: starting is no sign of progress (L12)
	x.take(p)
	return true
}

// startDirectSend starts a sender on the direct path the receiver asked for: it offers the
// pool for the receiver's gets when asked to (path_rma.go), or posts the first chunks. It
// reports false, having told the receiver, if the transfer ended before it started.
func (x *xfer) startDirectSend(ri *wire.RequestInfo) bool {
	d := &directSend{x: x}
	if !x.startDirect(d) {
		x.stoppedBeforeStart("started")
		return false
	}
	offered, decline := x.offerRMA(ri)
	if offered { // the receiver reads the pool; nothing to post
		return true
	}
	if x.dev.set() && x.hasMover { // path_device_stage.go: the receiver may ask for staging
		x.take(&deviceDeclined{x: x, decline: decline})
		return true
	}
	if x.dev.set() { // device.go: a device pool without a Mover moves only by gets
		reason := "this sender could not offer its device pool for gets"
		if m, err := wire.Decode(decline); err == nil {
			if o, ok := m.(*wire.RMAOffer); ok {
				reason += ": " + o.Reason
			}
		}
		x.abort(&requestError{ID: x.h.id, Err: &deviceRouteError{Reason: reason}}, wire.AbortIncompatible, x.eng.cfg.Tuning.CancelGrace)
		return true
	}
	d.decline = decline
	d.postAhead()
	return true
}

// runReceiveDirect is runReceive on the one-copy path: receives posted straight into the
// pool, PipelineDepth of them, and a request that says so; or, where the RMA mode may run,
// a request for an offer and nothing posted until it comes (path_rma.go).
func (x *xfer) runReceiveDirect() {
	d := directReceive{x}
	if !x.startDirect(d) {
		return
	}
	elem := x.plan.Layout().ElemSize
	x.setChunks(x.eng.cfg.Tuning.DirectChunkBytes/elem*elem, x.stream)
	if x.layerCut {
		x.recvSeen = make([]bool, x.nChunks)
	}
	if r := x.askRMA(); r != nil {
		x.loop()
		r.end()
		return
	}
	if x.dev.set() { // a device pool is never a host buffer to post receives into
		x.abort(&requestError{ID: x.h.id, Err: &deviceRouteError{Reason: "the rma route cannot run for this request"}},
			wire.AbortIncompatible, x.eng.cfg.Tuning.CancelGrace)
		x.loop()
		return
	}
	d.postAhead()
	if !x.aborting {
		x.sendRequestInfo()
	}
	x.loop()
}

func (*directSend) kind() Path   { return PathDirect }
func (directReceive) kind() Path { return PathDirect }

// postAhead posts the first PipelineDepth chunks.
func (d *directSend) postAhead() {
	for range min(d.x.eng.cfg.Tuning.PipelineDepth, d.x.nChunks) {
		if !d.post(nil) {
			break
		}
	}
}

// post posts the next chunk straight from the pool, or, on a streaming Send whose next chunk
// is not ready, keeps the pipeline place (nil: no slot) for onReady. It returns false if the
// transfer is aborting.
func (d *directSend) post(*buffer.Slot) bool {
	x := d.x
	if x.nextSeq >= x.nChunks || x.aborting {
		return !x.aborting
	}
	off, n := x.chunkRange(x.nextSeq)
	if off+n > x.readyBytes {
		if err := x.refreshReady(); err != nil {
			x.abort(err, wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
			return false
		}
		if off+n > x.readyBytes { // wait for the model; a nil slot marks a direct place
			x.idle = append(x.idle, nil)
			return true
		}
	}
	return x.postDirect(off, n, x.eng.direct.PostSendIOV)
}

func (d *directSend) completed(rec *opRec, _ transport.Completion) { d.x.sentChunk(rec) }

// fromPeer sends a lost decline again: a repeated request still asking for an offer shows
// the receiver waits for an answer.
func (d *directSend) fromPeer(m wire.Message) {
	x := d.x
	if ri, ok := m.(*wire.RequestInfo); ok && d.decline != nil && ri.Flags&wire.FlagRMA != 0 && x.moved == 0 && !x.aborting {
		_ = x.eng.tr.SendControl(x.peer, d.decline)
	}
}

func (*directSend) peerLost() {}

// postAhead posts the first direct receives. They cost no slot, so it posts well ahead of the
// sender: a chunk that arrives before its receive is posted is an unexpected message, which
// UCX handles on a slower path than a matched one. It returns false if the transfer is
// aborting.
func (d directReceive) postAhead() bool {
	x := d.x
	for range min(max(x.eng.cfg.Tuning.PipelineDepth, directRecvAhead), x.nChunks) {
		if !d.post(nil) {
			return false
		}
	}
	return !x.aborting
}

// post posts the receive of the next chunk straight into the pool. It returns false if the
// transfer is aborting.
func (d directReceive) post(*buffer.Slot) bool {
	x := d.x
	if x.nextSeq >= x.nChunks || x.aborting {
		return !x.aborting
	}
	off, n := x.chunkRange(x.nextSeq)
	return x.postDirect(off, n, x.eng.direct.PostRecvIOV)
}

// completed handles a direct chunk that landed in the pool: no header to check (the tag named
// it), only its length.
func (d directReceive) completed(rec *opRec, c transport.Completion) {
	x := d.x
	_, n := x.chunkRange(rec.seq)
	if int64(c.Bytes) != n {
		x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%w: direct chunk %d carried %d bytes, want %d", ErrProtocol, rec.seq, c.Bytes, n)},
			wire.AbortProtocol, x.eng.cfg.Tuning.CancelGrace)
		return
	}
	x.progress(n)
	x.markReceived(rec.seq)
	if !d.post(nil) {
		return
	}
	x.receivedAll()
}

// request says the receiver takes the direct path.
func (directReceive) request(ri *wire.RequestInfo) bool {
	ri.Flags |= wire.FlagDirect
	return true
}

// postDirect posts chunk x.nextSeq, stream bytes [off, off+n), as one IOV operation straight
// on the pool (post is the transport's PostSendIOV or PostRecvIOV). It returns false, having
// aborted the transfer, if the post fails.
func (x *xfer) postDirect(off, n int64, post func(Peer, transport.Tag, [][]byte, func(transport.Completion)) (transport.OpID, error)) bool {
	rec := &opRec{seq: x.nextSeq}
	var id transport.OpID
	iov, err := x.iov(off, n)
	if err == nil {
		id, err = post(x.peer, x.tag(rec.seq), iov,
			func(c transport.Completion) { x.box.Push(event{op: rec, c: c}) })
		if err != nil {
			err = transportErr(err)
		}
	}
	if err != nil {
		x.abort(err, wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		return false
	}
	x.posted(rec, id)
	return true
}
