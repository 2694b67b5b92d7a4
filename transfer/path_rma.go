// SPDX-License-Identifier: Apache-2.0

package transfer

// The RMA path, a mode of the direct path (transport.RMATransport): the receiver reads the sender's
// blocks with RMA gets, pool range to pool range. A direct receiver whose transport has gets
// asks for an offer (FlagRMA) and posts nothing until the answer; the sender offers its pool
// (RMAOffer, in parts when large) and keeps it exposed until the receiver's Done or release,
// or the peer's loss. A decline on either side, or an offer whose ranges are too small, falls
// back to the direct path's IOV messages (path_direct.go). The offer's format and checks are
// in rma.go; the validated reads (generation words) in rma_gen.go.

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// rmaReceive is the receiving side of the RMA path: first asking for an offer (nothing
// posted, Path undecided), then pulling the offered pool with gets.
type rmaReceive struct {
	x        *xfer
	pulling  bool // the offer was accepted: gets are being posted
	key      []byte
	addr     uint64
	gets     []rmaRegion
	parts    *rmaParts // an offer arriving in parts, until it is whole
	genCheck           // a validated offer's generation word (rma_gen.go)
	// inPlace reads the offered pool where the transport maps it here (rma_inplace.go); nil:
	// gets.
	inPlace *rmaInPlace
	// oneHop: the offer is the params' Exposure section (onehop.go), whose regions every
	// get must lie in.
	oneHop  bool
	regions [][2]uint64
	// vecSrc is the offer's plan where its pieces are read by vector gets (rma_vector.go):
	// each of gets is then a range of the stream. nil: each is a pool range.
	vecSrc *layout.Plan
}

// rmaSend is the sending side of the RMA path: the pool is offered and exposed to the
// receiver's gets, which move the whole stream; the sender posts nothing.
type rmaSend struct {
	x        *xfer
	offered  bool              // the pool is offered; false once the receiver declined it
	exposure *opRec            // outstanding while the receiver may read the pool
	offer    [][]byte          // the encoded offer (one message, or its parts), resent when a repeated request shows it lost
	ri       *wire.RequestInfo // the request, to fall back to IOV chunks if the receiver declines
	endGen   func()            // ends the exposure's generation (rma_gen.go); nil: none
}

var (
	_ path         = (*rmaReceive)(nil)
	_ peerTalk     = (*rmaReceive)(nil)
	_ awaitsAnswer = (*rmaReceive)(nil)
	_ requestFlags = (*rmaReceive)(nil)
	_ path         = (*rmaSend)(nil)
	_ peerTalk     = (*rmaSend)(nil)
)

// ---- receiving side ----

// askRMA (a direct receiver, before posting anything) asks the sender for an RMA offer and
// returns the path waiting for it. It returns nil when the RMA mode is off here, and the IOV
// receives go out as usual.
func (x *xfer) askRMA() *rmaReceive {
	rt := x.rmaTransport()
	if rt == nil || !x.peerHas(wire.FeatureRMA) {
		return nil
	}
	if !x.dev.set() && x.getsEmulated(rt) {
		x.log().Debug("gets from this peer would be emulated: direct messages instead of rma")
		return nil
	}
	r := &rmaReceive{x: x}
	x.take(r)
	offer, regions, err := x.oneHopOffer() // onehop.go: the params' Exposure section
	if err != nil {
		x.abort(&requestError{ID: x.h.id, Err: &rmaOfferError{Field: "Exposure", Reason: "the params' exposure", Err: err}},
			wire.AbortProtocol, x.eng.cfg.Tuning.CancelGrace)
		return r
	}
	if offer != nil {
		// The section checked as an offer and the gets posted, then the request with the
		// claim and FlagOneHop goes while they run: no offer will come. A section refused
		// (the transfer aborts) claims nothing; one whose ranges are too small falls back,
		// and that fallback's request is the claim.
		r.oneHop, r.regions = true, regions
		x.stamp("exposure parsed")
		if r.offered(offer); !r.pulling {
			return r
		}
	}
	x.sendRequestInfo()
	return r
}

func (r *rmaReceive) kind() Path {
	if r.pulling {
		return PathRMA
	}
	return PathUndecided
}

// request asks for an offer (FlagRMA) while one is wanted. It reports false when no request
// should go: the offer is in hand, and a repeat would read as a decline.
func (r *rmaReceive) request(ri *wire.RequestInfo) bool {
	if r.pulling && !r.oneHop { // a one-hop read's request is its claim: it goes, and again until a get moved
		return false
	}
	ri.Flags |= wire.FlagDirect | wire.FlagRMA
	if r.oneHop {
		ri.Flags |= wire.FlagOneHop
	}
	return true
}

func (r *rmaReceive) fromPeer(m wire.Message) {
	if o, ok := m.(*wire.RMAOffer); ok {
		r.offered(o)
	}
}

func (*rmaReceive) peerLost() {}

// takeDeclined implements awaitsAnswer: before an offer is in hand, the direct receives a
// decline would have posted (directReceive.postAhead). A device pool has no fallback, so no
// sender of one sends chunks.
func (r *rmaReceive) takeDeclined() {
	x := r.x
	if r.pulling || x.dev.set() {
		return
	}
	for range min(max(x.eng.cfg.Tuning.PipelineDepth, directRecvAhead), x.nChunks) {
		if x.nextSeq >= x.nChunks {
			return
		}
		off, n := x.chunkRange(x.nextSeq)
		if !x.postDirect(off, n, x.eng.direct.PostRecvIOV) {
			return
		}
	}
}

// offered takes the sender's answer to FlagRMA: pull with gets, or fall back to IOV messages
// when the sender declined or the two layouts do not line up.
func (r *rmaReceive) offered(m *wire.RMAOffer) {
	x := r.x
	if r.pulling || x.aborting || m.Sub != x.wireSub {
		return // a duplicate, or an answer to a request this transfer gave up
	}
	if m.Flags&wire.RMADeclined != 0 {
		if r.stageInstead("the sender declined rma: " + m.Reason) { // path_device_stage.go
			return
		}
		if r.deviceNoFallback("the sender declined rma: " + m.Reason) {
			return
		}
		x.log().Debug("sender declined rma; direct messages instead", zap.String("reason", m.Reason))
		r.fallback(false)
		return
	}
	if m.Flags&wire.RMAOfferPart != 0 {
		if r.parts == nil {
			r.parts = newRMAParts(m)
		}
		whole, err := r.parts.add(m)
		if err != nil {
			x.abort(&requestError{ID: x.h.id, Err: err}, wire.AbortProtocol, x.eng.cfg.Tuning.CancelGrace)
			return
		}
		if whole == nil {
			return // more parts to come
		}
		m, r.parts = whole, nil
	}
	var src *layout.Plan
	var gets []rmaRegion
	var err error
	if !r.oneHop { // a one-hop offer's gets are checked against its regions as pool ranges
		src, gets, err = r.vectorOffer(m) // rma_vector.go
	}
	if err == nil && src == nil {
		if r.inPlace = x.rmaInPlace(); r.inPlace != nil {
			r.mapOffer(m) // rma_inplace.go
		}
		gets, err = x.checkOffer(m, r.inPlace != nil)
		if err == nil && r.oneHop {
			err = checkRegions(m.Addr, gets, r.regions) // onehop.go
		}
		if err == nil && gets == nil {
			r.releaseView()
			r.inPlace = nil
		}
		if err == nil && r.inPlace != nil { // every lane copies a share (rma_inplace.go)
			gets, r.inPlace.batch = splitForLanes(gets, r.inPlace.limit, x.eng.othersActive())
		}
	}
	if err != nil {
		x.abort(&requestError{ID: x.h.id, Err: err}, wire.AbortProtocol, x.eng.cfg.Tuning.CancelGrace)
		return
	}
	if gets == nil {
		if r.deviceNoFallback("the two pools' ranges do not line up for gets (a layout conversion needs staging: a host pool and a Mover)") {
			return
		}
		r.fallback(true)
		return
	}
	if m.Flags&wire.RMAValidated != 0 {
		if x.rmaGenerations() == nil {
			if r.deviceNoFallback("this transport cannot check the sender's generation word") {
				return
			}
			x.log().Debug("rma offer declined: this transport cannot check the sender's generation")
			r.fallback(true)
			return
		}
		if err := x.rmaGenerations().PrepareReadGeneration(x.peer, m.GenKey); err != nil {
			x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
			return
		}
		r.gen, r.genAddr, r.genKey = m.Generation, m.GenAddr, m.GenKey
	}
	if p, ok := x.rmaTransport().(transport.RMAKeyPreparer); ok {
		if err := p.PrepareKeys(x.peer, m.Key); err != nil {
			x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
			return
		}
	}
	r.pulling, r.key, r.addr, r.gets, r.vecSrc = true, m.Key, m.Addr, gets, src
	x.stamp("offer checked")
	x.take(r)                              // now PathRMA
	x.nChunks, x.recvSeen = len(gets), nil // layers are reported ready at the end
	for range min(rmaGetsAhead, len(gets)) {
		if !r.post(nil) {
			break
		}
	}
}

// fallback runs the direct path on IOV messages after all. decline tells the sender, which
// waits with its offer, to send chunks instead (a request without FlagRMA).
func (r *rmaReceive) fallback(decline bool) {
	x := r.x
	d := directReceive{x}
	x.take(d)
	if !d.postAhead() {
		return
	}
	if decline {
		x.sendRequestInfo()
	}
}

// post posts the next get straight into the pool. It returns false if the transfer is
// aborting.
func (r *rmaReceive) post(*buffer.Slot) bool {
	x := r.x
	if x.nextSeq >= x.nChunks || x.aborting {
		return !x.aborting
	}
	if r.inPlace != nil { // rma_inplace.go: a copy, not a get
		r.copyInPlace()
		return true
	}
	g := r.gets[x.nextSeq]
	rec := &opRec{seq: x.nextSeq}
	done := func(c transport.Completion) { x.box.Push(event{op: rec, c: c}) }
	var id transport.OpID
	var err error
	switch {
	case r.vecSrc != nil: // rma_vector.go
		id, err = r.postVector(g, x.tag(rec.seq), done)
	case x.dev.set(): // device.go: named by address, never by a slice
		id, err = x.eng.deviceGets().PostGetAt(x.peer, x.tag(rec.seq), r.key, r.addr+uint64(g.src), x.dev.Addr+uint64(g.dst), g.n, done)
	default:
		id, err = x.rmaTransport().PostGet(x.peer, x.tag(rec.seq), r.key, r.addr+uint64(g.src), x.pool[g.dst:g.dst+g.n:g.dst+g.n], done)
	}
	if err != nil {
		x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		return false
	}
	x.posted(rec, id)
	return true
}

// completed handles a get that landed in the pool, and then the read of the sender's
// generation word.
func (r *rmaReceive) completed(rec *opRec, c transport.Completion) {
	x := r.x
	if r.gotGeneration(x, rec) {
		return
	}
	n := r.gets[rec.seq].n
	if int64(c.Bytes) != n {
		x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%w: get %d read %d bytes, want %d", ErrProtocol, rec.seq, c.Bytes, n)},
			wire.AbortProtocol, x.eng.cfg.Tuning.CancelGrace)
		return
	}
	x.progress(n)
	if !r.post(nil) {
		return
	}
	if x.moved == x.nChunks && !r.readGeneration(x) {
		return
	}
	x.receivedAll()
}

// end runs when a receiver that asked for an offer has ended: unless it completed (Done said
// so), it tells the sender it will not read the pool again, whatever became of the offer (a
// sender with no exposure, or one our decline ended, ignores the release). Its gets are all
// final by now, or given up with its own blocks poisoned for good, where a late read lands in
// memory nobody uses.
func (r *rmaReceive) end() {
	x := r.x
	r.releaseView()              // rma_inplace.go: every copy has returned
	if x.m.load() != Completed { // also after a decline of ours: the release is the word that lasts
		_ = x.eng.tr.SendControl(x.peer, wire.Encode(&wire.RMARelease{Header: x.head()}))
	}
}

// ---- sending side ----

// offerRMA answers a request with FlagRMA (the sender, once started on the direct path): it
// offers the pool, puts the transfer on the RMA path and reports true, the receiver's gets
// then being the whole transfer; or it declines, saying why, and returns the encoded decline
// (nil when the request asked for no offer), and the caller sends IOV chunks.
func (x *xfer) offerRMA(ri *wire.RequestInfo) (offered bool, decline []byte) {
	if ri.Flags&wire.FlagRMA == 0 {
		return false, nil
	}
	head := x.head()
	reason := ""
	s := &rmaSend{x: x}
	rt := x.rmaTransport()
	switch {
	case x.dev.set() && x.deviceRMAWhyNot() != "": // device.go: the receiver stages instead, or refuses
		reason = "this sender's device pool cannot be read by gets: " + x.deviceRMAWhyNot()
	case rt == nil:
		reason = "this sender's engine or transport has no rma mode"
	case x.stream:
		reason = "a streaming send exposes its layers as they become ready, by messages"
	}
	oneHop := ri.Flags&wire.FlagOneHop != 0 && x.oneHop != nil // onehop.go: the receiver has the offer already
	if reason == "" {
		addr, key, err := x.rmaKey(rt)
		offer := &wire.RMAOffer{Header: head, Addr: addr, PoolBytes: x.poolBytes(),
			Layout: x.plan.Layout(), Selection: x.plan.Selection(), Blocks: x.plan.Blocks(), Key: key}
		if h := x.oneHop; err == nil && h != nil { // the word the params named, ended once (endOneHop)
			offer.Flags |= wire.RMAValidated
			offer.GenAddr, offer.GenKey, offer.Generation = h.gen.GenAddr, h.gen.GenKey, h.gen.Generation
			s.endGen = x.endOneHop
		} else if err == nil {
			err = s.exposeGeneration(offer)
		}
		if err == nil {
			extra := 0
			if offer.Flags&wire.RMAValidated != 0 {
				extra = len(offer.GenKey) + wire.OfferGenBytes
			}
			s.offer, err = encodeOffer(x.offerBlocks(len(key)+extra), offer)
		}
		if err == nil && len(s.offer) > 1 && !x.peerHas(wire.FeatureMultiPart) {
			v, vmin, _ := x.eng.peerFeatures(x.peer)
			err = &featureError{Peer: x.peer, Feature: wire.FeatureMultiPart, PeerVersion: v, PeerMinVersion: vmin}
		}
		if err == nil && !oneHop {
			err = s.sendOffer()
		}
		if oneHop {
			s.offer = nil // nothing to resend: the receiver read the params
		}
		if err != nil {
			reason = err.Error()
			s.endGeneration() // never exposed after all
		}
	}
	if reason != "" {
		x.endOneHop() // no read of the params' exposure may complete now
		x.log().Debug("declining rma", zap.String("reason", reason))
		decline = wire.Encode(&wire.RMAOffer{Header: head, Flags: wire.RMADeclined, Reason: reason})
		_ = x.eng.tr.SendControl(x.peer, decline)
		return false, decline
	}
	s.offered, s.ri = true, ri
	s.exposure = &opRec{seq: -1} // id 0: no transport op; Cancel ignores it
	x.ops = append(x.ops, s.exposure)
	x.outstanding++
	x.nChunks = 1 // the exposure: it moves the whole stream when Done comes
	x.take(s)
	return true, nil
}

func (*rmaSend) kind() Path { return PathRMA }

// post has nothing to post: the receiver's gets move the bytes.
func (s *rmaSend) post(slot *buffer.Slot) bool {
	releaseSlot(slot)
	return !s.x.aborting
}

// completed never runs: the exposure is no transport operation; it ends by the peer's word.
func (*rmaSend) completed(*opRec, transport.Completion) {}

func (s *rmaSend) fromPeer(m wire.Message) {
	switch m := m.(type) {
	case *wire.RequestInfo:
		s.repeated(m)
	case *wire.Done:
		s.released(true)
	case *wire.RMARelease:
		s.released(false)
	}
}

// sendOffer sends the offer's messages. After a failed one it stops: the decline that
// follows tells the receiver to give up on the parts it holds.
func (s *rmaSend) sendOffer() error {
	for _, b := range s.offer {
		if err := s.x.eng.tr.SendControl(s.x.peer, b); err != nil {
			return err
		}
	}
	return nil
}

// repeated handles a repeated request while the pool is offered: one with FlagRMA shows the
// offer may have been lost, so it goes again; one without is the receiver's decline: the pool
// is no longer exposed, and the chunks go as IOV messages.
func (s *rmaSend) repeated(m *wire.RequestInfo) {
	x := s.x
	if !s.offered || s.exposure.final || m.Flags&wire.FlagDirect == 0 {
		return
	}
	if m.Flags&wire.FlagRMA != 0 {
		if !x.aborting {
			_ = s.sendOffer()
		}
		return
	}
	// The receiver declined before reading anything: the pool is no longer exposed, even for
	// a sender already aborting, which has no other word coming (L10).
	s.endExposure()
	s.offered = false
	if x.aborting {
		x.maybeResolve()
		return
	}
	d := &directSend{x: x}
	x.take(d)
	x.setChunks(s.ri.ChunkBytes, s.ri.Flags&wire.FlagLayerCut != 0)
	d.postAhead()
}

// released ends the exposure: the receiver's gets are over (done: it completed, and Done said
// so), or the peer is gone. Without Done and without an abort of our own, the receiver
// stopped early: the transfer fails.
func (s *rmaSend) released(done bool) {
	x := s.x
	if !s.offered || s.exposure.final {
		return
	}
	s.endExposure()
	switch {
	case x.aborting:
		x.maybeResolve()
	case done:
		x.progress(x.plan.Bytes())
	default:
		x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%w: the receiver stopped reading the offered pool before it completed", ErrPeerAborted)},
			0, x.eng.cfg.Tuning.CancelGrace)
	}
}

// peerLost: a lost peer cannot read the pool any more (the Transport's word on a lost peer),
// so the exposure ends; the abort that follows fails the transfer (one already aborting,
// handleEvent resolves).
func (s *rmaSend) peerLost() {
	if !s.offered || s.exposure.final {
		return
	}
	s.endExposure()
}
