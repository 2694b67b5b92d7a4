// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package stress

// The peer-process soak's path mix and its lifecycle faults: each request takes a route
// (staging, pull, direct, RMA, CMA) through registered pools; rolling restarts of either side
// through a discovery registry; requests to a peer decode knows is dead; freezes with one
// path in flight.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/registryserver"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// mixRMAMinRegionBytes is every engine's Config.Tuning.RMAMinRegionBytes in the peer-process soak:
// the soak's whole 16 KiB blocks take RMA gets where the default (256 KiB, sized for real
// models' blocks) would send them as IOV messages, as in the in-process soak.
const mixRMAMinRegionBytes = 8 << 10

// The prefill processes: the serving default, and one with the pull wire and the RMA mode
// off (Config.Tuning.DisablePull, DisableRMA: a sender's own setting declines them).
const (
	defaultPeer = 0
	plainPeer   = 1
)

// sender is the prefill process that sends a TP=1 request of the route (a TP=2 request takes
// both, whatever its route).
func (r Route) sender() int {
	if r == RouteStaging || r == RouteDirect {
		return plainPeer
	}
	return defaultPeer
}

// senderPool is the pool kind the sender puts the route's blocks in (peer.go, SEND).
func (r Route) senderPool() string {
	switch r {
	case RouteDirect, RouteRMA, RouteRMASend:
		return "alloc"
	case RouteCMA:
		return "host"
	}
	return "go"
}

// registered reports whether the route's receive goes into decode's registered pool.
func (r Route) registered() bool { return r.senderPool() != "go" }

// requestToPeer runs one request of route rma-send: decode sends from a window of its
// registered pool, the default prefill process receives into a window of its UCX-allocated
// pool (RMA gets of decode's pool) and checks the bytes itself (a corrupt END is a breach).
func (ps *procSoak) requestToPeer(r *rand.Rand, id transfer.RequestID) {
	cfg := ps.cfg
	ps.peerMu.Lock()
	p := ps.peers[defaultPeer]
	ps.peerMu.Unlock()
	if p == nil {
		ps.refused.Add(1)
		time.Sleep(time.Millisecond) // the peer is restarting; do not spin
		return
	}
	nb, _, timeout, tight := cfg.drawRequest(r)
	if tight {
		ps.injected[FaultDeadline].Add(1)
	}
	src, dst := randomBlocks(r, nb, nb+2), randomBlocks(r, nb, nb+2)
	seed := uint64(id) * 2
	plan, seeded := seededPool(kvHeads, nb, seed, src)
	pool, window, windowOut := ps.receivePool(RouteRMASend, int64(len(seeded)))
	copy(pool, seeded)
	dec := ps.decodeNode()
	sd := &side{name: "send on " + string(dec.name), eng: dec.eng, started: time.Now()}
	h, err := dec.eng.Send(context.Background(), transfer.Spec{ID: id, Peer: p.name, Plan: plan, Pool: pool, Timeout: timeout})
	if err != nil {
		ps.startRefused(id, "send", err, window, windowOut)
		return
	}
	sd.h = h
	ps.hung.track(id, h, RouteRMASend, p)
	defer ps.hung.untrack(id)
	ps.started.Add(1)
	if err := p.send(fmt.Sprintf("RECV %d %d %d %d %d %s %s alloc", id, kvHeads, nb, seed, timeout.Milliseconds(),
		blocksString(src), blocksString(dst))); err != nil {
		ps.refused.Add(1) // the peer died; the send ends by its own bounds
	}
	if cfg.has(FaultCancel) && r.Float64() < cfg.CancelFraction {
		time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
		if r.IntN(2) == 0 {
			ps.recordCancel(dec.eng.Cancel(id).String())
		} else {
			_ = p.send(fmt.Sprintf("CANCEL %d", id))
			ps.recordCancel("sent-to-peer")
		}
		ps.injected[FaultCancel].Add(1)
	}
	ps.await(id, sd, timeout)
	if sd.h == nil {
		return // never quiescent (its blocks poisoned): its window stays out for good
	}
	switch st := sd.h.Status(); st.State {
	case transfer.Completed:
		ps.completed.Add(1)
		ps.recordPath(sd.h.Path().String() + "-send")
	case transfer.Failed:
		ps.failed.Add(1)
		if errorClass(st.Err) == untypedError {
			ps.addBreach(fmt.Sprintf("request %d (route %s): failed with an error that matches no kvxfer sentinel: %v", id, RouteRMASend, st.Err))
		}
	case transfer.Cancelled:
		ps.cancelled.Add(1)
	}
	if err := sd.h.Release(); err != nil {
		ps.addBreach(fmt.Sprintf("request %d: release: %v", id, err))
	}
	if windowOut {
		ps.decodeWins.put(window)
	}
}

// pickRoute draws a request's route, or takes the one a freeze pinned.
func (ps *procSoak) pickRoute(r *rand.Rand) Route {
	if p := ps.pinned.Load(); p != nil {
		return *p
	}
	return ps.cfg.Routes[r.IntN(len(ps.cfg.Routes))]
}

// pinRoute, with fault freeze-paths, pins every new request to the k-th route of the mix (in
// turn) and waits, bounded, for the requests of the other routes to end, so the freeze that
// follows meets only that path in flight. It reports the route and whether it pinned one.
func (ps *procSoak) pinRoute(k int) (Route, bool) {
	if !ps.cfg.has(FaultFreezePaths) {
		return "", false
	}
	route := ps.cfg.Routes[k%len(ps.cfg.Routes)]
	ps.pinned.Store(&route)
	ps.injected[FaultFreezePaths].Add(1)
	bound := time.Now().Add(ps.quiesceBound(ps.cfg.TransferTimeout))
	for time.Now().Before(bound) {
		others := int64(0)
		for _, r := range AllRoutes {
			if r != route {
				others += ps.inflight[r].Load()
			}
		}
		if others == 0 && ps.inflight[route].Load() > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	ps.log.Info("route pinned for the freeze", zap.String("route", string(route)),
		zap.Int64("in_flight", ps.inflight[route].Load()))
	return route, true
}

// receivePool is a request's receive pool: Go memory, or a window of decode's registered
// pool for the routes that need one (given back by the caller once the handle is quiescent).
// With every window out (poisoned for good, L9), the request falls back to Go memory and
// staging, counted in the report's windows_exhausted.
func (ps *procSoak) receivePool(route Route, n int64) (pool []byte, window int, out bool) {
	if !route.registered() {
		return make([]byte, n), 0, false
	}
	i, mem, ok := ps.decodeWins.take()
	if !ok {
		ps.windowsExhausted.Add(1)
		return make([]byte, n), 0, false
	}
	clear(mem[:n])
	return mem[:n], i, true
}

// pathKey names the path a completed request took, finer than transfer.Path: the pull wire is
// staging-pull, and RMA from a sender's own registered mmap (the CMA route) is rma-host.
func pathKey(h *transfer.Handle, route Route) string {
	switch p := h.Path(); {
	case p == transfer.PathStaging && h.Pulled():
		return "staging-pull"
	case p == transfer.PathRMA && route == RouteCMA:
		return "rma-host"
	default:
		return p.String()
	}
}

// openMix maps decode's KV pool (every decode incarnation registers it) and starts the
// discovery registry the peers publish themselves in.
func (ps *procSoak) openMix(windows int) error {
	size := int64(windows) * ps.cfg.windowBytes()
	mem, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("stress: mapping decode's KV pool: %w", err)
	}
	ps.decodePool = mem
	ps.decodeWins = newWindows(mem, ps.cfg.windowBytes(), windows)
	if ps.registry, err = registryserver.Serve("127.0.0.1:0"); err != nil {
		return fmt.Errorf("stress: starting the discovery registry: %w", err)
	}
	if ps.lookup, err = discovery.Open(ps.registry.URL(), discovery.Config{}); err != nil {
		return fmt.Errorf("stress: opening the discovery registry: %w", err)
	}
	return nil
}

// closeMix stops the registry. decode's pool stays mapped: a handle never quiescent may still
// name it, and the process ends soon after.
func (ps *procSoak) closeMix() {
	if ps.lookup != nil {
		_ = ps.lookup.Close()
		ps.lookup = nil
	}
	if ps.registry != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = ps.registry.Close(ctx)
		cancel()
		ps.registry = nil
	}
}

// newDecode starts a decode incarnation: a UCX transport that registers decode's KV pool, and
// its engine. A peer killed while writing into decode's shared-memory receive queue wedges it
// for good (docs/ucx.md): decode replaces its worker, and announce gives the peers its new
// address.
func (ps *procSoak) newDecode(name transfer.Peer) (*node, *ucx.Transport, error) {
	cfg := ps.cfg
	tr, err := ucx.New(ucx.Config{TLS: ps.tls, KeepaliveInterval: 200 * time.Millisecond,
		StagingBytes: int64(ps.numSlots) * cfg.SlotBytes, CloseTimeout: 2 * time.Second,
		ProbeTimeout: 3 * time.Second, ReplaceWedgedWorker: true})
	if err != nil {
		return nil, nil, fmt.Errorf("stress: opening UCX: %w", err)
	}
	if _, err := tr.RegisterHost(ps.decodePool); err != nil { // unregistered by the transport's Close
		_ = tr.Close(true)
		return nil, nil, fmt.Errorf("stress: registering decode's KV pool: %w", err)
	}
	tracked := newUCXTracked(tr, cfg.SlotBytes)
	n := &node{name: name, slot: tracked.slots, onPoison: ps.hung.poisoned}
	if n.eng, err = transfer.New(tracked, transfer.Config{
		SlotBytes:        cfg.SlotBytes,
		MaxConcurrent:    cfg.MaxConcurrent,
		StagingMemory:    tr.StagingMemory(),
		TransferTimeout:  cfg.TransferTimeout,
		QueueTimeout:     cfg.QueueTimeout,
		ProgressDeadline: cfg.ProgressDeadline,
		CloseTimeout:     cfg.QuarantineTimeout + cfg.Grace,
		Logger:           cfg.EngineLogger,
		Observer:         n,
		Tuning:           tuning.Config{NumSlots: ps.numSlots, QuarantineTimeout: cfg.QuarantineTimeout, RMAMinRegionBytes: mixRMAMinRegionBytes, DisablePull: cfg.DecodeDisablesPull},
	}); err != nil {
		_ = tr.Close(true)
		return nil, nil, err
	}
	return n, tr, nil
}

func (ps *procSoak) decodeNode() *node {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.decode
}

func (ps *procSoak) decodeTransport() *ucx.Transport {
	ps.peerMu.Lock()
	defer ps.peerMu.Unlock()
	return ps.tr
}

// configFor is prefill process idx's configuration (generation gen): the plain one has the
// pull wire and the RMA mode off; both publish themselves in the registry as prefill-<idx>.
// Every other incarnation ends abruptly when restarted (abruptEnd).
func (ps *procSoak) configFor(idx, gen int) peerConfig {
	pc := ps.pc
	pc.Plain = idx == plainPeer
	if abruptEnd(idx + gen) {
		pc.DrainFor = 0
	}
	pc.Name = fmt.Sprintf("prefill-%d", idx)
	if ps.registry != nil {
		pc.Registry = ps.registry.URL()
	}
	return pc
}

// discover finds peer p in the registry, as a serving process finds a restarted peer: its
// entry must name the address it printed and a new incarnation (not its predecessor's).
func (ps *procSoak) discover(p *procPeer) error {
	if ps.lookup == nil {
		return nil
	}
	var before uint64
	ps.peerMu.Lock()
	for _, q := range ps.all {
		if q.idx == p.idx && q != p {
			before = max(before, q.incarnation)
		}
	}
	ps.peerMu.Unlock()
	name := fmt.Sprintf("prefill-%d", p.idx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		w, err := ps.lookup.Lookup(ctx, name)
		cancel()
		if err == nil && w.Incarnation != before && transfer.Peer(ucx.PeerFromAddress(w.Address)) == p.name {
			p.incarnation = w.Incarnation
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stress: %s.gen%d not in the registry with a new incarnation within 10s (last lookup: %+v, %v)",
				name, p.gen, w, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkExit judges how a peer that exited by itself (after its stdin closed, or after
// SIGTERM) ended: anything but exit status 0 (a signal such as SIGSEGV, a Go panic's 2, an
// error's 1) is a crash.
func (ps *procSoak) checkExit(p *procPeer) {
	st := p.child.Cmd.ProcessState
	if st == nil || st.Success() {
		return
	}
	ps.crashes.Add(1)
	ps.addBreach(fmt.Sprintf("peer %d.gen%d crashed (%v); its stderr ends: %q", p.idx, p.gen, st, p.child.Tail()))
}

// requestToDeadPeer (fault dead-peer) times requests to a prefill process that was just
// killed, once decode has heard it is lost: a Receive from it and a Send to it must each fail
// within DeadPeerBound (docs/lifecycle.md, "A lost peer"). Decode's transport reports a lost
// peer through the engine's observer (node.OnPeerLost).
func (ps *procSoak) requestToDeadPeer(dead *procPeer) {
	dec := ps.decodeNode()
	heard := dec.peerLost(dead.name)
	select {
	case <-heard:
	case <-time.After(5 * time.Second):
		ps.addBreach(fmt.Sprintf("dead-peer: decode did not hear within 5s that peer %d.gen%d (killed) is lost", dead.idx, dead.gen))
		return
	}
	ps.injected[FaultDeadPeer].Add(1)
	// At once, while the transport may still be reporting the loss of the peer's other
	// endpoints, and again a while later, when nothing but the engine's memory of the loss
	// can end a request at once (a decode handed params by a prefill that died before).
	for round := range 2 {
		if round > 0 {
			time.Sleep(deadPeerLater)
		}
		ps.timeDeadRequest(dec, dead, false)
		ps.timeDeadRequest(dec, dead, true)
	}
}

// deadPeerLater is how long after the first requests to a dead peer the second ones go.
const deadPeerLater = 500 * time.Millisecond

// timeDeadRequest makes one request (a Send, or a Receive) with a peer decode knows is dead,
// and breaches unless it fails within DeadPeerBound.
func (ps *procSoak) timeDeadRequest(dec *node, dead *procPeer, send bool) {
	what, name, start := "Receive from", "receive from a dead peer", dec.eng.Receive
	if send {
		what, name, start = "Send to", "send to a dead peer", dec.eng.Send
	}
	id := transfer.RequestID(ps.lastRequest.Add(1))
	l := kvLayout(kvHeads, 3)
	plan, err := layout.NewPlan(l, l.All(), []int32{0, 1})
	must(err)
	t0 := time.Now()
	h, err := start(context.Background(), transfer.Spec{ID: id, Peer: dead.name, Plan: plan,
		Pool: make([]byte, l.SpanBytes()), Timeout: ps.cfg.TransferTimeout})
	if err != nil {
		if took := time.Since(t0); took > ps.cfg.DeadPeerBound {
			ps.addBreach(fmt.Sprintf("dead-peer: %s peer %d.gen%d, known dead, refused after %v (bound %v)",
				what, dead.idx, dead.gen, took.Round(time.Millisecond), ps.cfg.DeadPeerBound))
		}
		ps.deadChecked.Add(1)
		return
	}
	failedIn := time.Duration(0)
	if waitUntil(h.Done(), t0.Add(ps.cfg.DeadPeerBound)) {
		failedIn = time.Since(t0)
	}
	ps.deadChecked.Add(1)
	sd := &side{name: name, eng: dec.eng, h: h, started: t0}
	ps.await(id, sd, ps.cfg.TransferTimeout)
	took := time.Since(t0)
	switch {
	case failedIn == 0:
		ps.addBreach(fmt.Sprintf("dead-peer: a %s peer %d.gen%d, which decode knew was dead, had no outcome within %v (it ended after %v: %v)",
			what, dead.idx, dead.gen, ps.cfg.DeadPeerBound, took.Round(time.Millisecond), h.Status().Err))
	case h.Status().State == transfer.Completed:
		ps.addBreach(fmt.Sprintf("dead-peer: a %s peer %d.gen%d, which is dead, completed", what, dead.idx, dead.gen))
	case !errors.Is(h.Status().Err, transfer.ErrPeerLost):
		ps.addBreach(fmt.Sprintf("dead-peer: a %s peer %d.gen%d, which decode knew was dead, failed but not as a lost peer: %v",
			what, dead.idx, dead.gen, h.Status().Err))
	}
	storeMax(&ps.longestDeadPeer, took)
	if sd.h != nil {
		_ = sd.h.Release()
	}
}

// rollingRestart (fault restart) restarts every side in turn under load, as a rolling update
// does: the two prefill processes, then decode in this process.
func (ps *procSoak) rollingRestart() {
	for side := range 3 {
		ps.injected[FaultRestart].Add(1)
		ps.restarts.Add(1)
		if side == 2 {
			ps.restartDecode()
		} else {
			ps.restartPeer(side)
		}
	}
}

// restartPeer: the new incarnation starts and is found through discovery; the old one is sent
// no more requests, gets SIGTERM, withdraws, drains for DrainFor, closes under whatever load is
// left and exits 0 with its pool accounted.
func (ps *procSoak) restartPeer(i int) {
	ps.peerMu.Lock()
	old := ps.peers[i]
	ps.peers[i] = nil // requests started from now on are refused until the new one is found
	ps.peerMu.Unlock()
	if old == nil {
		return
	}
	t0 := time.Now()
	if err := old.child.Signal(syscall.SIGTERM); err != nil {
		ps.addBreach(fmt.Sprintf("restart: SIGTERM to peer %d.gen%d: %v", old.idx, old.gen, err))
	}
	ps.log.Info("peer terminated (SIGTERM)", zap.Int("peer", i), zap.Int("gen", old.gen))
	ps.replacePeer(i, old.gen+1, "restart: starting the next incarnation of peer")
	select {
	case n := <-old.term:
		if n > 0 {
			ps.underLoad.Add(1)
		}
	case <-old.child.Exited():
		// A peer that closed prints TERM and exits at once: its exit can be seen before the
		// goroutine reading its lines has handed TERM on. Every line is read by now, so the
		// TERM, if it was printed, arrives within moments.
		select {
		case n := <-old.term:
			if n > 0 {
				ps.underLoad.Add(1)
			}
		case <-time.After(2 * time.Second):
			ps.addBreach(fmt.Sprintf("restart: peer %d.gen%d exited on SIGTERM without closing its engine; its stderr ends: %q",
				old.idx, old.gen, old.child.Tail()))
		}
	case <-time.After(ps.cfg.DrainFor + ps.cfg.Grace + 10*time.Second):
		ps.addBreach(fmt.Sprintf("restart: peer %d.gen%d did not reach its Close within %v of SIGTERM",
			old.idx, old.gen, ps.cfg.DrainFor+ps.cfg.Grace))
	}
	ps.stopThese([]*procPeer{old})
	ps.log.Info("peer restarted", zap.Int("peer", i), zap.Duration("took", time.Since(t0)))
	ps.awaitRecovery(fmt.Sprintf("the rolling restart of peer %d", i), time.Now())
}

// restartDecode replaces decode in this process under load: a new incarnation (new UCX
// worker) takes the new requests and the peers are told its address; the old one is drained
// for DrainFor (or not at all: abruptEnd) and closed with what is still in flight (its receives fail ErrClosed), and its
// pool must account for every slot.
func (ps *procSoak) restartDecode() {
	ps.mu.Lock()
	old := ps.decode
	gen := len(ps.retired) + 1
	ps.mu.Unlock()
	fresh, tr, err := ps.newDecode(transfer.Peer(fmt.Sprintf("decode.gen%d", gen)))
	if err != nil {
		ps.addBreach(fmt.Sprintf("restart: starting decode's next incarnation: %v", err))
		return
	}
	ps.peerMu.Lock()
	oldTr := ps.tr
	ps.tr = tr
	live := append([]*procPeer(nil), ps.peers[:]...)
	ps.peerMu.Unlock()
	ps.mu.Lock()
	ps.decode = fresh
	ps.retired = append(ps.retired, old)
	ps.mu.Unlock()
	line := "PEER " + fmt.Sprintf("%x", tr.WorkerAddress())
	for _, p := range live {
		if p != nil {
			_ = p.send(line) // a peer that died meanwhile starts with the new address
		}
	}
	drainFor := ps.cfg.DrainFor
	if abruptEnd(gen) {
		drainFor = 0
	}
	ps.log.Info("decode restarting", zap.Int("gen", gen), zap.Duration("drain_for", drainFor))
	ctx, cancel := context.WithTimeout(context.Background(), drainFor)
	_ = old.eng.Drain(ctx) // a deadline missed is the point: Close meets what is left
	cancel()
	if old.eng.Health().Numbers.InFlight > 0 {
		ps.underLoad.Add(1)
	}
	cma := cmaStats(oldTr)
	repl := workersReplaced(oldTr)
	if err := old.eng.Close(); err != nil {
		ps.addBreach(fmt.Sprintf("restart: closing decode under load: %v", err))
	}
	ps.checkDrained(old)
	ps.mu.Lock()
	ps.retiredCMA.Gets += cma.Gets
	ps.retiredCMA.Bytes += cma.Bytes
	ps.retiredCMA.Refused += cma.Refused
	ps.retiredRepl += int64(repl)
	ps.mu.Unlock()
	ps.awaitRecovery(fmt.Sprintf("the rolling restart of decode (gen %d)", gen), time.Now())
}

// checkMix checks, at the end, that the mix moved bytes on every path it asked for, and that
// every pinned freeze was seen; it fills the report's mix fields.
func (ps *procSoak) checkMix() {
	tr := ps.decodeTransport()
	cma := cmaStats(tr)
	ps.mu.Lock()
	cma.Gets += ps.retiredCMA.Gets
	cma.Refused += ps.retiredCMA.Refused
	paths := make(map[string]int64, len(ps.paths))
	for k, v := range ps.paths {
		paths[k] = v
	}
	ps.mu.Unlock()
	ps.cmaReads.Store(int64(cma.Gets))
	want := map[Route]string{RouteStaging: "staging", RoutePull: "staging-pull", RouteDirect: "direct", RouteRMA: "rma", RouteCMA: "rma-host",
		RouteRMASend: "rma-send"}
	for _, r := range ps.cfg.Routes {
		if r == RoutePull && ps.cfg.DecodeDisablesPull {
			continue
		}
		if ps.tls != "" && (r == RoutePull || r == RouteRMA || r == RouteCMA || r == RouteRMASend) {
			// UCX_TLS chosen by hand (tcp): gets may be emulated, and the engines then take
			// the tagged messages by design (docs/onecopy.md); counted, not required.
			continue
		}
		if paths[want[r]] == 0 {
			ps.addBreach(fmt.Sprintf("mix: no request completed on the %s path (route %s): completed by path %v", want[r], r, paths))
		}
	}
	if slices.Contains(ps.cfg.Routes, RouteCMA) && ps.tls == "" && paths["rma-host"] > 0 && cma.Gets == 0 {
		if cma.Refused > 0 {
			ps.skip(fmt.Sprintf("CMA reads skipped: the kernel refused process_vm_readv on %d pool keys (ptrace_scope, seccomp); UCX's gets moved them", cma.Refused))
		} else {
			ps.addBreach("mix: the CMA route completed by RMA with no process_vm_readv read")
		}
	}
}

// fillReport adds the mix's and the lifecycle faults' figures to the report.
func (ps *procSoak) fillReport(r *Report) {
	r.CMAReads, r.Crashes = ps.cmaReads.Load(), ps.crashes.Load()
	r.Restarts, r.RestartsUnderLoad = ps.restarts.Load(), ps.underLoad.Load()
	r.DeadPeerRequests = ps.deadChecked.Load()
	r.WindowsExhausted = ps.windowsExhausted.Load()
	r.LongestDeadPeerSeconds = time.Duration(ps.longestDeadPeer.Load()).Seconds()
	ps.mu.Lock()
	for route, d := range ps.frozenSeen {
		if r.FrozenSeenSeconds == nil {
			r.FrozenSeenSeconds = map[string]float64{}
		}
		r.FrozenSeenSeconds[string(route)] = d.Seconds()
	}
	ps.mu.Unlock()
}

// startRefused settles a request decode's engine refused to start (a Send on route
// rma-send, a Receive on the others): its window goes back; a decode that is restarting (fault
// restart) refuses as expected, anything else is a breach.
func (ps *procSoak) startRefused(id transfer.RequestID, what string, err error, window int, windowOut bool) {
	if windowOut {
		ps.decodeWins.put(window)
	}
	if errors.Is(err, transfer.ErrClosed) {
		ps.refused.Add(1)
		return
	}
	ps.addBreach(fmt.Sprintf("request %d: %s refused: %v", id, what, err))
}
