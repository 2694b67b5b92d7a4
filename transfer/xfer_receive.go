// SPDX-License-Identifier: Apache-2.0

package transfer

// The receiving side of a sub-transfer: pick the path (path_staging.go, path_direct.go,
// path_rma.go), request the blocks, and what every receiving path shares: the layers ready so
// far, the end. xfer.go has what both sides share: the loop, timers, abort, quarantine.

import (
	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"go.uber.org/zap"
)

func (x *xfer) runReceive() {
	if !x.meet() { // negotiate.go: the peer speaks what the request needs
		return
	}
	if x.dev.set() {
		x.runReceiveDevice() // device.go
		return
	}
	if !x.reserveTags() {
		return
	}
	if x.directCapable() && x.peerHas(wire.FeatureDirect) && (!x.piecesTooSmall() && !x.pullBeatsDirect() || x.vectorGetsLikely()) {
		x.runReceiveDirect() // path_direct.go, path_rma.go
		return
	}
	x.runReceiveStaging() // path_staging.go
}

func (x *xfer) sendRequestInfo() {
	ri := &wire.RequestInfo{Header: x.head(), Shape: kvplan.ShapeOf(x.plan),
		ChunkBytes: x.chunk, Depth: int64(x.eng.cfg.Tuning.PipelineDepth), Held: x.held, HeldOf: x.heldOf}
	if x.layerCut {
		ri.Flags |= wire.FlagLayerCut
	}
	x.claim(ri) // claim.go
	if p, ok := x.path.(requestFlags); ok && !p.request(ri) {
		return
	}
	x.stamp("request to send")
	if err := x.eng.tr.SendControl(x.peer, wire.Encode(ri)); err != nil {
		x.log().Debug("request-info not sent; will retry", zap.Error(err))
	}
	x.stamp("request sent")
}

// receivedAll completes a receive once its last chunk has landed, on whichever path it ran
// (staging, direct, RMA): every layer is ready, the sender is told (Done), the handle ends.
func (x *xfer) receivedAll() {
	if x.moved != x.nChunks {
		return
	}
	x.layersReady.Store(x.plan.Selection().Layers())
	x.stamp("all moved")
	_ = x.eng.tr.SendControl(x.peer, wire.Encode(&wire.Done{Header: x.head(), Bytes: x.plan.Bytes()}))
	x.stamp("Done sent")
	x.finish(evComplete, nil)
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
