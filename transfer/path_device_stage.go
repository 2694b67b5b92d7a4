// SPDX-License-Identifier: Apache-2.0

package transfer

// A device transfer that took the rma route and whose sender declined it (no device gets on
// the sender's transport, rma or direct disabled there, or its offer could not be made) stages
// instead, when both specs have a Mover: the sender answers the receiver's request with its
// decline and waits on deviceDeclined; the receiver, holding the decline, leases staging
// slots, posts its receives and asks again without FlagDirect; the sender then leases its own
// slots and sends on the staging path. Nothing moved before the switch (gets had not started,
// and a device sender sends no IOV chunks), so the staging path starts from chunk 0. Slots are
// taken only if free at that moment (the loop never waits on the pool); a side with none
// fails with an ErrDeviceRoute saying so, as does a receiver without a Mover.

import (
	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// deviceDeclined is a device sender that declined the rma route and waits for the receiver's
// request for staging.
type deviceDeclined struct {
	x       *xfer
	decline []byte // sent again while the receiver still asks for an offer
}

var (
	_ path     = (*deviceDeclined)(nil)
	_ peerTalk = (*deviceDeclined)(nil)
)

func (*deviceDeclined) kind() Path { return PathUndecided }

// post has nothing to post before the receiver's staging request.
func (d *deviceDeclined) post(slot *buffer.Slot) bool {
	releaseSlot(slot)
	return !d.x.aborting
}

// completed never runs: nothing is posted.
func (*deviceDeclined) completed(*opRec, transport.Completion) {}

func (*deviceDeclined) peerLost() {}

// fromPeer sends a lost decline again, or starts staging on the receiver's staging request.
func (d *deviceDeclined) fromPeer(m wire.Message) {
	x := d.x
	ri, ok := m.(*wire.RequestInfo)
	if !ok || x.aborting {
		return
	}
	if ri.Flags&wire.FlagDirect != 0 {
		if ri.Flags&wire.FlagRMA != 0 && d.decline != nil {
			_ = x.eng.tr.SendControl(x.peer, d.decline)
		}
		return
	}
	refuse := func(reason string) {
		x.abort(&requestError{ID: x.h.id, Err: &deviceRouteError{Reason: reason}}, wire.AbortIncompatible, x.eng.cfg.Tuning.CancelGrace)
	}
	switch {
	case ri.Flags&wire.FlagPull != 0:
		refuse("the receiver asked for the pull wire after this sender declined rma; it stages by tagged messages only")
		return
	case ri.ChunkBytes <= 0 || ri.ChunkBytes > x.payloadCap():
		refuse("the receiver's staging chunks do not fit this engine's slots after the rma decline")
		return
	}
	first, err := x.eng.pool.TryLease()
	if err != nil {
		refuse("this sender declined rma and had no staging slot free to stage instead")
		return
	}
	x.setChunks(ri.ChunkBytes, ri.Flags&wire.FlagLayerCut != 0)
	x.take(stagingSend{x})
	x.log().Debug("device pool staged after this sender declined rma")
	slots := x.extraSlots(first)
	for i, s := range slots {
		if !x.path.post(s) {
			releaseAll(slots[i+1:]) // never posted
			return
		}
	}
}

// stageInstead puts a device receiver whose sender declined rma on the staging path through its
// Mover. It reports false for a host pool (the direct fallback is the caller's) and for a
// device receiver without a Mover, which the caller refuses.
func (r *rmaReceive) stageInstead(why string) bool {
	x := r.x
	if !x.dev.set() || !x.hasMover {
		return false
	}
	first, err := x.eng.pool.TryLease()
	if err != nil {
		x.abort(&requestError{ID: x.h.id, Err: &deviceRouteError{Reason: why + ", and no staging slot was free to stage instead"}},
			wire.AbortIncompatible, x.eng.cfg.Tuning.CancelGrace)
		return true
	}
	x.log().Debug("device pool staged: " + why)
	x.take(stagingReceive{x})
	x.setChunks(x.payloadCap(), x.stream)
	if x.layerCut {
		x.recvSeen = make([]bool, x.nChunks)
	}
	slots := x.extraSlots(first)
	x.postAndAsk(slots)
	return true
}
