// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package stress

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/cmastats"
	"github.com/kvxfer/kvxfer/internal/peerproc/proc"
	"github.com/kvxfer/kvxfer/internal/registryserver"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/discovery"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// procFaults are the faults the process mode injects; the chunk-level ones need the
// in-memory transport's hooks.
var procFaults = []Fault{FaultCancel, FaultDeadline, FaultFreeze, FaultLostPeer, FaultPartition, FaultRestart, FaultDeadPeer, FaultFreezePaths,
	FaultHostile, FaultHungPeer}

func init() { runProcesses = RunProcesses }

// procPeer is one prefill peer process.
type procPeer struct {
	idx, gen int
	name     transfer.Peer
	child    *proc.Child // its stderr's end goes with a breach (Child.Tail)
	pool     chan string // its POOL line
	term     chan int    // its TERM line: transfers in flight when its Close began
	// incarnation is what it published in the registry (fault restart's discovery).
	incarnation uint64
}

func (p *procPeer) send(line string) error { return p.child.Send(line) }

// procSoak adds peer processes to a soak whose only in-process engine is decode, over UCX.
type procSoak struct {
	*soak
	tls      string
	exe      string
	pc       peerConfig
	peerMu   sync.Mutex // guards peers, all, tr
	peers    [2]*procPeer
	all      []*procPeer
	tr       *ucx.Transport // decode's transport, this incarnation's
	freezing atomic.Bool
	// signalPhase is how long the signal faults run (the partition has the rest of the run):
	// the schedule's cycle is at most this long, so each cycle's faults all happen.
	signalPhase time.Duration

	// The path mix (procmix.go).
	decodePool  []byte   // decode's KV pool: an mmap every incarnation registers (RegisterHost)
	decodeWins  *windows // its windows, one per request on a registered route
	inflight    map[Route]*atomic.Int64
	pinned      atomic.Pointer[Route]  // freeze-paths: every new request takes this route
	registry    *registryserver.Server // where the peers publish themselves
	lookup      discovery.Registry
	restarts    atomic.Int64 // rolling restarts done (either side)
	underLoad   atomic.Int64 // of them, Closes that met transfers in flight
	deadChecked atomic.Int64 // requests to a known dead peer timed
	frozenSeen  map[Route]time.Duration
	retiredCMA  cmastats.Stats // CMA reads of decode's retired incarnations
	retiredRepl int64          // workers they replaced
	hung        *hungWatch     // fault hung-peer (hungpeer.go)
}

// RunProcesses is Run with the prefill side in two peer processes over UCX (TLS tls; empty
// for UCX's default): TP=1 requests from one, TP=2 requests from both into one decode
// engine in this process. The freeze fault stops both peers with SIGSTOP and resumes them
// with SIGCONT; the lost-peer fault kills one with SIGKILL and starts it again. Point
// faults (hang, late, never-quiesce) need the in-memory transport and are left out. The
// peer processes run exe (default: this executable), which must call RunPeerFromEnv first.
func RunProcesses(ctx context.Context, cfg Config, tls, exe string) (*Report, error) {
	cfg = cfg.withDefaults()
	cfg.Faults = only(cfg.Faults, procFaults)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("stress: finding this executable to start peers: %w", err)
		}
	}
	defer useStalls()() // the wedge check credits the time this process could not run (stall.go)
	goroutinesStart := runtime.NumGoroutine()
	s := &soak{cfg: cfg, log: cfg.Logger, cancelOutcomes: map[string]int64{}, paths: map[string]int64{}, injected: map[Fault]*atomic.Int64{}}
	for _, f := range AllFaults {
		s.injected[f] = new(atomic.Int64)
	}
	s.numSlots = 2*cfg.MaxConcurrent + 16
	ps := &procSoak{soak: s, tls: tls, exe: exe, inflight: map[Route]*atomic.Int64{}, frozenSeen: map[Route]time.Duration{},
		hung: newHungWatch(cfg.has(FaultHungPeer))}
	for _, r := range AllRoutes {
		ps.inflight[r] = new(atomic.Int64)
	}
	windows := cfg.Concurrency + 64 // a window per request, and room for those poisoned for good
	ps.pc = peerConfig{TLS: tls, SlotBytes: cfg.SlotBytes, MaxConcurrent: cfg.MaxConcurrent, NumSlots: s.numSlots,
		QueueTimeout: cfg.QueueTimeout, ProgressDeadline: cfg.ProgressDeadline, QuarantineTimeout: cfg.QuarantineTimeout,
		Grace: cfg.Grace, Lifetime: cfg.Duration + 5*time.Minute, RMAMinRegionBytes: mixRMAMinRegionBytes,
		Windows: windows, WindowBytes: cfg.windowBytes(), DrainFor: cfg.DrainFor}
	if cfg.has(FaultFreeze) {
		ps.pc.Stopped = cfg.FreezeFor
	}
	defer ps.closeMix() // also what a failed openMix started
	if err := ps.openMix(windows); err != nil {
		return nil, err
	}
	n, tr, err := ps.newDecode("decode")
	if err != nil {
		return nil, err
	}
	ps.tr = tr
	s.decode = n
	for i := range ps.peers {
		if ps.peers[i], err = ps.startPeer(i, 0); err != nil {
			ps.stopPeers()
			s.closeAll()
			return nil, err
		}
	}

	// With the partition on, the last third of the run (at least four freezes long) is the
	// network phase; the signal phase has the rest.
	mainFor, partitionFor := cfg.Duration, time.Duration(0)
	if cfg.has(FaultPartition) {
		partitionFor = max(cfg.Duration/3, 4*cfg.FreezeFor)
		mainFor = max(cfg.Duration-partitionFor, cfg.Duration/2)
	}
	ps.signalPhase = mainFor
	defer s.watchStalls(processStalls())()
	s.startedAt = time.Now()
	trafficCtx, stopTraffic := context.WithTimeout(ctx, mainFor)
	defer stopTraffic()
	monitorCtx, stopMonitor := context.WithCancel(context.Background())
	monitorDone := make(chan struct{})
	go func() { defer close(monitorDone); s.monitor(monitorCtx) }()
	announceDone := make(chan struct{})
	go func() { defer close(announceDone); ps.announce(monitorCtx) }()
	scheduleDone := make(chan struct{})
	go func() { defer close(scheduleDone); ps.schedule(trafficCtx) }()
	hostileDone := ps.hostile(trafficCtx, mainFor) // hostile.go
	var workers sync.WaitGroup
	for w := range cfg.Concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			r := rand.New(rand.NewPCG(cfg.Seed, uint64(w)))
			for trafficCtx.Err() == nil {
				ps.request(r)
			}
		}()
	}
	drainBound := cfg.Duration + s.quiesceBound(cfg.TransferTimeout) + cfg.RecoveryBound + cfg.FreezeFor + cfg.Grace + 10*time.Second
	if !waitBounded(&workers, scheduleDone, time.Until(s.startedAt.Add(drainBound))) {
		s.addBreach(fmt.Sprintf("workers or schedule still running %v after the start: the soak itself wedged", drainBound))
	}
	<-hostileDone
	ps.stopPeers()
	if partitionFor > 0 && ctx.Err() == nil {
		ps.partition(ctx, partitionFor)
	}
	s.drainAndCheck()
	stopMonitor()
	<-monitorDone
	<-announceDone
	ps.checkMix()
	hungPoisonedBeforeLoss := ps.checkHungPoisons()
	s.closeAll()
	ps.closeMix()
	goroutinesEnd := s.waitGoroutines(goroutinesStart)
	rep := s.report(goroutinesStart, goroutinesEnd)
	ps.fillReport(rep)
	ps.fillHung(rep, hungPoisonedBeforeLoss)
	if len(rep.Breaches) > 0 {
		return rep, fmt.Errorf("%w: %d breaches, first: %s", ErrBreach, len(rep.Breaches), rep.Breaches[0])
	}
	return rep, nil
}

// startPeer starts prefill peer process idx (generation gen), waits (bounded) for its
// address, and tells it decode's.
func (ps *procSoak) startPeer(idx, gen int) (*procPeer, error) {
	p := &procPeer{idx: idx, gen: gen, pool: make(chan string, 1), term: make(chan int, 1)}
	addr := make(chan string, 1)
	var err error
	if p.child, err = spawnPeer(exec.Command(ps.exe), ps.configFor(idx, gen), func(line string) { ps.peerLine(p, line, addr) }); err != nil {
		return nil, fmt.Errorf("stress: starting peer %d: %w", idx, err)
	}
	if err := awaitAddr(p, addr, fmt.Sprintf("peer %d", idx)); err != nil {
		return nil, err
	}
	if err := ps.discover(p); err != nil {
		p.child.Kill()
		p.child.Reap(peerReapBound)
		return nil, err
	}
	if err := p.send("PEER " + hex.EncodeToString(ps.decodeTransport().WorkerAddress())); err != nil {
		return nil, err
	}
	ps.peerMu.Lock()
	ps.all = append(ps.all, p)
	ps.peerMu.Unlock()
	return p, nil
}

// spawnPeer starts cmd as a soak peer process with pc in its environment, each line it
// prints handed to lines. UCX's own complaints about a killed peer are expected noise, so its
// stderr only keeps a tail (which goes with a breach); what matters reaches the parent on
// stdout as ERR lines and the pool report.
func spawnPeer(cmd *exec.Cmd, pc peerConfig, lines func(line string)) (*proc.Child, error) {
	env, err := json.Marshal(pc)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(os.Environ(), PeerEnv+"="+string(env), "UCX_LOG_LEVEL=fatal")
	return proc.Start(context.Background(), cmd, proc.Options{Stdin: true, Lines: lines})
}

// peerReapBound is how long a killed peer process may take to be reaped.
const peerReapBound = 10 * time.Second

// awaitAddr waits, 10 s at most, for the address the peer prints first (peerLine passes it on
// addr) and names the peer with it; a peer that exits or stays silent is an error naming it
// as what, and a silent one is killed.
func awaitAddr(p *procPeer, addr <-chan string, what string) error {
	select {
	case a := <-addr:
		p.name = transfer.Peer(a)
		return nil
	case <-p.child.Exited():
		return fmt.Errorf("stress: %s exited before printing its address", what)
	case <-time.After(10 * time.Second):
		p.child.Kill()
		if !p.child.Reap(peerReapBound) {
			return fmt.Errorf("stress: %s printed no address in 10s, and was not reaped within %v of its kill", what, peerReapBound)
		}
		return fmt.Errorf("stress: %s printed no address in 10s", what)
	}
}

// peerLine handles one line a peer printed.
func (ps *procSoak) peerLine(p *procPeer, line string, addr chan<- string) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	switch f[0] {
	case "ADDR":
		if len(f) == 2 {
			addr <- f[1]
		}
	case "END":
		if len(f) >= 3 && strings.HasPrefix(f[2], "refused:no_free_") {
			ps.windowsExhausted.Add(1) // every window of that pool poisoned for good (L9)
		}
		// A receive this process checked (route rma-send): the sender here cannot see its bytes.
		if len(f) >= 4 && f[3] == "corrupt" {
			ps.corrupt.Add(1)
			ps.addBreach(fmt.Sprintf("peer %d.gen%d: request %s completed, but its bytes do not match what decode sent", p.idx, p.gen, f[1]))
		}
	case "TERM":
		if len(f) == 2 {
			n, _ := strconv.Atoi(f[1])
			select {
			case p.term <- n:
			default:
			}
		}
	case "BLOCKS":
		ps.blocksPoisoned.Add(1)
		ps.log.Info("a peer's blocks poisoned", zap.Int("peer", p.idx), zap.Int("gen", p.gen), zap.Strings("line", f[1:]))
	case "WEDGED":
		ps.wedged.Add(1)
		ps.addBreach(fmt.Sprintf("peer %d.gen%d: request %s", p.idx, p.gen, strings.Join(f[1:], " ")))
	case "POOL":
		select {
		case p.pool <- line:
		default:
		}
	case "ERR":
		ps.addBreach(fmt.Sprintf("peer %d.gen%d: %s", p.idx, p.gen, line))
	}
}

// stopPeers closes every live peer's stdin, checks the pool each reports after its drain,
// and waits (bounded) for it to exit, killing it if it does not.
func (ps *procSoak) stopPeers() {
	ps.stopThese(ps.livePeers())
}

// stopThese ends the given peers: stdin closed, pool report checked, exit awaited.
func (ps *procSoak) stopThese(live []*procPeer) {
	for _, p := range live {
		_ = p.child.CloseStdin()
	}
	bound := ps.cfg.QueueTimeout + ps.cfg.TransferTimeout + 2*ps.cfg.QuarantineTimeout + 2*ps.cfg.Grace + 10*time.Second
	for _, p := range live {
		select {
		case line := <-p.pool:
			ps.checkPeerPool(p, line)
		case <-p.child.Exited():
			// Its output is read to the end before Exited closes, so a POOL line it printed
			// is waiting by now.
			select {
			case line := <-p.pool:
				ps.checkPeerPool(p, line)
			default:
				ps.addBreach(fmt.Sprintf("peer %d.gen%d exited (%v) without reporting its pool; its stderr ends: %q",
					p.idx, p.gen, p.child.Cmd.ProcessState, p.child.Tail()))
			}
		case <-time.After(bound):
			ps.addBreach(fmt.Sprintf("peer %d.gen%d did not drain within %v", p.idx, p.gen, bound))
		}
		if err := p.child.Stop(10*time.Second, peerReapBound); err != nil {
			ps.addBreach(fmt.Sprintf("peer %d.gen%d did not exit within 10s of its drain: %v", p.idx, p.gen, err))
		} else {
			ps.checkExit(p)
		}
	}
}

// checkPeerPool checks a peer's POOL line: nothing leased, poisons all observed, none reused.
func (ps *procSoak) checkPeerPool(p *procPeer, line string) {
	f := strings.Fields(line)
	if len(f) != 6 {
		ps.addBreach(fmt.Sprintf("peer %d.gen%d: bad pool line %q", p.idx, p.gen, line))
		return
	}
	var v [5]int64
	for i := range v {
		v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
	}
	total, free, poisoned, seen, reused := v[0], v[1], v[2], v[3], v[4]
	ps.extraPoisoned.Add(poisoned)
	if leased := total - free - poisoned; leased != 0 {
		ps.extraLeaked.Add(leased)
		ps.addBreach(fmt.Sprintf("peer %d.gen%d: %d slots still leased after its drain", p.idx, p.gen, leased))
	}
	if seen != poisoned {
		ps.addBreach(fmt.Sprintf("peer %d.gen%d: pool says %d slots poisoned, the observer heard of %d", p.idx, p.gen, poisoned, seen))
	}
	if reused > 0 {
		ps.extraReused.Add(reused)
		ps.addBreach(fmt.Sprintf("peer %d.gen%d: %d posts into poisoned slots", p.idx, p.gen, reused))
	}
}

// schedule: per cycle (a minute, or the signal phase if shorter), at 15% both peers are stopped (SIGSTOP) for FreezeFor, at 45% one is
// killed (SIGKILL) and started again, at 57% one hangs (SIGSTOP past decode's deadline) and
// is then killed and started again, at 70% every side is restarted in turn (SIGTERM, drain,
// close, a new incarnation: a rolling update).
func (ps *procSoak) schedule(ctx context.Context) {
	c := min(ps.cycle(), ps.signalPhase)
	for k := 0; ; k++ {
		base := ps.startedAt.Add(time.Duration(k) * c)
		if ps.cfg.has(FaultFreeze) {
			if !sleepUntil(ctx, base.Add(c*15/100)) {
				return
			}
			ps.freezePeers(k)
		}
		if ps.cfg.has(FaultLostPeer) {
			if !sleepUntil(ctx, base.Add(c*45/100)) {
				return
			}
			ps.killPeer(k % 2)
		}
		if ps.cfg.has(FaultHungPeer) {
			if !sleepUntil(ctx, base.Add(c*57/100)) {
				return
			}
			ps.hangPeer((k + ps.cfg.HungPeerFirst) % 2)
		}
		if ps.cfg.has(FaultRestart) {
			if !sleepUntil(ctx, base.Add(c*70/100)) {
				return
			}
			ps.rollingRestart()
		}
		if !sleepUntil(ctx, base.Add(c)) {
			return
		}
	}
}

func (ps *procSoak) livePeers() []*procPeer {
	ps.peerMu.Lock()
	defer ps.peerMu.Unlock()
	var out []*procPeer
	for _, p := range ps.peers {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// freezePeers stops every prefill process: decode, whose every transfer is then stalled, must
// turn unhealthy within the progress deadline (plus Grace), and be healthy within
// RecoveryBound of SIGCONT.
func (ps *procSoak) freezePeers(k int) {
	route, pinned := ps.pinRoute(k)
	defer ps.pinned.Store(nil)
	peers := ps.livePeers()
	t0 := time.Now()
	for _, p := range peers {
		_ = p.child.Signal(syscall.SIGSTOP)
	}
	ps.injected[FaultFreeze].Add(1)
	ps.log.Info("peers stopped (SIGSTOP)", zap.Int("peers", len(peers)))
	thaw := t0.Add(ps.cfg.FreezeFor)
	slack := ps.cfg.Grace
	if pinned {
		slack = ps.cfg.FrozenSeenSlack
	}
	detectBy := t0.Add(min(ps.cfg.ProgressDeadline+slack, ps.cfg.FreezeFor))
	detected := false
	for !detected && time.Now().Before(detectBy) {
		h := ps.decodeNode().eng.Health()
		ps.log.Debug("decode health while the peers are stopped", zap.Duration("since_stop", time.Since(t0)),
			zap.Bool("healthy", h.Healthy), zap.Int64("in_flight", h.Numbers.InFlight), zap.Duration("since_progress", h.Numbers.SinceProgress))
		if !h.Healthy {
			detected = true
			storeMax(&ps.longestDetect, time.Since(t0))
			if pinned {
				ps.mu.Lock()
				ps.frozenSeen[route] = max(ps.frozenSeen[route], time.Since(t0))
				ps.mu.Unlock()
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !detected {
		on := ""
		if pinned {
			on = fmt.Sprintf(" with only the %s route in flight", route)
		}
		ps.addBreach(fmt.Sprintf("decode stayed healthy for %v while every prefill process was stopped%s (progress deadline %v)",
			detectBy.Sub(t0).Round(time.Millisecond), on, ps.cfg.ProgressDeadline))
	}
	time.Sleep(time.Until(thaw))
	for _, p := range peers {
		_ = p.child.Signal(syscall.SIGCONT)
	}
	ps.log.Info("peers resumed (SIGCONT)")
	ps.awaitRecovery("SIGCONT of the prefill processes", thaw)
}

// announce tells every live peer decode's new address after decode's transport replaced a
// wedged worker, as an operator's restart of decode would have to.
func (ps *procSoak) announce(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	seen := 0
	var lastTr *ucx.Transport
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tr := ps.decodeTransport()
		if tr != lastTr { // decode restarted: its new transport has replaced none yet
			lastTr, seen = tr, 0
		}
		n := workersReplaced(tr)
		if n == seen {
			continue
		}
		seen = n
		ps.mu.Lock()
		ps.workersReplaced.Store(ps.retiredRepl + int64(n))
		ps.mu.Unlock()
		line := "PEER " + hex.EncodeToString(tr.WorkerAddress())
		ps.peerMu.Lock()
		live := append([]*procPeer(nil), ps.peers[:]...)
		ps.peerMu.Unlock()
		for _, p := range live {
			if p != nil {
				_ = p.send(line) // a peer that died meanwhile is restarted with the new address
			}
		}
		ps.log.Warn("decode replaced its wedged UCX worker; peers told its new address", zap.Int("replaced", n))
	}
}

// killPeer kills prefill process i with SIGKILL and starts it again (a new UCX address, so a
// new peer name), then waits for decode to be healthy.
func (ps *procSoak) killPeer(i int) {
	ps.peerMu.Lock()
	old := ps.peers[i]
	ps.peers[i] = nil // requests started from now on are refused until the restart
	ps.peerMu.Unlock()
	if old == nil {
		return
	}
	old.child.Kill()
	ps.injected[FaultLostPeer].Add(1)
	ps.log.Info("peer killed (SIGKILL)", zap.Int("peer", i))
	if !old.child.Reap(peerReapBound) {
		ps.addBreach(fmt.Sprintf("peer %d.gen%d still running %v after SIGKILL", old.idx, old.gen, peerReapBound))
	}
	if ps.cfg.has(FaultDeadPeer) {
		ps.requestToDeadPeer(old)
	}
	if ps.replacePeer(i, old.gen+1, "restarting peer") {
		ps.awaitRecovery(fmt.Sprintf("the restart of peer %d", i), time.Now())
	}
}

// replacePeer starts prefill process i's incarnation gen and puts it in the peers' table, where
// requests find it; a start that fails is a breach, named by what (what the start was for).
func (ps *procSoak) replacePeer(i, gen int, what string) bool {
	fresh, err := ps.startPeer(i, gen)
	if err != nil {
		ps.addBreach(fmt.Sprintf("%s %d: %v", what, i, err))
		return false
	}
	ps.peerMu.Lock()
	ps.peers[i] = fresh
	ps.peerMu.Unlock()
	ps.log.Info("peer restarted", zap.Int("peer", i), zap.Int("gen", gen))
	return true
}

// request runs one request: decode receives here, the peers send, by a route of the mix
// (procmix.go): which prefill process sends it, and which pools both sides use.
func (ps *procSoak) request(r *rand.Rand) {
	cfg := ps.cfg
	id := transfer.RequestID(ps.lastRequest.Add(1))
	route := ps.pickRoute(r)
	ps.inflight[route].Add(1)
	defer ps.inflight[route].Add(-1)
	if route == RouteRMASend {
		ps.requestToPeer(r, id)
		return
	}
	nb, tp, timeout, tight := cfg.drawRequest(r)
	if tight {
		ps.injected[FaultDeadline].Add(1)
	}
	ps.peerMu.Lock()
	peers := ps.peers
	ps.peerMu.Unlock()
	var use []*procPeer
	heads := int64(kvHeads)
	if tp {
		use, heads = peers[:], kvHeads/2
	} else {
		use = []*procPeer{peers[route.sender()]}
	}
	for _, p := range use {
		if p == nil {
			ps.refused.Add(1)
			time.Sleep(time.Millisecond) // a peer is restarting; do not spin
			return
		}
	}
	dstLayout := kvLayout(kvHeads, nb+2)
	dstPool, window, windowOut := ps.receivePool(route, dstLayout.SpanBytes())
	dstBlocks := randomBlocks(r, nb, nb+2)
	var subs []transfer.SubSpec
	var sums []uint32
	var lines []string
	for i, p := range use {
		seed := uint64(id)*2 + uint64(i)
		blocks := randomBlocks(r, nb, nb+2)
		plan, pool := seededPool(heads, nb, seed, blocks)
		sums = append(sums, checksum(plan, pool))
		sel := dstLayout.All()
		if tp {
			sel.HeadBegin, sel.HeadEnd = int64(i)*heads, int64(i+1)*heads
		}
		dst, err := layout.NewPlan(dstLayout, sel, dstBlocks)
		must(err)
		subs = append(subs, transfer.SubSpec{Peer: p.name, Plan: dst})
		lines = append(lines, fmt.Sprintf("SEND %d %d %d %d %d %s %s", id, heads, nb, seed, timeout.Milliseconds(),
			blocksString(blocks), route.senderPool()))
	}
	spec := transfer.Spec{ID: id, Pool: dstPool, Timeout: timeout}
	if tp {
		spec.Subs = subs
	} else {
		spec.Peer, spec.Plan = subs[0].Peer, subs[0].Plan
	}
	dec := ps.decodeNode()
	sd := &side{name: "receive on " + string(dec.name), eng: dec.eng, started: time.Now()}
	h, err := dec.eng.Receive(context.Background(), spec)
	if err != nil {
		ps.startRefused(id, "receive", err, window, windowOut)
		return
	}
	sd.h = h
	ps.hung.track(id, h, route, use...)
	defer ps.hung.untrack(id)
	ps.started.Add(1)
	for i, p := range use {
		if err := p.send(lines[i]); err != nil {
			ps.refused.Add(1) // the peer died; the receive ends by its own bounds
		}
	}
	if cfg.has(FaultCancel) && r.Float64() < cfg.CancelFraction {
		time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
		if r.IntN(2) == 0 {
			ps.recordCancel(dec.eng.Cancel(id).String())
		} else {
			_ = use[r.IntN(len(use))].send(fmt.Sprintf("CANCEL %d", id))
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
		ps.recordPath(pathKey(sd.h, route))
		for i := range subs {
			if got := checksum(subs[i].Plan, dstPool); got != sums[i] {
				ps.corrupt.Add(1)
				ps.addBreach(fmt.Sprintf("request %d (route %s, path %v): completed, but sub %d has checksum %08x, sent %08x",
					id, route, sd.h.Path(), i, got, sums[i]))
			}
		}
	case transfer.Failed:
		ps.failed.Add(1)
		if errorClass(st.Err) == untypedError {
			ps.addBreach(fmt.Sprintf("request %d (route %s): failed with an error that matches no kvxfer sentinel: %v", id, route, st.Err))
		}
	case transfer.Cancelled:
		ps.cancelled.Add(1)
	}
	if errorsIsQuarantined(sd.h.Status().Err) {
		ps.quarantined.Add(1)
	}
	if err := sd.h.Release(); err != nil {
		ps.addBreach(fmt.Sprintf("request %d: release: %v", id, err))
	}
	if windowOut {
		ps.decodeWins.put(window)
	}
}
