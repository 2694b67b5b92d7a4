// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/queue"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// xfer is one sub-transfer: one peer's share of a handle. It keeps what every path shares: the
// loop and its timers, the chunk schedule, the mailbox, abort, quarantine and poison
// (xfer_end.go); how its bytes move is its path (path.go). Its own goroutine (run) owns every
// field below the line; other goroutines reach it only through its mailbox and stop.
type xfer struct {
	h        *Handle
	eng      *Engine
	sub      int    // index in the handle
	wireSub  uint16 // sub index on the wire: ours when receiving, the receiver's when sending
	receive  bool
	peer     Peer
	plan     *layout.Plan
	mover    Mover
	pool     []byte     // the caller's pool (direct path)
	dev      DevicePool // the caller's device pool instead (device.go)
	hostPool bool       // no Mover and no device pool: the pool is host memory moved through the plan
	hasMover bool       // the spec has a Mover (a device pool may stage through it)
	timeout  time.Duration
	m        machine // written only through Handle.subApplyLocked / cancel, under h.mu
	stream   bool
	signals  []LayerSignal // streaming Send: polled, never waited on
	held     []int         // partial Receive: positions of the full block list already held
	heldOf   int           // partial Receive: length of the full block list
	secret   []byte        // Spec.Secret: a Send checks claims of it, a Receive proves it (claim.go)
	// exposed: a Send that named no receiver (Expose): peer is empty until its goroutine
	// takes claimer, the peer whose request claimed it (expose.go). claimer and unexposed
	// (no claim taken any more) are e.mu's.
	exposed   bool
	claimer   Peer
	unexposed bool
	// oneHop: the pool's key and generation word an exposure put in its params (onehop.go),
	// set before its goroutine starts; params: a Receive's Spec.Params.
	oneHop *oneHopHold
	params transport.Params
	// section: the params' Exposure section as parsed (oneHopSection), nil until asked.
	section *parsedSection
	// layersReady is how many leading layers this sub has scattered (Receive).
	layersReady atomic.Int64
	// pathShown is the kind of path, for Handle.Path (written by its goroutine through take).
	pathShown atomic.Int32
	// pulled: the staging path runs on the pull wire (path_pull.go), for Handle.Pulled.
	pulled atomic.Bool
	// admitted: the sub holds one of the engine's MaxConcurrent tokens (its goroutine's).
	admitted bool
	// peerFeatures: what the peer speaks (negotiate.go), set by the goroutine before it
	// chooses a path.
	peerFeatures feature
	// ident is the wire name (wireSub, nonce) as last published by the goroutine, and
	// farewell that a peer's goodbye named it (goodbye.go); both read by the inbound handler.
	ident    atomic.Pointer[wireIdent]
	farewell atomic.Bool
	// heard: a Receive heard from its sender (a message of its nonce, a chunk), so a goodbye
	// entry without a nonce (a Send that never had a request) cannot be about it (goodbye.go).
	heard atomic.Bool

	box       queue.Queue[event] // its mailbox: a push never blocks, so transport callbacks and the inbound handler never wait on a transfer
	qctx      context.Context
	qcancel   context.CancelFunc
	stopOnce  sync.Once
	stopCh    chan struct{}
	stopCause error // written before stopCh closes
	// lostCause: the transport lost the peer (lostQueued), written before qctx is cancelled.
	lostCause atomic.Pointer[error]
	// abortCause: the receiver aborted the request this Send took and waits on in Queued
	// (abortQueued), written before qctx is cancelled.
	abortCause atomic.Pointer[error]

	// ---- owned by the run goroutine ----
	scratch     []event // events being handled, reused between wake-ups
	backlog     []event
	ops         []*opRec
	outstanding int
	spare       []*opRec // staging records done with, for the next chunk (stagingRec)
	moving      int      // staging chunks with the mover workers (mover_pool.go): their slots and blocks are not quiescent
	chunk       int64
	nChunks     int
	layerCut    bool  // chunks also end at layer boundaries
	perLayer    int64 // stream bytes of one layer
	cutPerLayer int   // chunks per layer when layerCut
	cutChunk    int64 // their size (the last of a layer may be smaller)
	readyBytes  int64 // Send: stream bytes [0, readyBytes) may be gathered
	nextSignal  int   // Send: first signal not yet fired
	idle        []*buffer.Slot
	recvSeen    []bool // streaming Receive: chunks scattered, to find the ready prefix
	recvPrefix  int
	awaiting    bool // counted in Engine.awaiting
	nextSeq     int
	moved       int // chunks fully handled
	doneMsg     bool
	aborting    bool
	heldAbort   wire.AbortCode // a cancelling receiver's abort, held until its operations end (xfer_end.go)
	toldPeer    bool           // an abort of this transfer went to the peer (sendAbort)
	queuedCause error          // why it left Queued ended (queuedExit), for the abort a Send owes its receiver
	drainPosted bool           // an aborting staging receiver posted and cancelled its next receive (drainAhead)
	movingPeer  int            // copies on the movers that read the peer's memory in place (of moving)
	// standbyUntil is the end of the movers' standby window its Engine.start opened for its
	// read in place (moverPool.standby) at standbyFrom (Unix ns), which its copy ends
	// (copyShared); 0: none.
	standbyUntil, standbyFrom int64
	cause                     error
	quarantined               bool
	ended                     bool
	// path moves the bytes (path.go): staging, direct or RMA, on this side; nil until picked.
	path path
	// blocksUnknown: a direct operation's memory verdict was unknown; the transfer never
	// resolves its quarantine (L9, L10).
	blocksUnknown bool
	// slotPoisoned: a staging slot of the transfer was poisoned; its goodbye leaves it out.
	slotPoisoned bool
	retries      int
	timers       timers

	// nonce is the transfer's generation on the wire (package wire): drawn by the receiver (set
	// before the goroutine starts), taken from its request-info by the sender; every message
	// and tag carries it.
	nonce uint64
	// releaseTags gives back the data tags a receive reserved (transport.TagReserver), or is nil.
	releaseTags func()
}

// opRec is one posted send or receive and the slot it uses.
type opRec struct {
	id    transport.OpID
	seq   int
	slot  *buffer.Slot
	final bool
	gen   uint64 // a generation read (rma_gen.go): the word's value, set before its event is pushed
	// The staging path's copy (mover_pool.go): stream bytes [off, off+len(buf)) gathered into
	// buf (sender) or scattered out of it (receiver); moveErr is its result, written by the
	// mover worker before it pushes the event.
	off     int64
	buf     []byte
	moveErr error
	// unmap ends the view of the sender's slot that buf lies in (the pull wire reading a
	// mapped slot in place, path_pull.go); nil: buf is in rec's own slot. inPlace: the chunk
	// was read so (its SlotTaken goes once the scatter is done).
	unmap   func()
	inPlace bool
	// batch are RMA ranges read in place (rma_inplace.go): the mover copies each out of buf,
	// the sender's pool as mapped here, into the pool.
	batch []rmaRegion
	// vec is the offered pool's plan where batch are chunks of the stream whose small pieces
	// are copied one by one (rma_vector.go, copyPieces); nil: batch are pool ranges.
	vec *layout.Plan
	// share is a short request's ranges read in place, which this record's copy takes one by
	// one with the other participants' (rma_inplace.go); the copy sets batch to those it
	// copied.
	share *inPlaceShare
	// done is a staging record's completion callback, made once (stagingRec); listed: it is
	// in x.ops.
	done   func(transport.Completion)
	listed bool
}

type event struct {
	op    *opRec
	c     transport.Completion
	msg   wire.Message
	lost  error
	ready bool // the caller marked more layers ready
	moved bool // op's staging copy ended (mover_pool.go)
	early bool // msg is an abort the engine held with the request it follows
	// goodbye: the peer's goodbye named this transfer (goodbye.go)
	goodbye bool
}

// stop wakes the transfer's goroutine with a reason to end (cancel, sibling failure, close).
// It never blocks and only the first reason counts.
func (x *xfer) stop(cause error) {
	x.stopOnce.Do(func() {
		x.stopCause = cause
		close(x.stopCh)
		if x.qcancel != nil {
			x.qcancel()
		}
	})
}

func (x *xfer) log() *zap.Logger {
	return x.eng.log.With(zap.Uint64("request", uint64(x.h.id)), zap.Int("sub", x.sub), zap.String("peer", x.peer.Short()))
}

// apply moves this sub-transfer through the table under the handle's lock.
func (x *xfer) apply(ev Event, cause error) bool {
	if ev != evAdvertise && ev != evProgress {
		x.endOneHop() // onehop.go: before the blocks can be reported quiescent
	}
	x.h.mu.Lock()
	defer x.h.mu.Unlock()
	return x.h.subApplyLocked(x, ev, cause)
}

// head is the header of this transfer's messages.
func (x *xfer) head() wire.Header {
	return wire.Header{Sub: x.wireSub, Request: x.h.id, Nonce: x.nonce}
}

// tag is the data tag of chunk seq.
func (x *xfer) tag(seq int) transport.Tag {
	return transport.Tag{Request: x.h.id, Sub: x.wireSub, Seq: uint32(seq), Nonce: x.nonce}
}

// ours reports whether a message from the peer belongs to this transfer: its nonce is ours.
// A sender takes its nonce from the request it answers, so before that nothing is its own.
func (x *xfer) ours(h wire.Header) bool {
	if x.nonce != 0 && h.Nonce == x.nonce {
		return true
	}
	x.eng.stale.Add(1)
	x.log().Debug("dropping a message of another transfer with this request id",
		zap.Uint8("kind", uint8(h.Kind)), zap.Uint64("nonce", h.Nonce), zap.Uint64("ours", x.nonce))
	return false
}

// maxNonceDraws bounds how often a receive draws a nonce whose tags collide (transport.TagReserver).
// With a 28-bit tag hash, 10,000 live transfers collide with a fresh draw about once in
// 27,000; eight collisions in a row mean the tag space is full.
const maxNonceDraws = 8

// reserveTags reserves the receive's data tags where the transport can collide, drawing
// another nonce on a collision. It reports false (the transfer ended) if no nonce fits.
func (x *xfer) reserveTags() bool {
	tr, ok := x.eng.tr.(transport.TagReserver)
	if !ok {
		return true
	}
	var err error
	for range maxNonceDraws {
		var release func()
		if release, err = tr.ReserveTags(x.peer, x.tag(0)); err == nil {
			x.releaseTags = release
			return true
		}
		if !errors.Is(err, errTagCollision) {
			break
		}
		x.nonce = wire.NewNonce()
		x.publishIdent()
	}
	x.queuedExit(&requestError{ID: x.h.id, Err: transportErr(err)})
	return false
}

// giveBackTags releases the reserved tags once nothing of the transfer can match them: a
// transfer that ends with operations the transport never finished keeps them for good.
func (x *xfer) giveBackTags() {
	if x.releaseTags != nil && x.outstanding == 0 && !x.blocksUnknown {
		x.releaseTags()
	}
}

func (x *xfer) run() {
	x.stamp("goroutine runs")
	defer x.eng.driverDone(x)
	defer x.rememberEnded() // goodbye.go
	defer x.giveBackTags()
	defer func() {
		if x.admitted {
			<-x.eng.admission
		}
	}()
	defer x.setAwaiting(false)
	defer x.qcancel()
	defer x.timers.stop()
	// A request with a peer the transport lost fails at once: a Receive before any hello or
	// request goes to an address nobody answers (UCX would retry the connection until
	// QueueTimeout), a Send before it waits QueueTimeout for a request a dead receiver never
	// sends. A live receiver (a false alarm) speaks again, which clears the loss; its request
	// for this Send is answered with an abort at once (rememberUnanswered). A loss reported
	// after this check finds the route: its report is in the mailbox, and lostQueued ends
	// whatever queued wait this transfer is in (OnPeerLost).
	if err := x.eng.PeerLost(x.peer); err != nil {
		cause := &requestError{ID: x.h.id, Err: err}
		x.queuedExit(cause)
		if !x.receive {
			x.eng.rememberUnanswered(routeKey{x.peer, x.h.id}, wire.AbortInternal, cause)
		}
		return
	}
	if x.receive {
		x.runReceive()
	} else {
		x.runSend()
	}
}

// queuedExit ends a transfer that never left Queued.
func (x *xfer) queuedExit(cause error) {
	x.queuedCause = cause
	ev := evFail
	if errors.Is(cause, ErrCancelled) {
		ev = evCancelQueued
	}
	x.apply(ev, cause)
}

// queueErr explains why the queued phase ended.
func (x *xfer) queueErr(err error) error {
	select {
	case <-x.stopCh:
		return x.stopCause
	default:
	}
	if lost := x.lostCause.Load(); lost != nil {
		return &requestError{ID: x.h.id, Err: *lost}
	}
	if ab := x.abortCause.Load(); ab != nil {
		return *ab
	}
	return &requestError{ID: x.h.id, Err: fmt.Errorf("%w: %w", ErrQueueTimeout, err)}
}

// lostQueued ends the queued phase's waits (for a hello, a request, one of MaxConcurrent, a
// staging slot) for the loss of the peer, reported by the transport: a transfer with a dead
// peer must not wait out QueueTimeout for it (L11). Past the queued phase it changes nothing:
// the loss in the mailbox ends the transfer then. It never blocks.
func (x *xfer) lostQueued(err error) {
	x.lostCause.CompareAndSwap(nil, &err)
	x.qcancel()
}

// abortQueued ends the queued phase's waits (for the receiver's hello, one of MaxConcurrent,
// a staging slot) of a Send whose receiver aborted the request it took: its nonce and sub are
// the request's. A Send would only give up on it the moment it started, so it must not wait
// out QueueTimeout first (L11). The inbound handler calls it after it pushed m, and the Send
// publishes the request's name before it looks at its mailbox again, so one of the two sees
// the abort. Anything else changes nothing: the loop handles the abort in the mailbox. It
// never blocks.
func (x *xfer) abortQueued(m *wire.Abort) {
	if x.receive || x.m.load() != Queued {
		return
	}
	if id := x.ident.Load(); id == nil || id.nonce == 0 || id.nonce != m.Nonce || id.sub != m.Sub {
		return
	}
	err := peerAbortErr(x.h.id, m, true)
	x.abortCause.CompareAndSwap(nil, &err)
	x.qcancel()
}

// lease takes the first slot (waiting, bounded by the queue context), advertises and puts the
// transfer on staging path p. It returns false if the transfer ended instead.
func (x *xfer) lease(p path) (*buffer.Slot, bool) {
	if !x.admit() {
		return nil, false
	}
	slot, err := x.eng.pool.Lease(x.qctx)
	if err != nil {
		x.queuedExit(x.queueErr(err))
		return nil, false
	}
	if err := x.stopping(); err != nil {
		releaseSlot(slot)
		x.queuedExit(err)
		return nil, false
	}
	if !x.apply(evAdvertise, nil) { // cancelled while we waited
		releaseSlot(slot)
		return nil, false
	}
	x.take(p)
	x.qcancel() // the queued phase is over; free its timer now, not when the transfer ends
	return slot, true
}

// admit waits, bounded by the queue context, for one of the engine's MaxConcurrent tokens: the
// sub-transfer keeps it until its goroutine ends, staging or one-copy alike. It returns false
// if the transfer ended instead.
func (x *xfer) admit() bool {
	select {
	case x.eng.admission <- struct{}{}:
		x.admitted = true
		if err := x.stopping(); err != nil {
			x.queuedExit(err)
			return false
		}
		return true
	case <-x.qctx.Done():
		x.queuedExit(x.queueErr(context.Cause(x.qctx)))
		return false
	}
}

// stopping says why a transfer that just got what it waited for in Queued (one of
// MaxConcurrent, a staging slot) must not start: it was stopped as it got it (select picks at
// random), or its engine is closing (Close stops every transfer, one after another: one it
// has not stopped yet must not take what another it stopped gave back, and start). Else nil.
func (x *xfer) stopping() error {
	if x.qctx.Err() != nil {
		return x.queueErr(context.Cause(x.qctx))
	}
	if x.eng.isClosed() {
		return &requestError{ID: x.h.id, Err: ErrClosed}
	}
	return nil
}

// extraSlots takes up to depth-1 more slots, only if free: a transfer never waits for a second
// slot while holding one, so a pool of MaxConcurrent slots always makes progress.
func (x *xfer) extraSlots(first *buffer.Slot) []*buffer.Slot {
	slots := []*buffer.Slot{first}
	for len(slots) < min(x.eng.cfg.Tuning.PipelineDepth, x.nChunks) {
		s, err := x.eng.pool.TryLease()
		if err != nil {
			break
		}
		slots = append(slots, s)
	}
	return slots
}

func (x *xfer) payloadCap() int64 {
	c := x.eng.cfg.SlotBytes - transport.DataHeaderBytes
	return c - c%x.plan.Layout().ElemSize
}

// setChunks fixes the chunk schedule both sides derive from the request-info: chunks of
// chunk bytes, and with layerCut also ending at every layer boundary, so a streaming sender
// never holds a ready layer back for the next one. Arithmetic, not a table: thousands of
// small transfers in flight allocate nothing for it.
func (x *xfer) setChunks(chunk int64, layerCut bool) {
	x.chunk = chunk
	x.perLayer = x.plan.Bytes() / x.plan.Selection().Layers()
	x.layerCut = layerCut && x.perLayer > 0
	if x.layerCut {
		// Split each layer evenly: a 16 MiB layer in 4 MiB slots is five chunks of 3.2 MiB,
		// not four full ones and a 200-byte straggler that costs a message of its own.
		k := (x.perLayer + chunk - 1) / chunk
		elem := x.plan.Layout().ElemSize
		cut := (x.perLayer + k - 1) / k
		x.cutChunk = (cut + elem - 1) / elem * elem // still <= chunk, which is whole elements
		x.cutPerLayer = int((x.perLayer + x.cutChunk - 1) / x.cutChunk)
		x.nChunks = x.cutPerLayer * int(x.plan.Selection().Layers())
		return
	}
	x.nChunks = int((x.plan.Bytes() + chunk - 1) / chunk)
}

func (x *xfer) chunkRange(seq int) (off, n int64) {
	if x.layerCut {
		layer, i := int64(seq/x.cutPerLayer), int64(seq%x.cutPerLayer)
		in := i * x.cutChunk
		return layer*x.perLayer + in, min(x.cutChunk, x.perLayer-in)
	}
	off = int64(seq) * x.chunk
	return off, min(x.chunk, x.plan.Bytes()-off)
}

// setAwaiting keeps Engine.awaiting in step: a streaming transfer waiting on the model is not
// a stalled one (see Health).
func (x *xfer) setAwaiting(v bool) {
	if v == x.awaiting {
		return
	}
	x.awaiting = v
	if v {
		x.eng.awaiting.Add(1)
	} else {
		x.eng.awaiting.Add(-1)
	}
}

// updateAwaiting: a streaming Send awaits the model when nothing of it is on the wire and some
// layer is not ready; a streaming Receive (its first sub, so a handle counts once) awaits its
// sender's model for as long as it runs: it cannot tell the two apart, and its deadline
// bounds it either way. Nothing else awaits: a sender whose receiver reads its blocks (the RMA
// mode) waits on a peer that may be frozen, and is stalled when no Done comes (L12).
func (x *xfer) updateAwaiting() {
	live := x.stream && !x.aborting && !x.ended
	if x.receive {
		x.setAwaiting(live && x.sub == 0)
		return
	}
	x.setAwaiting(live && x.outstanding == 0 && x.readyBytes < x.plan.Bytes())
}

// posted records chunk rec.seq's operation, just posted as id, as outstanding and moves on
// to the next chunk; every path (staging, direct, RMA) posts through it.
func (x *xfer) posted(rec *opRec, id transport.OpID) {
	rec.id = id
	x.ops = append(x.ops, rec)
	x.outstanding++
	x.nextSeq++
}

// releaseSlot releases a slot; nil (a direct transfer's pipeline place) holds nothing.
func releaseSlot(s *buffer.Slot) {
	if s != nil {
		_ = s.Release()
	}
}

func releaseAll(slots []*buffer.Slot) {
	for _, s := range slots {
		releaseSlot(s)
	}
}

// releaseIdle returns the slots that waited for readiness; the transport never saw them.
func (x *xfer) releaseIdle() {
	releaseAll(x.idle)
	clear(x.idle)
	x.idle = x.idle[:0]
}

// ---- shared by both sides and every path ----

func (x *xfer) progress(n int64) {
	x.heard.Store(true)
	x.moved++
	x.h.bytes.Add(n)
	now := time.Now()
	x.eng.stallFrom.Store(now.UnixNano())
	if x.m.load() == Advertised {
		x.apply(evProgress, nil)
	}
	x.eng.obs.OnProgress(x.h.id, n, now)
}

// loop runs the advertised and in-flight phases, then waits out an abort. Every wait is
// bounded: the deadline always fires, and after it the quarantine timeout (or Close) does.
func (x *xfer) loop() {
	start := time.Now()
	x.timers.deadline = start.Add(x.timeout)
	stop := x.stopCh
	backoff := x.eng.cfg.Tuning.RetryInterval
	if x.receive && x.eng.cfg.Tuning.MaxRetries > 0 {
		x.timers.retry = start.Add(backoff)
	}
	var closing <-chan struct{}
	ready := x.box.Ready()
	for _, ev := range x.backlog {
		x.handleEvent(ev)
	}
	x.backlog = nil
	x.onReady() // layers marked before the request came
	for !x.ended {
		if x.aborting {
			closing = x.eng.closing
			x.timers.retry = time.Time{}
			x.timers.poll = time.Time{}
		} else if !x.receive && x.nextSignal < len(x.signals) && x.timers.poll.IsZero() {
			x.timers.poll = time.Now().Add(x.eng.cfg.Tuning.ReadyPollInterval)
		}
		x.updateAwaiting()
		if stop != nil && chanClosed(stop) {
			// A stop goes before any event already waiting (select picks at random): after
			// Engine.Close's grace the transport may unmap the slots, and only a transfer
			// that is not aborting still writes a chunk header into one or reads one.
			stop = nil
			x.stopped()
			continue
		}
		x.timers.arm()
		select {
		case <-ready:
			x.scratch = x.box.Take(x.scratch)
			for _, ev := range x.scratch {
				x.handleEvent(ev)
			}
			clear(x.scratch)
		case <-stop:
			stop = nil
			x.stopped()
		case <-closing:
			closing = nil
			// The force close reported its verdicts before the signal: take them first, so
			// only operations it never proved done are poisoned (select picks at random).
			x.scratch = x.box.Take(x.scratch)
			for _, ev := range x.scratch {
				x.handleEvent(ev)
			}
			clear(x.scratch)
			if !x.ended {
				x.quarantine()
				x.poisonOutstanding("engine closed: the force-closed transport never proved it was done")
			}
		case now := <-x.timers.C():
			x.timerFired(now, &backoff)
		}
	}
}

// timerFired runs the timers that came due, after the events already in the mailbox: on a
// loaded host the loop can wake late with both a lapsed grace and the completions that ended
// its operations in time waiting (select picks at random), and the completions must win, or a
// transfer whose operations all ended is quarantined (CI: a mem transfer's failure in flight
// reported as a quarantine).
func (x *xfer) timerFired(now time.Time, backoff *time.Duration) {
	x.timers.fired()
	x.scratch = x.box.Take(x.scratch)
	for _, ev := range x.scratch {
		x.handleEvent(ev)
	}
	clear(x.scratch)
	if !x.ended {
		x.timersDue(now, backoff)
	}
}

// stopped aborts the transfer for the reason stop gave it.
func (x *xfer) stopped() {
	code := wire.AbortCancelled
	if errors.Is(x.stopCause, ErrClosed) {
		code = wire.AbortClosed
	}
	x.abort(x.stopCause, code, x.eng.cfg.Tuning.CancelGrace)
}

// timersDue runs whatever the transfer's timer was set for and has come due.
func (x *xfer) timersDue(now time.Time, backoff *time.Duration) {
	if due(&x.timers.deadline, now) {
		x.abort(&requestError{ID: x.h.id, Err: fmt.Errorf("%w: %v after the first slot lease", ErrDeadline, x.timeout)}, wire.AbortDeadline, 0)
	}
	if due(&x.timers.retry, now) && x.moved == 0 && !x.aborting && x.retries < x.eng.cfg.Tuning.MaxRetries {
		x.retries++
		x.sendRequestInfo()
		*backoff *= 2
		x.timers.retry = now.Add(*backoff)
	}
	if due(&x.timers.grace, now) {
		x.quarantine()
	}
	if due(&x.timers.quarantine, now) {
		x.poisonOutstanding("quarantine timeout: the transport never proved it was done")
	}
	if due(&x.timers.poll, now) {
		x.onReady()
	}
}

func (x *xfer) handleEvent(ev event) {
	if x.ended {
		return
	}
	switch {
	case ev.op != nil && ev.moved:
		x.stamp("copy event on loop")
		x.movedDone(ev.op)
	case ev.op != nil:
		x.opDone(ev.op, ev.c)
	case ev.lost != nil:
		if p, ok := x.path.(peerTalk); ok {
			p.peerLost()
		}
		if x.aborting {
			// Already aborting (its deadline, a cancel): the abort below is a no-op, and what the
			// lost peer could still read ended just now (an RMA exposure): resolve on it, or a
			// transfer quarantined before its peer died holds its blocks until its quarantine's
			// timeout.
			x.maybeResolve()
			return
		}
		x.abort(&requestError{ID: x.h.id, Err: ev.lost}, 0, x.eng.cfg.Tuning.CancelGrace)
	case ev.ready:
		x.onReady()
	case ev.goodbye:
		x.peerLeft()
	case ev.msg != nil:
		if !x.ours(ev.msg.Head()) {
			return
		}
		x.heard.Store(true)
		x.stampLoop(ev.msg)
		switch m := ev.msg.(type) {
		case *wire.Abort:
			if m.Sub != x.wireSub && x.receive {
				return
			}
			_ = x.eng.tr.SendControl(x.peer, wire.Encode(&wire.AbortAck{Header: x.head()}))
			x.abort(peerAbortErr(x.h.id, m, !x.receive), 0, x.eng.cfg.Tuning.CancelGrace)
		case *wire.Done:
			if !x.receive {
				x.doneMsg = true
				x.tellPath(m)
				x.maybeSent()
			}
		case *wire.RequestInfo, *wire.RMAOffer, *wire.RMARelease, *wire.Slots, *wire.SlotReady, *wire.SlotTaken:
			// A repeated request (the receiver retries) must not start anything twice (L8):
			// only a path the peer talks to (the RMA mode) answers it.
			x.tellPath(m)
		case *wire.AbortAck:
			// An ack needs nothing: each side owns its own slots.
		}
	}
}

func (x *xfer) opDone(rec *opRec, c transport.Completion) {
	if rec.final {
		x.log().Warn("transport reported an operation after its final completion", zap.Int("seq", rec.seq))
		return
	}
	switch c.Memory {
	case transport.MemoryBusy:
		if !x.aborting {
			x.abort(transportErr(c.Err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		}
		return
	case transport.MemoryUnknown:
		rec.final = true
		x.outstanding--
		x.poison(rec, fmt.Sprintf("transport cannot say whether it is done with seq %d: %v", rec.seq, c.Err))
		if !x.aborting {
			x.abort(transportErr(c.Err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		} else {
			x.maybeResolve()
		}
		return
	}
	rec.final = true
	x.outstanding--
	switch {
	case x.aborting:
		// A staging receive that took its chunk ended before the abort's cancel reached the
		// transport (its completion was still on its way here), so that cancel drained
		// nothing: the sender, a pipeline ahead, may have sent the chunks past it, as when
		// every slot was scattering (drainAhead).
		if c.Err == nil && x.drainAhead(rec.slot) {
			return
		}
		releaseSlot(rec.slot)
		x.maybeResolve()
	case c.Err != nil:
		releaseSlot(rec.slot)
		x.abort(transportErr(c.Err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
	default:
		x.path.completed(rec, c)
	}
}

// tellPath hands the peer's message about the path to a path that listens (peerTalk).
func (x *xfer) tellPath(m wire.Message) {
	if p, ok := x.path.(peerTalk); ok {
		p.fromPeer(m)
	}
}
