// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/layout"
)

// Path is how a transfer moves its bytes. It is decided once per sub-transfer, when the
// receiver's request and the sender's answer have met.
type Path int32

// The paths.
const (
	// PathUndecided: not started, or the sender's answer has not arrived yet.
	PathUndecided Path = iota
	// PathStaging: through staging slots (gather, wire, scatter).
	PathStaging
	// PathDirect: one tagged IOV message per chunk, straight between the pools.
	PathDirect
	// PathRMA: RMA gets by the receiver, pool range to pool range.
	PathRMA
)

// String names the path as kvxbench's path column does.
func (p Path) String() string {
	switch p {
	case PathUndecided:
		return "undecided"
	case PathStaging:
		return "staging"
	case PathDirect:
		return "direct"
	case PathRMA:
		return "rma"
	}
	return fmt.Sprintf("path(%d)", int32(p))
}

// Path reports, without blocking, how the transfer moves its bytes; for a multi-peer Receive,
// the slowest of its sub-transfers' paths (undecided while any is).
func (h *Handle) Path() Path {
	p := PathRMA
	for _, x := range h.subs {
		p = min(p, Path(x.path.Load()))
	}
	return p
}

// ErrBadRMAOffer: a sender's RMA offer does not describe memory the receiver may read: a
// layout, selection or block list that does not validate, a pool smaller than the plan it
// holds, or a stream unlike the request's. The error is an *RMAOfferError; the request fails
// before any get is posted, so a garbage offer never becomes an out-of-bounds read.
var ErrBadRMAOffer = errors.New("kvxfer: bad rma offer")

// RMAOfferError names the part of an offer that is wrong. It matches ErrBadRMAOffer and
// ErrProtocol.
type RMAOfferError struct {
	Field  string
	Reason string
	Err    error // the underlying cause, if any (a layout error, say)
}

// Error implements error.
func (e *RMAOfferError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrBadRMAOffer, e.Field, e.Reason)
}

// Is matches ErrBadRMAOffer and ErrProtocol.
func (e *RMAOfferError) Is(target error) bool {
	return target == ErrBadRMAOffer || target == ErrProtocol
}

// Unwrap returns the underlying cause.
func (e *RMAOfferError) Unwrap() error { return e.Err }

const (
	// rmaGetsAhead is how many gets a receiver keeps posted: they hold no slot, and a few in
	// flight keep the copy going while the engine handles the last one's completion.
	rmaGetsAhead = 16
	// rmaMaxOfferBlocks bounds the block ids of one offer message; a larger request's offer
	// goes in parts of this many, or fewer where the transport's control messages have less
	// room (ControlBound: UCX's default of 4 KiB holds this many with a shared-memory address).
	rmaMaxOfferBlocks = 768
	// rmaMaxPieces bounds the pool-to-pool pieces a receiver works out before coalescing
	// them; a plan with more runs has ranges far too small for gets anyway.
	rmaMaxPieces = 1 << 20
	// rmaMinStripe is the smallest get made to spread a request over lanes: smaller ones would
	// cost more per byte than the lanes win.
	rmaMinStripe = 1 << 20
)

type rmaMode int8

const (
	rmaOff     rmaMode = iota // not asked, or declined: the direct path runs on IOV messages
	rmaAsked                  // receiver: asked for an offer; nothing posted until it comes
	rmaPulling                // receiver: reading the offered pool with gets
	rmaOffered                // sender: pool exposed until Done, a release or the peer's loss
)

// rmaXfer is a sub-transfer's RMA state, owned by its goroutine.
type rmaXfer struct {
	mode rmaMode
	// receiver
	key   []byte
	addr  uint64
	gets  []rmaRegion
	parts *rmaParts // an offer arriving in parts, until it is whole
	// a validated offer's generation word (rma_gen.go); genKey nil: nothing to check
	gen, genAddr uint64
	genKey       []byte
	genRec       *opRec // the read of the word, once posted
	// sender
	exposure *opRec       // outstanding while the receiver may read the pool
	offer    [][]byte     // the encoded offer (one message, or its parts), resent when a repeated request shows it lost
	decline  []byte       // the encoded decline, resent likewise
	ri       *RequestInfo // the request, to fall back to IOV chunks if the receiver declines
	endGen   func()       // ends the exposure's generation (rma_gen.go); nil: none
}

// rmaRegion is a range of the sender's pool read into a range of the receiver's.
type rmaRegion struct {
	src, dst, n int64
}

// rmaTransport returns the engine's transport as an RMATransport, when it is one and the
// engine allows the mode.
func (x *xfer) rmaTransport() RMATransport {
	if x.eng.cfg.DisableRMA {
		return nil
	}
	rt, _ := x.eng.tr.(RMATransport)
	return rt
}

// ---- receiving side ----

// rmaAsk (a direct receiver, before posting anything) asks the sender for an RMA offer. It
// reports false when the RMA mode is off here, and the IOV receives go out as usual.
func (x *xfer) rmaAsk() bool {
	rt := x.rmaTransport()
	if rt == nil || !x.peerHas(FeatureRMA) {
		return false
	}
	if em, ok := rt.(RMAEmulation); ok && !x.eng.cfg.RMAWhereEmulated && em.GetsEmulated(x.peer) {
		x.log().Debug("gets from this peer would be emulated: direct messages instead of rma")
		return false
	}
	x.rma.mode = rmaAsked
	x.path.Store(int32(PathUndecided))
	x.sendRequestInfo()
	return true
}

// rmaRequest adds FlagRMA to a request while an offer is wanted. It reports false when no
// request should go: the offer is in hand, and a repeat would read as a decline.
func (x *xfer) rmaRequest(ri *RequestInfo) bool {
	switch x.rma.mode {
	case rmaAsked:
		ri.Flags |= FlagRMA
	case rmaPulling:
		return false
	}
	return true
}

// onRMAOffer takes the sender's answer to FlagRMA: pull with gets, or fall back to IOV
// messages when the sender declined or the two layouts do not line up.
func (x *xfer) onRMAOffer(m *RMAOffer) {
	if !x.receive || x.rma.mode != rmaAsked || x.aborting || m.Sub != x.wireSub {
		return // a duplicate, or an answer to a request this transfer gave up
	}
	if m.Flags&RMADeclined != 0 {
		x.log().Debug("sender declined rma; direct messages instead", zap.String("reason", m.Reason))
		x.rmaFallback(false)
		return
	}
	if m.Flags&RMAOfferPart != 0 {
		if x.rma.parts == nil {
			x.rma.parts = newRMAParts(m)
		}
		whole, err := x.rma.parts.add(m)
		if err != nil {
			x.abort(&RequestError{ID: x.h.id, Err: err}, AbortProtocol, x.eng.cfg.CancelGrace)
			return
		}
		if whole == nil {
			return // more parts to come
		}
		m, x.rma.parts = whole, nil
	}
	gets, err := x.checkOffer(m)
	if err != nil {
		x.abort(&RequestError{ID: x.h.id, Err: err}, AbortProtocol, x.eng.cfg.CancelGrace)
		return
	}
	if gets == nil {
		x.rmaFallback(true)
		return
	}
	if m.Flags&RMAValidated != 0 {
		if x.rmaGenerations() == nil {
			x.log().Debug("rma offer declined: this transport cannot check the sender's generation")
			x.rmaFallback(true)
			return
		}
		if err := x.rmaGenerations().PrepareReadGeneration(x.peer, m.GenKey); err != nil {
			x.abort(transportErr(err), AbortInternal, x.eng.cfg.CancelGrace)
			return
		}
		x.rma.gen, x.rma.genAddr, x.rma.genKey = m.Generation, m.GenAddr, m.GenKey
	}
	if p, ok := x.rmaTransport().(RMAKeyPreparer); ok {
		if err := p.PrepareKeys(x.peer, m.Key); err != nil {
			x.abort(transportErr(err), AbortInternal, x.eng.cfg.CancelGrace)
			return
		}
	}
	x.rma.mode, x.rma.key, x.rma.addr, x.rma.gets = rmaPulling, m.Key, m.Addr, gets
	x.path.Store(int32(PathRMA))
	x.nChunks, x.recvSeen = len(gets), nil // layers are reported ready at the end
	for range min(rmaGetsAhead, len(gets)) {
		if !x.postGet() {
			break
		}
	}
}

// rmaParts assembles an offer sent in parts (RMAOfferPart). The first part to arrive fixes
// everything but the block ids; every other must agree with it, and a position may come
// again (a part sent again after a repeated request) only with the same id.
type rmaParts struct {
	whole RMAOffer // the first part, Blocks growing into the sender's whole list
	have  []bool
	count int
}

func newRMAParts(first *RMAOffer) *rmaParts {
	p := &rmaParts{whole: *first, have: make([]bool, first.Total)}
	p.whole.Flags &^= RMAOfferPart
	p.whole.Blocks, p.whole.First, p.whole.Total = make([]int32, first.Total), 0, 0
	return p
}

// add takes one part. It returns the whole offer once every position has come, nil before,
// and an *RMAOfferError when the part disagrees with the others.
func (p *rmaParts) add(m *RMAOffer) (*RMAOffer, error) {
	bad := func(field, format string, args ...any) error {
		return &RMAOfferError{Field: field, Reason: "offer parts disagree: " + fmt.Sprintf(format, args...)}
	}
	w := &p.whole
	switch {
	case m.Total != len(p.have):
		return nil, bad("Total", "%d blocks, then %d", len(p.have), m.Total)
	case m.Addr != w.Addr || m.PoolBytes != w.PoolBytes:
		return nil, bad("Addr", "pool [%#x, +%d), then [%#x, +%d)", w.Addr, w.PoolBytes, m.Addr, m.PoolBytes)
	case m.Layout != w.Layout || m.Selection != w.Selection:
		return nil, bad("Layout", "%+v %+v, then %+v %+v", w.Layout, w.Selection, m.Layout, m.Selection)
	case !bytes.Equal(m.Key, w.Key):
		return nil, bad("Key", "two different remote keys")
	case m.Flags&RMAValidated != w.Flags&RMAValidated || m.GenAddr != w.GenAddr || m.Generation != w.Generation || !bytes.Equal(m.GenKey, w.GenKey):
		return nil, bad("Generation", "generation %d at %#x, then %d at %#x", w.Generation, w.GenAddr, m.Generation, m.GenAddr)
	}
	for i, id := range m.Blocks {
		at := m.First + i
		if p.have[at] {
			if w.Blocks[at] != id {
				return nil, bad("Blocks", "position %d is block %d, then %d", at, w.Blocks[at], id)
			}
			continue
		}
		p.have[at], w.Blocks[at] = true, id
		p.count++
	}
	if p.count < len(p.have) {
		return nil, nil
	}
	return w, nil
}

// rmaFallback runs the direct path on IOV messages after all. decline tells the sender,
// which waits with its offer, to send chunks instead (a request without FlagRMA).
func (x *xfer) rmaFallback(decline bool) {
	x.rma.mode = rmaOff
	x.path.Store(int32(PathDirect))
	if !x.postRecvsAhead() {
		return
	}
	if decline {
		x.sendRequestInfo()
	}
}

// checkOffer validates the offer against the advertised pool and this side's plan, and
// returns the gets to make, or nil when the ranges are too small for the RMA mode.
func (x *xfer) checkOffer(m *RMAOffer) ([]rmaRegion, error) {
	bad := func(field string, err error, format string, args ...any) error {
		return &RMAOfferError{Field: field, Reason: fmt.Sprintf(format, args...), Err: err}
	}
	src, err := layout.NewPlan(m.Layout, m.Selection, m.Blocks)
	if err != nil {
		return nil, bad("plan", err, "the offered layout, selection and blocks do not make a plan: %v", err)
	}
	if m.PoolBytes <= 0 || src.PoolSpan() > m.PoolBytes {
		return nil, bad("PoolBytes", nil, "a %d-byte pool cannot hold the offered layout's %d bytes", m.PoolBytes, src.PoolSpan())
	}
	if m.Addr+uint64(m.PoolBytes) < m.Addr {
		return nil, bad("Addr", nil, "[%#x, +%d) wraps around", m.Addr, m.PoolBytes)
	}
	if err := layout.CompatibleShapes(src.Shape(), x.plan.Shape()); err != nil {
		return nil, bad("Blocks", err, "the offered stream is not the requested one: %v", err)
	}
	regions, ok := rmaRegions(src, x.plan)
	if !ok || x.plan.Bytes()/int64(len(regions)) < x.eng.cfg.RMAMinRegionBytes {
		x.log().Debug("rma offer declined: pool ranges too small", zap.Int("ranges", len(regions)), zap.Bool("too many pieces", !ok))
		return nil, nil
	}
	var gets []rmaRegion
	for _, r := range regions {
		if r.src < 0 || r.n > m.PoolBytes || r.src > m.PoolBytes-r.n || r.dst < 0 || r.dst > int64(len(x.pool))-r.n {
			return nil, bad("plan", nil, "range [%d, +%d) -> [%d, +%d) leaves a pool", r.src, r.n, r.dst, r.n)
		}
		step := x.getBytes()
		for off := int64(0); off < r.n; off += step {
			n := min(step, r.n-off)
			gets = append(gets, rmaRegion{src: r.src + off, dst: r.dst + off, n: n})
		}
	}
	return gets, nil
}

// getBytes is the largest get: DirectChunkBytes, or less where the transport stripes gets
// over lanes (RMALanes) and the request is too small to give each lane two gets of that size,
// but never under rmaMinStripe.
func (x *xfer) getBytes() int64 {
	step := x.eng.cfg.DirectChunkBytes
	if l, ok := x.eng.tr.(RMALanes); ok {
		if n := int64(l.GetLanes()); n > 1 {
			per := (x.plan.Bytes() + 2*n - 1) / (2 * n)
			step = min(step, max(rmaMinStripe, per))
		}
	}
	return step
}

// rmaRegions pairs the two plans' pool ranges byte for byte of the stream, then merges the
// pieces that are contiguous on both sides: for a block-major pool moving whole blocks, one
// range per block, or per run of blocks whose ids are consecutive on both sides. It reports
// false when the plans have more runs than rmaMaxPieces.
func rmaRegions(src, dst *layout.Plan) ([]rmaRegion, bool) {
	type run struct{ pool, stream, n int64 }
	runs := func(p *layout.Plan) ([]run, bool) {
		if p.Bytes()/(p.Layout().RowBytes()*p.RunUnits()) > rmaMaxPieces {
			return nil, false
		}
		var rs []run
		_ = p.Runs(0, p.Bytes(), func(poolOff, streamOff, n int64) { rs = append(rs, run{poolOff, streamOff, n}) })
		return rs, true
	}
	a, okA := runs(src)
	b, okB := runs(dst)
	if !okA || !okB {
		return nil, false
	}
	pieces := make([]rmaRegion, 0, max(len(a), len(b)))
	for i, j, off := 0, 0, int64(0); i < len(a) && j < len(b); {
		ra, rb := a[i], b[j]
		end := min(ra.stream+ra.n, rb.stream+rb.n)
		pieces = append(pieces, rmaRegion{src: ra.pool + off - ra.stream, dst: rb.pool + off - rb.stream, n: end - off})
		off = end
		if off == ra.stream+ra.n {
			i++
		}
		if off == rb.stream+rb.n {
			j++
		}
	}
	slices.SortFunc(pieces, func(p, q rmaRegion) int { return cmp.Compare(p.dst, q.dst) })
	out := pieces[:0]
	for _, p := range pieces {
		if k := len(out) - 1; k >= 0 && out[k].src+out[k].n == p.src && out[k].dst+out[k].n == p.dst {
			out[k].n += p.n
			continue
		}
		out = append(out, p)
	}
	return out, true
}

// postGet posts the next get straight into the pool. It returns false if the transfer is
// aborting.
func (x *xfer) postGet() bool {
	if x.nextSeq >= x.nChunks || x.aborting {
		return !x.aborting
	}
	g := x.rma.gets[x.nextSeq]
	rec := &opRec{seq: x.nextSeq}
	id, err := x.rmaTransport().PostGet(x.peer, x.tag(rec.seq), x.rma.key,
		x.rma.addr+uint64(g.src), x.pool[g.dst:g.dst+g.n:g.dst+g.n], func(c Completion) { x.box.Push(event{op: rec, c: c}) })
	if err != nil {
		x.abort(transportErr(err), AbortInternal, x.eng.cfg.CancelGrace)
		return false
	}
	x.posted(rec, id)
	return true
}

// gotRegion handles a get that landed in the pool, and then the read of the sender's
// generation word.
func (x *xfer) gotRegion(rec *opRec, c Completion) {
	if rec == x.rma.genRec {
		x.gotGeneration(rec.gen)
		return
	}
	n := x.rma.gets[rec.seq].n
	if int64(c.Bytes) != n {
		x.abort(&RequestError{ID: x.h.id, Err: fmt.Errorf("%w: get %d read %d bytes, want %d", ErrProtocol, rec.seq, c.Bytes, n)},
			AbortProtocol, x.eng.cfg.CancelGrace)
		return
	}
	x.progress(n)
	if !x.postGet() {
		return
	}
	if x.moved == x.nChunks && !x.readGeneration() {
		return
	}
	x.receivedAll()
}

// rmaEnd runs when a receiver that asked for an offer has ended: unless it completed (Done
// said so), it tells the sender it will not read the pool again, whatever became of the offer
// (a sender with no exposure, or one our decline ended, ignores the release). Its gets are
// all final by now, or given up with its own blocks poisoned for good, where a late read
// lands in memory nobody uses.
func (x *xfer) rmaEnd() {
	if x.m.load() != Completed { // also after a decline of ours: the release is the word that lasts
		_ = x.eng.tr.SendControl(x.peer, encode(&RMARelease{Header: x.head()}))
	}
}

// ---- sending side ----

// rmaOffer answers a request with FlagRMA (the sender, once started on the direct path): it
// offers the pool and reports true, the receiver's gets then being the whole transfer; or it
// declines, saying why, and reports false, and the caller sends IOV chunks.
func (x *xfer) rmaOffer(ri *RequestInfo) bool {
	if ri.Flags&FlagRMA == 0 {
		return false
	}
	head := x.head()
	reason := ""
	rt := x.rmaTransport()
	switch {
	case rt == nil:
		reason = "this sender's engine or transport has no rma mode"
	case x.stream:
		reason = "a streaming send exposes its layers as they become ready, by messages"
	}
	if reason == "" {
		addr, key, err := rt.RMAKey(x.pool)
		offer := &RMAOffer{Header: head, Addr: addr, PoolBytes: int64(len(x.pool)),
			Layout: x.plan.Layout(), Selection: x.plan.Selection(), Blocks: x.plan.Blocks(), Key: key}
		if err == nil {
			err = x.exposeGeneration(offer)
		}
		if err == nil {
			extra := 0
			if offer.Flags&RMAValidated != 0 {
				extra = len(offer.GenKey) + rmaGenBytes
			}
			x.rma.offer, err = encodeOffer(x.offerBlocks(len(key)+extra), offer)
		}
		if err == nil && len(x.rma.offer) > 1 && !x.peerHas(FeatureMultiPart) {
			v, vmin, _ := x.eng.peerFeatures(x.peer)
			err = &FeatureError{Peer: x.peer, Feature: FeatureMultiPart, PeerVersion: v, PeerMinVersion: vmin}
		}
		if err == nil {
			err = x.sendOffer()
		}
		if err != nil {
			reason = err.Error()
			if x.rma.endGen != nil { // never exposed after all
				x.rma.endGen()
				x.rma.endGen = nil
			}
		}
	}
	if reason != "" {
		x.log().Debug("declining rma", zap.String("reason", reason))
		x.rma.decline = encode(&RMAOffer{Header: head, Flags: RMADeclined, Reason: reason})
		_ = x.eng.tr.SendControl(x.peer, x.rma.decline)
		return false
	}
	x.rma.mode, x.rma.ri = rmaOffered, ri
	x.rma.exposure = &opRec{seq: -1} // id 0: no transport op; Cancel ignores it
	x.ops = append(x.ops, x.rma.exposure)
	x.outstanding++
	x.nChunks = 1 // the exposure: it moves the whole stream when Done comes
	x.path.Store(int32(PathRMA))
	return true
}

// offerBlocks is how many block ids one offer message carries: rmaMaxOfferBlocks, or fewer
// where the transport's control messages (ControlBound) have less room for a part with a key
// of keyBytes. Below one it is an error.
func (x *xfer) offerBlocks(keyBytes int) int {
	n := rmaMaxOfferBlocks
	if cb, ok := x.eng.tr.(ControlBound); ok {
		n = min(n, (cb.ControlRoom()-rmaOfferFixedBytes-rmaOfferBodyBytes-rmaPartBytes-keyBytes)/4)
	}
	return n
}

// encodeOffer encodes o as one message, or, with more than per blocks, as parts of at most
// that many.
func encodeOffer(per int, o *RMAOffer) ([][]byte, error) {
	if per < 1 {
		return nil, fmt.Errorf("%w: the transport's control messages have no room for an offer with a %d-byte key",
			ErrInvalidSpec, len(o.Key))
	}
	all := o.Blocks
	if len(all) <= per {
		b, err := o.AppendBinary(nil)
		return [][]byte{b}, err
	}
	var msgs [][]byte
	for first := 0; first < len(all); first += per {
		p := *o
		p.Flags |= RMAOfferPart
		p.First, p.Total, p.Blocks = first, len(all), all[first:min(first+per, len(all))]
		b, err := p.AppendBinary(nil)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, b)
	}
	return msgs, nil
}

// sendOffer sends the offer's messages. After a failed one it stops: the decline that
// follows tells the receiver to give up on the parts it holds.
func (x *xfer) sendOffer() error {
	for _, b := range x.rma.offer {
		if err := x.eng.tr.SendControl(x.peer, b); err != nil {
			return err
		}
	}
	return nil
}

// While the pool is offered the sender sees no progress of its own until Done: the receiver
// moves the bytes, and its engine's health watches them. The sender counts as awaiting its
// peer (updateAwaiting), as a streaming receiver awaits its sender's model; its deadline
// bounds it either way.

// rmaRepeated handles a repeated request. After a decline of ours, one with FlagRMA shows the
// decline was lost: it goes again. While the pool is offered, one with FlagRMA shows the
// offer may have been lost, so it goes again; one without is the receiver's decline: the pool
// is no longer exposed, and the chunks go as IOV messages.
func (x *xfer) rmaRepeated(m *RequestInfo) {
	if !x.receive && x.rma.decline != nil && m.Flags&FlagRMA != 0 && x.moved == 0 && !x.aborting {
		_ = x.eng.tr.SendControl(x.peer, x.rma.decline) // the receiver still waits for an answer
		return
	}
	if x.receive || x.rma.mode != rmaOffered || x.rma.exposure.final || m.Flags&FlagDirect == 0 {
		return
	}
	if m.Flags&FlagRMA != 0 {
		if !x.aborting {
			_ = x.sendOffer()
		}
		return
	}
	// The receiver declined before reading anything: the pool is no longer exposed, even for
	// a sender already aborting, which has no other word coming (L10).
	x.endExposure()
	x.rma.mode = rmaOff
	if x.aborting {
		x.maybeResolve()
		return
	}
	x.path.Store(int32(PathDirect))
	x.setChunks(x.rma.ri.ChunkBytes, x.rma.ri.Flags&FlagLayerCut != 0)
	for range min(x.eng.cfg.PipelineDepth, x.nChunks) {
		if !x.postSendDirect() {
			break
		}
	}
}

// rmaReleased ends the exposure: the receiver's gets are over (done: it completed, and
// Done said so), or the peer is gone. Without Done and without an abort of our own, the
// receiver stopped early: the transfer fails.
func (x *xfer) rmaReleased(done bool) {
	if x.receive || x.rma.mode != rmaOffered || x.rma.exposure.final {
		return
	}
	x.endExposure()
	switch {
	case x.aborting:
		x.maybeResolve()
	case done:
		x.progress(x.plan.Bytes())
	default:
		x.abort(&RequestError{ID: x.h.id, Err: fmt.Errorf("%w: the receiver stopped reading the offered pool before it completed", ErrPeerAborted)},
			0, x.eng.cfg.CancelGrace)
	}
}

// rmaPeerLost: a lost peer cannot read the pool any more (the Transport's word on a lost peer),
// so the exposure ends; the abort that follows fails the transfer.
func (x *xfer) rmaPeerLost() {
	if x.receive || x.rma.mode != rmaOffered || x.rma.exposure.final {
		return
	}
	x.endExposure()
}
