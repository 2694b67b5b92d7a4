// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/buffer"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Engine runs transfers over one Transport. Every method is safe for concurrent use. Only
// Drain and Close wait, and both are bounded.
type Engine struct {
	cfg  Config
	tr   transport.Transport
	pool *buffer.Pool
	// movers copies staging chunks off the transfers' loops (mover_pool.go).
	movers *moverPool
	log    *zap.Logger
	obs    Observer
	// oq delivers the caller's Observer outside the engine's locks; nil for nopObserver, whose
	// calls cost nothing under a lock.
	oq *observerQueue
	// direct is tr when it implements the one-copy extension, else nil.
	direct transport.DirectTransport
	// slots is the staging memory as the pull wire exposes it (path_pull.go).
	slots slotExposure

	mu      sync.Mutex
	handles map[RequestID]*Handle
	routes  map[routeKey]*xfer
	// exposures are the Sends that named no receiver (Expose), by request id, from Expose
	// until their goroutine ends or gives up on a claim (expose.go).
	exposures  map[RequestID]*xfer
	pending    map[routeKey]pendingInfo
	unanswered map[routeKey]unanswered
	// endedOrder records unanswered's entries in the order they were made (from endedHead on),
	// so that rememberEnded expires and evicts from the oldest without a scan of the table; a
	// record whose entry left the table or was made again is skipped (engine_inbound.go).
	endedOrder []endedRecord
	endedHead  int
	endedSeq   uint64
	peers      map[Peer]*peerHello // what each peer met said in its hello (negotiate.go)
	// lost are the peers the transport reported lost and not heard from since: each told to
	// the observer once however many times the transport reports it, and refused to new
	// Receives for Config.Tuning.LostPeerTTL (engine_inbound.go).
	lost    map[Peer]lostPeer
	goodbye goodbyeState // goodbye.go
	// unproven are the addresses the engine connected to only to answer a hello or challenge
	// that named them (unproven.go).
	unproven unprovenState
	closed   bool
	// speech is what the engine says in its hello: the build's versions and features.
	speech speech
	// keys seal and open the hello handshake; nil without Config.ClusterKeys.
	keys *wire.Keyring
	// incarnation names this life of the engine in its claims (a receiver's proof is bound to
	// it); drawn at New.
	incarnation uint64

	// admission holds one token per sub-transfer past Queued (Config.MaxConcurrent), taken
	// before the first slot lease or the one-copy start and given back when its goroutine ends.
	admission chan struct{}

	closing chan struct{} // closed once the transport is force-closed during Close

	// peerCopy is nil but in tests, which set it before the first transfer to hold a read in
	// place mid-copy (copyFromPeer, rma_inplace.go).
	peerCopy func(dst, src []byte)

	liveDrivers atomic.Int64
	inFlight    atomic.Int64
	quarantined atomic.Int64
	// poisonedForGood counts the quarantined handles the engine gave up on: their caller's
	// blocks are poisoned and they never leave quarantine (L9). Health leaves them out of the
	// quarantine budget.
	poisonedForGood atomic.Int64
	// genDeclines counts the rma and pull offers declined because every generation word of
	// the transport was held (rma_gen.go).
	genDeclines atomic.Int64
	// blocksPoisoned counts the caller's KV blocks those handles poisoned (each block once).
	blocksPoisoned atomic.Int64
	// remembered counts handles whose caller released every reference while they were not
	// quiescent: the engine keeps them, their ids and their blocks until they are (for ever,
	// when poisoned for good).
	remembered atomic.Int64
	holds      blockHolds
	awaiting   atomic.Int64 // streaming transfers waiting on the model, not the wire
	// stallFrom is when the progress clock started (unix nanoseconds): the last byte moved or
	// transfer completed, or, when the engine was idle until then, the first transfer asked
	// for since. lastDemand is the last time a transfer started or ended (Advertised in or
	// out): the engine counts as asked for while one is active or one ended less than a
	// ProgressDeadline ago, so requests that fail one after another are a stall too.
	// lastFailure is the last time a transfer ended without completing, active or still
	// queued (a request that timed out waiting for its peer's hello, its request or
	// admission): Health counts the engine asked for while one did less than a deadline ago.
	stallFrom   atomic.Int64
	lastDemand  atomic.Int64
	lastFailure atomic.Int64
	malformed   atomic.Int64
	stale       atomic.Int64 // messages of another transfer that reused a request id, dropped
	refused     atomic.Int64 // transfers failed because their peer broke the protocol (ErrProtocol)
	// moverWedged is the first error by which a Mover said it cannot tell whether its copy
	// ended (ErrQuiescenceUnknown); Health reports it until the process restarts.
	moverWedged atomic.Pointer[error]
}

// routeKey finds the sub-transfer an inbound message belongs to. A request has at most one
// sub-transfer per peer in an engine, so the pair is unique.
type routeKey struct {
	peer Peer
	id   RequestID
}

type pendingInfo struct {
	info *wire.RequestInfo
	// abort is the receiver's Abort that followed info: it gave up (its deadline, a cancel)
	// before the Send was made. The Send then ends at once instead of starting on a request
	// nobody waits for: on the RMA path it would expose its pool to a receiver that will never
	// read it nor release it, and the blocks could never be freed (L10).
	abort *wire.Abort
	at    time.Time
}

// unanswered is a Send that ended before its receiver's request arrived: a request that
// arrives later is answered with an abort, so the receiver does not wait for its deadline.
type unanswered struct {
	code   wire.AbortCode
	reason string
	at     time.Time
	// An exposure that ended (expose.go), remembered under the empty peer: its secret, which
	// later claims must prove, and whether a receiver had claimed it.
	secret  []byte
	claimed bool
	seq     uint64 // which rememberEnded made it (endedRecord)
}

// endedRecord is one entry of Engine.unanswered in the order of their making: seq tells it from
// a later entry of the same key.
type endedRecord struct {
	key routeKey
	seq uint64
}

// New validates cfg, carves the staging pool and binds the transport (which progresses its
// operations on its own goroutines). The engine owns the transport from here on and closes it in Close.
// It drives the implementation behind tr (internal/transportimpl: ucx.Transport shows a program
// only what it calls), whose optional capabilities it finds by type assertion.
func New(tr Transport, cfg Config) (*Engine, error) {
	impl, ok := transportimpl.Of(tr).(transport.Transport)
	if !ok && tr != nil {
		return nil, &ConfigError{Field: "Transport", Value: fmt.Sprintf("%T", tr),
			Reason: "not a transport a transport package made (it keeps no transport contract)"}
	}
	return newEngine(impl, cfg, buildSpeech())
}

// newEngine is New for an engine that says sp in its hellos.
func newEngine(tr transport.Transport, cfg Config, sp speech) (*Engine, error) {
	if tr == nil {
		return nil, &ConfigError{Field: "Transport", Value: nil, Reason: "a transport is required"}
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	mem := cfg.StagingMemory
	if mem == nil {
		mem = make([]byte, int64(cfg.Tuning.NumSlots)*cfg.SlotBytes)
	}
	pool, err := buffer.New(mem[:int64(cfg.Tuning.NumSlots)*cfg.SlotBytes], buffer.Config{
		SlotBytes: cfg.SlotBytes, Concurrency: cfg.MaxConcurrent, LeaseTimeout: cfg.QueueTimeout, Logger: cfg.Logger})
	if err != nil {
		return nil, &ConfigError{Field: "Tuning.NumSlots", Value: cfg.Tuning.NumSlots, Reason: "the staging pool refused it", Cause: err}
	}
	e := &Engine{
		incarnation: wire.NewNonce(),
		cfg:         cfg, tr: tr, pool: pool, log: cfg.Logger, obs: cfg.Observer,
		handles: make(map[RequestID]*Handle), routes: make(map[routeKey]*xfer), exposures: make(map[RequestID]*xfer), pending: make(map[routeKey]pendingInfo), unanswered: make(map[routeKey]unanswered),
		peers: make(map[Peer]*peerHello), lost: make(map[Peer]lostPeer), speech: sp,
		admission: make(chan struct{}, cfg.MaxConcurrent),
		closing:   make(chan struct{}),
		movers:    newMoverPool(),
	}
	if _, nop := cfg.Observer.(nopObserver); !nop {
		e.oq = newObserverQueue(cfg.Observer) // the caller's callbacks run outside the engine's locks
		e.obs = e.oq
	}
	if len(cfg.ClusterKeys) > 0 {
		e.cfg.ClusterKeys = make([][]byte, len(cfg.ClusterKeys)) // the caller's slices may change
		for i, k := range cfg.ClusterKeys {
			e.cfg.ClusterKeys[i] = bytes.Clone(k)
		}
		if e.keys, err = wire.NewKeyring(cfg.ClusterKeys); err != nil {
			return nil, &ConfigError{Field: "ClusterKeys", Value: len(cfg.ClusterKeys), Reason: "the keys do not make a keyring", Cause: err}
		}
	}
	if cfg.Tuning.RMAWhereEmulated && !cfg.Tuning.DisableRMA && e.gets() == nil {
		if _, ok := tr.(transport.RMATransport); ok {
			return nil, &ConfigError{Field: "Tuning.RMAWhereEmulated", Value: true,
				Reason: "the transport serves no RMA: a UCX transport over TCP only opens UCX without it unless its ucx.Config.ServeEmulatedRMA is set (docs/security.md)"}
		}
	}
	e.direct, _ = tr.(transport.DirectTransport)
	e.slots.mem = mem[:int64(cfg.Tuning.NumSlots)*cfg.SlotBytes]
	e.slots.mapped = e.direct != nil && e.direct.Direct(e.slots.mem)
	e.stallFrom.Store(time.Now().UnixNano())
	if err := tr.Bind(inbound{e}); err != nil {
		return nil, fmt.Errorf("kvxfer: binding the transport: %w", err)
	}
	return e, nil
}

// Send starts sending spec's blocks to spec.Peer when that peer's Receive asks for them
// (either side may call first). It returns at once. ctx bounds only the queued phase: waiting
// for a staging slot and for the receiver's request (at most Config.QueueTimeout); cancelling
// it after the transfer has started has no effect (use Cancel).
func (e *Engine) Send(ctx context.Context, spec Spec) (*Handle, error) {
	h, _, err := e.start(ctx, spec, false, false)
	return h, err
}

// Receive starts receiving spec's blocks from spec.Peer, or from every peer in spec.Subs. It
// returns at once; ctx bounds the queued phase as for Send.
func (e *Engine) Receive(ctx context.Context, spec Spec) (*Handle, error) {
	h, _, err := e.start(ctx, spec, true, false)
	return h, err
}

// start makes and starts a Send (expose: one that names no receiver, expose.go) or a Receive.
func (e *Engine) start(ctx context.Context, spec Spec, receive, expose bool) (*Handle, transport.Params, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	stampSide(spec.ID, receive, "Engine.start")
	resolved := spec
	if expose {
		if err := spec.exposable(); err != nil {
			return nil, nil, err
		}
		if spec.Secret == nil {
			spec.Secret = NewClaimSecret()
		}
		resolved.Peer, resolved.Secret = exposedPeer, spec.Secret // named by the first claim
	}
	subs, mover, timeout, err := resolved.resolve(receive, e.cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := e.checkDeviceSpec(spec); err != nil { // device.go
		return nil, nil, err
	}
	h := &Handle{id: spec.ID, eng: e, queuedAt: time.Now().UnixNano(), done: make(chan struct{}), quiesced: make(chan struct{}), callerRefs: 1, engineRef: true,
		receive: receive, stream: spec.Stream, layers: subs[0].Plan.Selection().Layers()}
	xs := make([]*xfer, len(subs))
	for i, s := range subs {
		h.total.Add(s.Plan.Bytes())
		var nonce uint64 // a sender takes the receiver's, from its request
		if receive {
			nonce = wire.NewNonce()
		}
		xs[i] = &xfer{h: h, eng: e, sub: i, wireSub: uint16(i), nonce: nonce, receive: receive, peer: s.Peer, plan: s.Plan,
			mover: mover, pool: spec.Pool, dev: spec.Device, hostPool: spec.Mover == nil && !spec.Device.set(), hasMover: spec.Mover != nil, timeout: timeout, stopCh: make(chan struct{}),
			stream: spec.Stream, signals: spec.Ready, secret: bytes.Clone(spec.Secret)}
		if receive {
			xs[i].params = spec.Params
		}
		if expose {
			xs[i].peer, xs[i].exposed = "", true
		}
		xs[i].publishIdent()
		if receive && len(spec.Held) > 0 {
			xs[i].heldOf = len(spec.Plan.Blocks())
			xs[i].held = slices.Sorted(slices.Values(spec.Held))
		}
	}
	h.subs = xs
	h.spans = spansOf(spec, subs)
	for _, s := range subs {
		h.nBlocks += int64(len(s.Plan.Blocks()))
	}
	if ph, ok := e.tr.(transport.PoolHolder); ok && spec.Mover == nil && len(spec.Pool) > 0 {
		h.releasePool = ph.HoldPool(spec.Pool) // registered memory stays registered until Quiesced
	}
	if spec.Device.set() {
		h.releasePool = e.holdDevice(spec)
	}
	var params transport.Params
	if expose {
		if params, err = e.exposeParams(spec, subs[0].Plan, xs[0].prepareOneHop()); err != nil {
			h.unhold()
			return nil, nil, err
		}
		h.unclaimed.Store(true)
	}

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		h.unhold()
		return nil, nil, &requestError{ID: spec.ID, Err: ErrClosed}
	}
	if _, dup := e.handles[spec.ID]; dup {
		e.mu.Unlock()
		h.unhold()
		return nil, nil, &requestError{ID: spec.ID, Err: ErrDuplicate}
	}
	if err := e.holds.check(spec.ID, h.spans, receive); err != nil {
		e.mu.Unlock()
		h.unhold()
		return nil, nil, err
	}
	e.handles[spec.ID] = h
	delete(e.unanswered, routeKey{"", spec.ID}) // an exposure of this id that ended (expose.go)
	for _, x := range xs {
		if x.exposed {
			e.exposures[spec.ID] = x
			// The claim wait is bounded by its own timer (ExposureTimeout); the queued
			// phase after the claim (admission, a slot) by QueueTimeout, as a Send's.
			x.qctx, x.qcancel = context.WithTimeout(ctx, e.cfg.ExposureTimeout+e.cfg.QueueTimeout)
			continue
		}
		key := routeKey{x.peer, spec.ID}
		e.routes[key] = x
		delete(e.unanswered, key)
		if p, ok := e.pending[key]; ok && !receive {
			delete(e.pending, key)
			if p.abort != nil {
				x.box.Push(event{msg: p.abort, early: true})
			} else {
				x.box.Push(event{msg: p.info})
			}
		}
		x.qctx, x.qcancel = context.WithTimeout(ctx, e.cfg.QueueTimeout)
	}
	e.liveDrivers.Add(int64(len(xs)))
	notifyStart(e.obs, h, receive) // under e.mu: no Cancel can report a transition before it
	e.mu.Unlock()
	if len(xs) == 1 && xs[0].inPlaceSoon() { // rma_inplace.go
		xs[0].standbyFrom, xs[0].standbyUntil = e.movers.standby()
	}
	for _, x := range xs {
		goGrown(x.run)
	}
	return h, params, nil
}

// Cancel asks for request id to stop and says what the caller may do with its blocks. It
// never blocks: a transfer in flight is stopped by its own goroutine, which Cancel only wakes
// (L3, L4).
func (e *Engine) Cancel(id RequestID) CancelOutcome {
	e.mu.Lock()
	h := e.handles[id]
	e.mu.Unlock()
	out := NotFound
	if h != nil {
		out = h.cancel()
		if out == CancelRequestedInFlight && !e.Health().Healthy {
			out = BackendUnhealthy
		}
	}
	e.obs.OnCancel(id, out)
	return out
}

func (h *Handle) cancel() CancelOutcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch st := h.m.load(); {
	case st.Terminal():
		h.signalNowLocked() // FreeNow: the caller may find Done and Quiesced closed
		return AlreadyComplete
	case st == Quarantined:
		return NotCancellable
	case st == Queued:
		h.cancelRequested = true
		cause := &requestError{ID: h.id, Err: ErrCancelled}
		for _, x := range h.subs {
			// onehop.go: a read that raced the cancel goes stale before FreeNow.
			x.endOneHop()
			if from, r := x.m.apply(evCancelQueued); r.ok { // a sub may have failed already
				h.eng.obs.OnTransition(h.id, x.sub, from, r.next, evCancelQueued)
			}
			x.stop(cause)
		}
		h.applyLocked(evCancelQueued, cause)
		h.signalNowLocked() // FreeNow, as for AlreadyComplete
		return CancelledBeforeAdvertise
	default:
		h.cancelRequested = true
		for _, x := range h.subs {
			x.stop(&requestError{ID: h.id, Err: ErrCancelled})
		}
		return CancelRequestedInFlight
	}
}

// signal closes a handle's Done or Quiesced (closeCh): at once, or after the observer has
// heard every event before it (observerQueue). Cancel may close them sooner (signalNowLocked).
func (e *Engine) signal(closeCh func()) {
	if e.oq != nil {
		e.oq.push(closeCh)
		return
	}
	closeCh()
}

func chanClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (e *Engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// account keeps Health's counters in step with handle transitions; applyLocked calls it.
// queuedAt is when the handle was asked for (unix nanoseconds).
func (e *Engine) account(from, to State, queuedAt int64, unclaimed bool) {
	if from == Queued && to == Failed && !unclaimed { // an exposure nobody claimed was asked for by nobody
		// A request that failed before it became active (no hello, no request, no admission
		// within QueueTimeout) was asked for all the same: it counts as an active failure
		// does, its wait included, so requests that fail queued one after another are a stall
		// (L12). A caller's cancel of a queued request is no sign of a stall.
		now := time.Now().UnixNano()
		if e.inFlight.Load() == 0 && e.idle(queuedAt) && queuedAt > e.stallFrom.Load() {
			e.stallFrom.Store(queuedAt) // the clock runs from its ask, not from older progress
		}
		e.lastDemand.Store(now)
		e.lastFailure.Store(now)
	}
	if !from.active() && to.active() {
		now := time.Now().UnixNano()
		if e.inFlight.Add(1) == 1 && e.idle(now) {
			e.stallFrom.Store(now) // an idle engine has not been stalled all that time
		}
		e.lastDemand.Store(now)
	} else if from.active() && !to.active() {
		e.inFlight.Add(-1)
		now := time.Now().UnixNano()
		e.lastDemand.Store(now)
		if to == Completed { // a failure, cancel or quarantine is no sign of a live peer
			e.touch()
		} else {
			e.lastFailure.Store(now)
		}
	}
	if to == Quarantined {
		e.quarantined.Add(1)
	} else if from == Quarantined {
		e.quarantined.Add(-1)
	}
}

// touch restarts the progress clock: a byte moved or a transfer completed.
func (e *Engine) touch() { e.stallFrom.Store(time.Now().UnixNano()) }

// idle reports whether no transfer was asked for since the progress clock started, or the
// last one ended more than a ProgressDeadline before now: a transfer starting then starts the
// clock afresh. One that follows a failed one closer than that does not: the failures are the
// stall.
func (e *Engine) idle(now int64) bool {
	last := e.lastDemand.Load()
	return last <= e.stallFrom.Load() || time.Duration(now-last) > e.cfg.ProgressDeadline
}

// Drain waits until every transfer's goroutine has ended, or ctx is done (Config.CloseTimeout
// when ctx has no deadline); it does not refuse new transfers. A transfer whose goroutine has
// ended has its outcome and is quiescent, except one whose caller's blocks are poisoned for
// good (Status.BlocksPoisoned, counted in Health.Numbers.BlocksPoisoned): that one never
// quiesces, and Drain does not wait for it. Meant for shutdown, before Close. Then it tells
// each peer that takes a goodbye (wire 4) which transfers with it ended here, failed or
// cancelled, with every operation quiescent, so the peer ends its side of them at once and
// poisons nothing for them (docs/lifecycle.md, "Leaving gracefully").
func (e *Engine) Drain(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.cfg.CloseTimeout)
		defer cancel()
	}
	err := e.waitDrivers(ctx)
	e.sayGoodbye(false, nil) // goodbye.go
	return err
}

func (e *Engine) waitDrivers(ctx context.Context) error {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for e.liveDrivers.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("kvxfer: %d transfers still running: %w", e.liveDrivers.Load(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Close stops the engine: new Sends and Receives fail with ErrClosed, every live transfer is
// cancelled, each peer that takes one gets a goodbye naming the transfers that ended here with
// their operations quiescent (as Drain sends; the connections to peers whose transfers did not
// stop within CancelGrace and an eighth of CloseTimeout more are closed first, and Close waits
// up to half of CloseTimeout for their verdicts), the transport is force-closed, slots it cannot prove done are poisoned, and
// the goroutines end. Handles stay readable, and each ends: Done closes, terminal or, where the
// force close could not say the transport let go of the caller's blocks, quarantined for good
// with them poisoned (L9). When Close returns nil, every handle's Done is closed and the
// Observer has heard every event before it.
//
// Close takes at most Config.CloseTimeout plus the transport's own close (Transport.Close has
// its own bound: ucx.Config.CloseTimeout), split so that no step eats another's share:
// stopping the transfers (CancelGrace, the settle before the goodbye, the goodbye, the copies
// running) takes at most three quarters of CloseTimeout; after the transport's close, the
// transfers' last verdicts and the Observer's hearing every event take the rest, at least a
// quarter of it. An error says which share ran out, and how long each step took.
//
// The transport's Close may unmap memory (UCX unmaps its staging slots, the pools it allocated
// and the peers' memory mapped here), so no copy may run into or out of it then: after the
// grace, copies on the mover workers not yet begun are refused (the transfer fails, having
// touched nothing) and those running are waited for, within the stopping share; the transport
// is closed only after. A copy still running at that bound (a device copy past its timeout)
// keeps the transport open until it returns, and Close says so with an error matching
// ErrQuiescenceUnknown.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.stopUnprovenLocked()
	defer e.movers.close() // after the transfers: their last copies still run
	xs := make([]*xfer, 0, len(e.routes)+len(e.exposures))
	for _, x := range e.routes {
		xs = append(xs, x)
	}
	for _, x := range e.exposures { // unclaimed ones have no route (a claimed one stops twice: once counts)
		xs = append(xs, x)
	}
	e.mu.Unlock()

	t0 := time.Now()
	b := closeShares(e.cfg.CloseTimeout)
	stopCtx, stopCancel := context.WithTimeout(context.Background(), b.stop)
	defer stopCancel()
	for _, x := range xs {
		x.stop(&requestError{ID: x.h.id, Err: ErrClosed})
	}
	// Give the transfers a moment to stop their operations gracefully, then force.
	graceCtx, graceCancel := context.WithTimeout(stopCtx, e.cfg.Tuning.CancelGrace)
	_ = e.waitDrivers(graceCtx)
	graceCancel()
	greeted := e.settleBeforeGoodbye(stopCtx) // goodbye.go
	e.sayGoodbye(true, greeted)               // before the endpoints close
	saidGoodbye := time.Since(t0)
	// The transport's close may unmap memory the mover workers copy into or out of (its
	// staging slots, pools it allocated, a peer's slots mapped here): copies not begun are
	// refused from here on, and the transport closes only once those running have returned.
	var copiesErr, trErr error
	running := e.movers.fence(stopCtx)
	stopped := time.Since(t0)
	if running > 0 {
		copiesErr = fmt.Errorf("kvxfer: %d copies still running after %v of CloseTimeout; the transport closes once they return: %w", running, stopped.Round(time.Millisecond), ErrQuiescenceUnknown)
		go func() {
			<-e.movers.quietCh()
			_ = e.tr.Close(true)
		}()
	} else if err := e.tr.Close(true); err != nil {
		trErr = fmt.Errorf("kvxfer: closing the transport: %w", err)
	}
	trTook := time.Since(t0) - stopped
	// The end's share starts now: what the stopping steps left of CloseTimeout, never less than
	// its own quarter, whatever the transport's close took.
	end := b.endAfter(stopped)
	endCtx, endCancel := context.WithTimeout(context.Background(), end)
	defer endCancel()
	close(e.closing)
	took := func() string {
		return fmt.Sprintf("stopping the transfers took %v (the goodbye said %v in), the transport's close %v",
			stopped.Round(time.Millisecond), saidGoodbye.Round(time.Millisecond), trTook.Round(time.Millisecond))
	}
	err := e.waitDrivers(endCtx)
	if err != nil {
		err = fmt.Errorf("%w, within the %v of CloseTimeout %v left after the transport's close (%s)", err, end.Round(time.Millisecond), e.cfg.CloseTimeout, took())
	}
	e.pool.Close()
	if e.oq != nil && err == nil {
		// An observer slower than its share hears the rest after Close returns.
		ended := time.Since(t0) - stopped - trTook
		if werr := e.oq.wait(endCtx); werr != nil {
			err = fmt.Errorf("kvxfer: the observer had not heard every event within the %v of CloseTimeout %v left after the transport's close "+
				"(%s, the transfers' last verdicts %v): %w", end.Round(time.Millisecond), e.cfg.CloseTimeout, took(), ended.Round(time.Millisecond), werr)
		}
	}
	return errors.Join(copiesErr, err, trErr)
}

// closeBounds is how Close splits Config.CloseTimeout: stop for the steps before the
// transport's close (CancelGrace, the settle before the goodbye, the goodbye, the copies'
// fence), and the rest, at least floor, for the transfers' last verdicts and the observer
// after it. The transport's own close is outside CloseTimeout: it has a bound of its own.
type closeBounds struct {
	total, stop, floor time.Duration
}

func closeShares(total time.Duration) closeBounds {
	floor := total / 4
	return closeBounds{total: total, stop: total - floor, floor: floor}
}

// endAfter is the end's share once the stopping steps took stopped: what they left, at least
// floor (the goodbye's sends are not bounded by a context, so stopped may pass stop).
func (b closeBounds) endAfter(stopped time.Duration) time.Duration {
	return max(b.total-stopped, b.floor)
}

// forget drops a handle whose references are all gone, so its id may be used again.
func (e *Engine) forget(h *Handle) {
	e.mu.Lock()
	if e.handles[h.id] == h {
		delete(e.handles, h.id)
	}
	e.mu.Unlock()
}

// driverDone runs when a sub-transfer's goroutine ends: its route goes, and when it was the
// handle's last and the handle is quiescent, the engine's reference goes with it. A handle
// that is not (its caller's blocks poisoned for good) is never forgotten: Cancel still finds
// it, and its id and blocks stay taken.
func (e *Engine) driverDone(x *xfer) {
	e.mu.Lock()
	if e.routes[routeKey{x.peer, x.h.id}] == x {
		delete(e.routes, routeKey{x.peer, x.h.id})
	}
	if x.exposed {
		x.unexposeLocked() // expose.go
	}
	e.mu.Unlock()
	if x.exposed && x.peer != "" { // claimed: a later claim of it is refused as claimed
		e.rememberEnded(routeKey{"", x.h.id}, unanswered{code: wire.AbortClaimed, reason: "claimed by another receiver", secret: x.secret, claimed: true})
	}
	h := x.h
	h.mu.Lock()
	h.exited++
	gone := false
	if h.exited == len(h.subs) && h.quiescent {
		h.engineRef = false
		gone = h.callerRefs == 0
	}
	h.mu.Unlock()
	if gone {
		e.forget(h)
	}
	e.liveDrivers.Add(-1)
}
