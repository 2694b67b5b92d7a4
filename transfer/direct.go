// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"

	"go.uber.org/zap"
)

// directRecvAhead is how many direct receives a transfer keeps posted (at least
// PipelineDepth): they hold no slot, only the caller's memory, which is reserved for the
// transfer anyway.
const directRecvAhead = 64

// directCapable reports whether this side may take the one-copy path: the engine allows it,
// the transport has it, the spec moves host memory through the plan (no Mover), and the
// transport can reach the pool in place.
func (x *xfer) directCapable() bool {
	if x.eng.cfg.DisableDirect || !x.hostPool || x.eng.direct == nil {
		return false
	}
	return x.eng.direct.Direct(x.pool)
}

// iov lists the pool ranges holding stream bytes [off, off+n): what a direct operation hands
// the transport.
func (x *xfer) iov(off, n int64) ([][]byte, error) {
	var iov [][]byte
	err := x.plan.Runs(off, n, func(poolOff, _, length int64) {
		iov = append(iov, x.pool[poolOff:poolOff+length:poolOff+length])
	})
	return iov, err
}

// startDirect leaves Queued without a slot: a direct transfer holds none (so it needs none to
// make progress, and the slot accounting of L5 does not see it), only one of the engine's
// MaxConcurrent tokens (L13). It returns false if the transfer ended first.
func (x *xfer) startDirect() bool {
	if !x.admit() {
		return false
	}
	if !x.apply(EvAdvertise, nil) {
		return false
	}
	x.qcancel() // as lease: starting is no sign of progress (L12)
	x.path.Store(int32(PathDirect))
	return true
}

// postRecvsAhead posts the first direct receives. They cost no slot, so it posts well ahead
// of the sender: a chunk that arrives before its receive is posted is an unexpected message,
// which UCX handles on a slower path than a matched one. It returns false if the transfer is
// aborting.
func (x *xfer) postRecvsAhead() bool {
	for range min(max(x.eng.cfg.PipelineDepth, directRecvAhead), x.nChunks) {
		if !x.postRecvDirect() {
			return false
		}
	}
	return !x.aborting
}

// postRecvDirect posts the receive of the next chunk straight into the pool. It returns
// false if the transfer is aborting.
func (x *xfer) postRecvDirect() bool {
	if x.nextSeq >= x.nChunks || x.aborting {
		return !x.aborting
	}
	off, n := x.chunkRange(x.nextSeq)
	return x.postDirect(off, n, x.eng.direct.PostRecvIOV)
}

// postDirect posts chunk x.nextSeq, stream bytes [off, off+n), as one IOV operation straight
// on the pool (post is the transport's PostSendIOV or PostRecvIOV). It returns false, having
// aborted the transfer, if the post fails.
func (x *xfer) postDirect(off, n int64, post func(Peer, Tag, [][]byte, func(Completion)) (OpID, error)) bool {
	rec := &opRec{seq: x.nextSeq}
	var id OpID
	iov, err := x.iov(off, n)
	if err == nil {
		id, err = post(x.peer, x.tag(rec.seq), iov,
			func(c Completion) { x.box.Push(event{op: rec, c: c}) })
		if err != nil {
			err = transportErr(err)
		}
	}
	if err != nil {
		x.abort(err, AbortInternal, x.eng.cfg.CancelGrace)
		return false
	}
	x.posted(rec, id)
	return true
}

// receivedDirect handles a direct chunk that landed in the pool: no header to check (the tag
// named it), only its length.
func (x *xfer) receivedDirect(rec *opRec, c Completion) {
	if x.rma.mode == rmaPulling {
		x.gotRegion(rec, c)
		return
	}
	_, n := x.chunkRange(rec.seq)
	if int64(c.Bytes) != n {
		x.abort(&RequestError{ID: x.h.id, Err: fmt.Errorf("%w: direct chunk %d carried %d bytes, want %d", ErrProtocol, rec.seq, c.Bytes, n)},
			AbortProtocol, x.eng.cfg.CancelGrace)
		return
	}
	x.progress(n)
	x.markReceived(rec.seq)
	if !x.postRecvDirect() {
		return
	}
	x.receivedAll()
}

// postSendDirect posts the next chunk straight from the pool, or, on a streaming Send whose
// next chunk is not ready, keeps the pipeline place for onReady. It returns false if the
// transfer is aborting.
func (x *xfer) postSendDirect() bool {
	if x.nextSeq >= x.nChunks || x.aborting {
		return !x.aborting
	}
	off, n := x.chunkRange(x.nextSeq)
	if off+n > x.readyBytes {
		if err := x.refreshReady(); err != nil {
			x.abort(err, AbortInternal, x.eng.cfg.CancelGrace)
			return false
		}
		if off+n > x.readyBytes { // wait for the model; a nil slot marks a direct place
			x.idle = append(x.idle, nil)
			return true
		}
	}
	return x.postDirect(off, n, x.eng.direct.PostSendIOV)
}

// poisonBlocks is L9 for the direct path: the transport may still touch the caller's own KV
// blocks, and there is no slot to take out of circulation in their place. The transfer stays
// quarantined for good (its Quiesced channel never closes, so the caller never frees or
// reuses those blocks, and the engine refuses new transfers over them), Status says
// BlocksPoisoned, and Health counts its blocks against Config.PoisonedBlockBudget.
func (x *xfer) poisonBlocks(rec *opRec, reason string) {
	if !x.blocksUnknown {
		x.blocksUnknown = true
		x.h.blocksPoisoned.Store(true)
		x.eng.obs.OnPoison(x.h.id, -1, reason)
		x.log().Error("caller's KV blocks poisoned: the transport may still touch them; the handle never quiesces",
			zap.Int("seq", rec.seq), zap.String("reason", reason))
	}
}
