// SPDX-License-Identifier: Apache-2.0

package transfer

// The staging path's pull wire (the protocol is in wire/pull.go; docs/staging.md says when it
// runs): the sender gathers each chunk into a slot of its staging memory as on the plain
// staging path, but announces it (SlotReady) instead of sending it, and the receiver reads it
// with one RMA get into a slot of its own, says so (SlotTaken) and scatters it. Over UCX 1.13
// shared memory with peer error handling a tagged message is copied through the receiver's
// FIFO in 8 KiB pieces, twice; a get from memory UCX mapped is one memcpy.
//
// The lifecycle is the staging path's: each announced chunk is an operation of the sender
// (id 0: no transport operation; Cancel ignores it) whose slot the receiver may read until it
// ends. It ends well with the receiver's SlotTaken or Done, and otherwise only when the
// receiver cannot read it any more: its RMARelease (sent once its own gets are final) or the
// transport's report that it is lost. An exposure nobody ends is quarantined and its slot
// poisoned like any operation the transport never finished (L9, L10).

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// slotExposure is the engine's staging memory as the pull wire exposes it to peers' gets.
type slotExposure struct {
	mem    []byte
	mapped bool // the transport may read and write it in place (transport.DirectTransport.Direct)
	once   sync.Once
	addr   uint64
	key    []byte
	err    error
}

// slotKey describes the staging memory for a peer's gets, packed once.
func (e *Engine) slotKey() (uint64, []byte, error) {
	s := &e.slots
	s.once.Do(func() {
		rt := e.gets()
		switch {
		case rt == nil:
			s.err = errors.New("this sender's transport has no rma gets")
		case !s.mapped:
			s.err = errors.New("this sender's staging memory is not mapped by its transport (Config.StagingMemory: use the transport's staging memory)")
		default:
			s.addr, s.key, s.err = rt.RMAKey(s.mem)
		}
	})
	return s.addr, s.key, s.err
}

// Pulled reports, without blocking, whether the staging path moves this transfer's chunks on
// the pull wire (the receiver reads each out of the sender's slot with a get: Config.Tuning.DisablePull)
// rather than as tagged messages; for a multi-peer Receive, whether any sub-transfer does.
// Handle.Path still says PathStaging.
func (h *Handle) Pulled() bool {
	for _, x := range h.subs {
		if x.pulled.Load() {
			return true
		}
	}
	return false
}

// pullMapper is what shows a pull receiver the sender's slots in place, or nil: the transport
// maps peers' memory (transport.RMAMapper), DisableInPlaceReads is off, and the Mover scatters from any
// host memory (anySourceScatterer).
func (x *xfer) pullMapper() transport.RMAMapper {
	mp, ok := x.eng.tr.(transport.RMAMapper)
	if !ok || x.eng.cfg.Tuning.DisableInPlaceReads {
		return nil
	}
	if a, ok := x.mover.(anySourceScatterer); !ok || !a.ScatterReadsAnyHostMemory() {
		return nil
	}
	return mp
}

// pullWanted reports whether a staging receiver asks for the pull wire.
func (x *xfer) pullWanted() bool {
	e := x.eng
	if e.cfg.Tuning.DisablePull || !e.slots.mapped || e.speech.features&wire.FeatureSlotPull == 0 || !x.peerHas(wire.FeatureSlotPull) {
		return false
	}
	rt := e.gets()
	if rt == nil || x.rmaGenerations() == nil { // a validated offer must be checkable here
		return false
	}
	return !x.getsEmulated(rt)
}

// ---- receiving side ----

// pullReceive is the receiving side of the pull wire. Its free slots wait in x.idle (an abort
// gives them back); a chunk announced before a slot is free waits in queue.
type pullReceive struct {
	x       *xfer
	pulling bool // the sender's slots are in hand
	key     []byte
	addr    uint64
	bytes   int64
	queue   []wire.SlotReady // announced, not yet read
	seen    []bool           // announced, by seq
	// mapper shows the sender's slots in this process (transport.RMAMapper): the scatter then reads
	// each chunk in place, one copy fewer than a get into a slot; nil once a slot is not mapped
	// here, or when the Mover may need its source in a slot (anySourceScatterer).
	mapper   transport.RMAMapper
	genCheck // a validated offer's generation word, read after the last chunk (rma_gen.go)
}

var (
	_ path         = (*pullReceive)(nil)
	_ stagedPath   = (*pullReceive)(nil)
	_ peerTalk     = (*pullReceive)(nil)
	_ awaitsAnswer = (*pullReceive)(nil)
	_ requestFlags = (*pullReceive)(nil)
	_ path         = (*pullSend)(nil)
	_ stagedPath   = (*pullSend)(nil)
	_ peerTalk     = (*pullSend)(nil)
)

// runReceivePull runs a staging receive on the pull wire with the slots it leased: the
// request asks for the sender's slots, and nothing is posted until the answer.
func (x *xfer) runReceivePull(slots []*buffer.Slot) {
	r := &pullReceive{x: x, seen: make([]bool, x.nChunks)}
	x.idle = append(x.idle, slots...)
	x.take(r)
	x.sendRequestInfo()
	x.loop()
	// Unless it completed, tell the sender its slots will not be read again: every get of
	// ours is final (or given up with its slot poisoned). A sender that declined, or never
	// exposed a slot, ignores it.
	if x.m.load() != Completed {
		_ = x.eng.tr.SendControl(x.peer, wire.Encode(&wire.RMARelease{Header: x.head()}))
	}
}

func (*pullReceive) kind() Path { return PathStaging }

// request asks for the sender's slots while they are not in hand.
func (r *pullReceive) request(ri *wire.RequestInfo) bool {
	if r.pulling {
		return false
	}
	ri.Flags |= wire.FlagPull
	return true
}

func (r *pullReceive) fromPeer(m wire.Message) {
	switch m := m.(type) {
	case *wire.Slots:
		r.offered(m)
	case *wire.SlotReady:
		r.announced(m)
	}
}

func (*pullReceive) peerLost() {}

// takeDeclined implements awaitsAnswer: before the sender's slots are in hand, a receive of
// a data message into each slot this receiver holds, as a decline would have posted.
func (r *pullReceive) takeDeclined() {
	x := r.x
	if r.pulling || len(r.queue) > 0 {
		return // the answer came: the sender announces its chunks, and sends none
	}
	p := stagingReceive{x}
	for len(x.idle) > 0 && x.idle[0] != nil && x.nextSeq < x.nChunks {
		s := x.idle[0]
		x.idle = x.idle[1:]
		if !p.postChunk(s) {
			return
		}
	}
}

// protocol fails the transfer for a message of the sender's that breaks the pull wire.
func (r *pullReceive) protocol(format string, args ...any) {
	x := r.x
	x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%w: pull wire: %s", ErrProtocol, fmt.Sprintf(format, args...))}, wire.AbortProtocol, x.eng.cfg.Tuning.CancelGrace)
}

// offered takes the sender's answer: its slots, or a decline, after which the chunks come as
// data messages into the slots this receiver holds.
func (r *pullReceive) offered(m *wire.Slots) {
	x := r.x
	if r.pulling || x.aborting || m.Sub != x.wireSub {
		return
	}
	if m.Flags&wire.SlotsDeclined != 0 {
		if len(r.queue) > 0 {
			r.protocol("the sender declined after announcing %d chunks", len(r.queue))
			return
		}
		x.take(stagingReceive{x})
		free := x.idle
		x.idle = nil
		for i, s := range free {
			if !x.path.post(s) {
				releaseAll(free[i+1:])
				break
			}
		}
		return
	}
	if p, ok := x.eng.tr.(transport.RMAKeyPreparer); ok {
		if err := p.PrepareKeys(x.peer, m.Key); err != nil {
			x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
			return
		}
	}
	if m.Flags&wire.SlotsValidated != 0 {
		if err := x.rmaGenerations().PrepareReadGeneration(x.peer, m.GenKey); err != nil {
			x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
			return
		}
		r.gen, r.genAddr, r.genKey = m.Generation, m.GenAddr, m.GenKey
	}
	r.pulling, r.key, r.addr, r.bytes = true, m.Key, m.Addr, m.Bytes
	r.mapper = x.pullMapper()
	x.pulled.Store(true)
	r.pump()
}

// announced queues a chunk the sender has gathered, checked against the schedule.
func (r *pullReceive) announced(m *wire.SlotReady) {
	x := r.x
	if x.aborting || m.Sub != x.wireSub {
		return
	}
	seq := int(m.Seq)
	if seq >= x.nChunks || r.seen[seq] {
		r.protocol("chunk %d announced twice or past the %d chunks", seq, x.nChunks)
		return
	}
	if _, n := x.chunkRange(seq); m.Length != wire.DataHeaderBytes+n {
		r.protocol("chunk %d announced with %d bytes, want %d", seq, m.Length, wire.DataHeaderBytes+n)
		return
	}
	r.seen[seq] = true
	r.queue = append(r.queue, *m)
	r.pump()
}

// pump reads announced chunks into free slots.
func (r *pullReceive) pump() {
	x := r.x
	rt := x.eng.gets()
	for r.pulling && !x.aborting && len(r.queue) > 0 && len(x.idle) > 0 {
		m := r.queue[0]
		r.queue = r.queue[1:]
		if m.Offset > r.bytes-m.Length {
			r.protocol("chunk %d at [%d, +%d) lies outside the sender's %d bytes of slots", m.Seq, m.Offset, m.Length, r.bytes)
			return
		}
		slot := x.idle[len(x.idle)-1]
		x.idle = x.idle[:len(x.idle)-1]
		rec := x.stagingRec(int(m.Seq), slot)
		if r.mapper != nil && !r.readInPlace(rec, m) {
			return
		}
		if rec.inPlace {
			continue
		}
		dst := slot.Bytes()[:m.Length:m.Length]
		id, err := rt.PostGet(x.peer, x.tag(rec.seq), r.key, r.addr+uint64(m.Offset), dst, rec.done)
		if err != nil {
			releaseSlot(slot) // never posted
			x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
			return
		}
		x.trackStaging(rec, id)
		x.nextSeq++
	}
}

// readInPlace hands chunk m to the mover to scatter straight out of the sender's slot, mapped
// here, when the transport shows it (rec.unmap set; rec's own slot is only the pipeline
// place). Without a view it leaves rec alone, and the chunk and every later one are read with
// gets. It reports false when the transfer is aborting.
func (r *pullReceive) readInPlace(rec *opRec, m wire.SlotReady) bool {
	x := r.x
	view, release, err := r.mapper.MapRemote(x.peer, r.key, r.addr+uint64(m.Offset), int(m.Length))
	if err != nil {
		releaseSlot(rec.slot)
		x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		return false
	}
	if view == nil {
		r.mapper = nil
		return true
	}
	x.nextSeq++
	if !x.checkChunk(rec, view) { // the slot went back, the transfer aborts
		release()
		return false
	}
	rec.unmap, rec.inPlace = release, true
	x.toMover(rec) // moved sends SlotTaken once the scatter has read the slot
	return true
}

// post takes back a slot whose chunk is scattered: it reads the next announced chunk, or
// waits for one, or goes back to the pool once every chunk is read.
func (r *pullReceive) post(slot *buffer.Slot) bool {
	x := r.x
	if x.nextSeq >= x.nChunks || x.aborting {
		releaseSlot(slot)
		return !x.aborting
	}
	x.idle = append(x.idle, slot)
	r.pump()
	return !x.aborting
}

// completed checks a chunk read out of the sender's slot, frees that slot and scatters it.
func (r *pullReceive) completed(rec *opRec, c transport.Completion) {
	x := r.x
	if r.gotGeneration(x, rec) {
		return
	}
	if !x.checkChunk(rec, rec.slot.Bytes()[:c.Bytes]) {
		return
	}
	_ = x.eng.tr.SendControl(x.peer, wire.Encode(&wire.SlotTaken{Header: x.head(), Seq: uint32(rec.seq)}))
	x.toMover(rec)
}

// moved counts a scattered chunk and reuses its slot. A chunk read in place is taken only now,
// its scatter done with the sender's slot (movedDone ended the view).
func (r *pullReceive) moved(rec *opRec) {
	x := r.x
	if rec.inPlace {
		rec.inPlace = false
		_ = x.eng.tr.SendControl(x.peer, wire.Encode(&wire.SlotTaken{Header: x.head(), Seq: uint32(rec.seq)}))
	}
	x.progress(int64(len(rec.buf)))
	x.markReceived(rec.seq)
	x.spare = append(x.spare, rec)
	if !r.post(rec.slot) {
		return
	}
	// After the last chunk the sender's generation word, fenced behind every read: a read of
	// a slot the sender let go without our word (it believed us lost) precedes a read of the
	// changed word, and the transfer fails instead of completing (rma_gen.go has the rule).
	if x.moved == x.nChunks && !r.readGeneration(x) {
		return
	}
	x.receivedAll()
}

// ---- sending side ----

// pullSend is the sending side of the pull wire: the staging path's gathers, each chunk
// announced instead of sent.
type pullSend struct {
	stagingSend
	offer  []byte // the encoded Slots, sent again when a repeated request shows it lost
	endGen func() // ends the exposure's generation (transport.RMAGenerations); nil: none, or ended
}

// answerPull answers a request with FlagPull: it exposes the staging memory and puts the
// transfer on the pull wire, or declines, saying why, and the chunks go as data messages. It
// reports false if the transfer is aborting.
func (x *xfer) answerPull() bool {
	head := x.head()
	addr, key, err := x.eng.slotKey()
	switch {
	case x.eng.cfg.Tuning.DisablePull:
		err = errors.New("this sender's Config.Tuning.DisablePull is set")
	case x.eng.speech.features&wire.FeatureSlotPull == 0:
		err = errors.New("this sender does not speak the pull wire")
	}
	m := &wire.Slots{Header: head, Addr: addr, Bytes: int64(len(x.eng.slots.mem)), Key: key}
	var endGen func()
	if g := x.rmaGenerations(); err == nil && g != nil {
		m.GenAddr, m.GenKey, m.Generation, endGen, err = g.ExposeGeneration()
		x.noGenerationWord(err) // rma_gen.go
		m.Flags |= wire.SlotsValidated
	}
	var offer []byte
	if err == nil {
		offer, err = m.AppendBinary(nil)
	}
	if err != nil {
		if endGen != nil {
			endGen()
		}
		_ = x.eng.tr.SendControl(x.peer, wire.Encode(&wire.Slots{Header: head, Flags: wire.SlotsDeclined, Reason: err.Error()}))
		return true
	}
	x.take(&pullSend{stagingSend: stagingSend{x}, offer: offer, endGen: endGen})
	x.pulled.Store(true)
	if err := x.eng.tr.SendControl(x.peer, offer); err != nil {
		x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		return false
	}
	return true
}

// moved announces a gathered chunk. From here until it ends the chunk is an operation whose
// slot the receiver may read.
func (p *pullSend) moved(rec *opRec) {
	x := p.x
	buf := x.stampChunk(rec)
	x.trackStaging(rec, 0)
	m := &wire.SlotReady{Header: x.head(), Seq: uint32(rec.seq), Offset: int64(rec.slot.Index()) * x.eng.cfg.SlotBytes, Length: int64(len(buf))}
	if err := x.eng.tr.SendControl(x.peer, wire.Encode(m)); err != nil {
		x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
	}
}

func (p *pullSend) fromPeer(m wire.Message) {
	x := p.x
	switch m := m.(type) {
	case *wire.SlotTaken:
		rec := p.exposed(int(m.Seq))
		if rec == nil {
			if !x.aborting {
				x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%w: pull wire: chunk %d taken but not announced", ErrProtocol, m.Seq)},
					wire.AbortProtocol, x.eng.cfg.Tuning.CancelGrace)
			}
			return
		}
		x.opDone(rec, transport.Completion{Bytes: wire.DataHeaderBytes + len(rec.buf), Memory: transport.MemoryDone})
	case *wire.Done:
		// Every byte arrived: the receiver reads none of the slots again.
		for _, rec := range x.ops {
			if !rec.final {
				x.opDone(rec, transport.Completion{Bytes: wire.DataHeaderBytes + len(rec.buf), Memory: transport.MemoryDone})
			}
		}
	case *wire.RMARelease:
		if !x.aborting {
			x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%w: the receiver stopped reading the slots before it completed", ErrPeerAborted)},
				0, x.eng.cfg.Tuning.CancelGrace)
		}
		p.endExposures()
	case *wire.RequestInfo:
		if m.Flags&wire.FlagPull != 0 && !x.aborting {
			_ = x.eng.tr.SendControl(x.peer, p.offer)
		}
	}
}

// peerLost: a lost peer reads nothing any more (the Transport's word), so the slots it could
// read go back; the abort that follows fails the transfer.
func (p *pullSend) peerLost() { p.endExposures() }

// endExposures ends every announced chunk the receiver has not taken: it will not read them
// (its release), or it is lost and, should the transport be wrong about that, its last read
// of the generation word finds the word changed before any slot is reused.
func (p *pullSend) endExposures() {
	x := p.x
	p.end()
	for _, rec := range x.ops {
		if !rec.final {
			rec.final = true
			x.outstanding--
			releaseSlot(rec.slot)
		}
	}
	if x.aborting {
		x.maybeResolve()
	}
}

// end ends the exposure's generation, once: after endExposures, or when the transfer has
// ended (every slot taken, or poisoned for good).
func (p *pullSend) end() {
	if p.endGen != nil {
		p.endGen()
		p.endGen = nil
	}
}

// exposed returns the announced, not yet taken chunk seq, or nil.
func (p *pullSend) exposed(seq int) *opRec {
	for _, rec := range p.x.ops {
		if !rec.final && rec.seq == seq {
			return rec
		}
	}
	return nil
}
