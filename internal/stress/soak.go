// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/transferdefaults"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// soak is one run: the network, its engines, the fault state the network's fault function
// reads, and the counters the report is built from.
type soak struct {
	cfg       Config
	log       *zap.Logger
	net       *mem.Network
	numSlots  int
	startedAt time.Time

	mu      sync.Mutex // guards decode, prefill, retired, breaches, cancelOutcomes
	decode  *node
	prefill [2]*node
	gens    [2]int
	retired []*node
	breach  []string
	skipped []string

	cancelOutcomes map[string]int64
	paths          map[string]int64 // completed requests by transfer.Path

	// Fault state, read by the network's fault function under the network's lock.
	frozenPeer  atomic.Pointer[transfer.Peer]
	thawAt      atomic.Int64 // unix nanoseconds
	armed       [3]atomic.Bool
	injected    map[Fault]*atomic.Int64
	lastRequest atomic.Uint64

	started, refused, completed, failed, cancelled, quarantined atomic.Int64
	wedged, corrupt, accountingErrors                           atomic.Int64
	blocksPoisoned                                              atomic.Int64 // one-copy handles that never quiesce (L9)
	releasedUnquiesced                                          atomic.Int64 // of those, released by the soak: their engines must remember them
	silentUnhealthy                                             atomic.Int64 // nanoseconds the silent-peer check saw its engine unhealthy
	silentRan                                                   atomic.Bool  // the silent-peer check ran (the in-process soak, with the freeze fault)
	workersReplaced                                             atomic.Int64 // decode's UCX workers replaced (proc.go)
	unhealthyNanos                                              atomic.Int64
	longestDetect, longestRecovery                              atomic.Int64
	maxHeap                                                     atomic.Uint64
	maxLiveHeap                                                 atomic.Uint64
	// Findings reported by peer processes, which have no node here.
	extraPoisoned, extraLeaked, extraReused atomic.Int64
	// The peer-process soak's mix and lifecycle faults (procmix.go).
	crashes          atomic.Int64 // peer processes that ended other than as told
	cmaReads         atomic.Int64 // decode's process_vm_readv reads (the UCX transport's CMAStats)
	longestDeadPeer  atomic.Int64 // nanoseconds: the longest a request to a known dead peer took to end
	windowsExhausted atomic.Int64 // requests a peer refused: every window of its registered pool out for good
}

// The point faults, armed one at a time by the schedule and taken by the next data chunk.
var pointFaults = [3]Fault{FaultHang, FaultLate, FaultNeverQuiesce}

// Run soaks the engines for cfg.Duration, drains them, and checks every invariant. It
// returns the report and, when any invariant broke, an error wrapping ErrBreach (the report
// lists the breaches). ctx cuts the traffic phase short; the drain and checks still run,
// each bounded.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	cfg.Faults = only(cfg.Faults, memFaults)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	defer useStalls()() // the wedge check credits the time this process could not run (stall.go)
	goroutinesStart := runtime.NumGoroutine()
	s, err := newSoak(cfg)
	if err != nil {
		return nil, err
	}
	defer s.watchStalls(processStalls())()
	s.startedAt = time.Now()
	trafficCtx, stopTraffic := context.WithTimeout(ctx, cfg.Duration)
	defer stopTraffic()
	monitorCtx, stopMonitor := context.WithCancel(context.Background())
	monitorDone := make(chan struct{})
	go func() { defer close(monitorDone); s.monitor(monitorCtx) }()

	scheduleDone := make(chan struct{})
	go func() {
		defer close(scheduleDone)
		if cfg.has(FaultFreeze) { // a peer gone silent: the freeze's kin, checked on an engine of its own
			silentDone := make(chan struct{})
			go func() { defer close(silentDone); s.silentPeer(trafficCtx, cfg.ProgressDeadline) }()
			defer func() { <-silentDone }()
		}
		s.schedule(trafficCtx)
	}()

	var workers sync.WaitGroup
	for w := range cfg.Concurrency {
		workers.Add(1)
		go func() { defer workers.Done(); s.worker(trafficCtx, uint64(w)) }()
	}

	// Every request a worker starts ends within its quiesce bound, and the worker then stops;
	// the schedule's last step (a recovery check) is bounded by RecoveryBound.
	drainBound := cfg.Duration + s.quiesceBound(cfg.TransferTimeout) + cfg.RecoveryBound + cfg.FreezeFor + cfg.Grace
	if !waitBounded(&workers, scheduleDone, time.Until(s.startedAt.Add(drainBound))) {
		s.addBreach(fmt.Sprintf("workers or schedule still running %v after the start: the soak itself wedged", drainBound))
	}
	s.drainAndCheck()
	stopMonitor()
	<-monitorDone // the monitor only sleeps on a ticker or this context
	s.closeAll()
	goroutinesEnd := s.waitGoroutines(goroutinesStart)

	rep := s.report(goroutinesStart, goroutinesEnd)
	if len(rep.Breaches) > 0 {
		return rep, fmt.Errorf("%w: %d breaches, first: %s", ErrBreach, len(rep.Breaches), rep.Breaches[0])
	}
	return rep, nil
}

// newSoak builds the network and the three engines of a run from a Config with defaults.
func newSoak(cfg Config) (*soak, error) {
	cfg = cfg.withDefaults()
	s := &soak{cfg: cfg, log: cfg.Logger, net: mem.NewNetwork(), cancelOutcomes: map[string]int64{}, paths: map[string]int64{},
		injected: map[Fault]*atomic.Int64{}}
	for _, f := range AllFaults {
		s.injected[f] = new(atomic.Int64)
	}
	// Each hung or never-quiescent chunk poisons up to two slots per side for good; give the
	// pools room for every one the schedule can inject, so poison alone never starves them.
	s.numSlots = 2*cfg.MaxConcurrent + 4*int(cfg.Duration/s.pointInterval()+1) + 16
	s.net.SetFault(s.fault)
	var err error
	if s.decode, err = s.newNode("decode"); err != nil {
		return nil, err
	}
	for i := range s.prefill {
		if s.prefill[i], err = s.newNode(s.prefillName(i)); err != nil {
			s.closeAll()
			return nil, err
		}
	}
	return s, nil
}

// waitBounded waits for wg and done, for at most d.
func waitBounded(wg *sync.WaitGroup, done <-chan struct{}, d time.Duration) bool {
	all := make(chan struct{})
	go func() { wg.Wait(); <-done; close(all) }()
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-all:
		return true
	case <-t.C:
		return false
	}
}

func (s *soak) prefillName(i int) transfer.Peer {
	if s.gens[i] == 0 {
		return transfer.Peer(fmt.Sprintf("prefill-%d", i))
	}
	return transfer.Peer(fmt.Sprintf("prefill-%d.gen%d", i, s.gens[i]))
}

func (s *soak) newNode(name transfer.Peer) (*node, error) {
	cfg := s.cfg
	staging := make([]byte, int64(s.numSlots)*cfg.SlotBytes)
	n := &node{name: name, mem: s.net.Transport(name)}
	n.slot = newSlotTracker(n.mem, staging, cfg.SlotBytes)
	eng, err := transfer.New(n.slot, transfer.Config{
		SlotBytes: cfg.SlotBytes, MaxConcurrent: cfg.MaxConcurrent, StagingMemory: staging,
		TransferTimeout: cfg.TransferTimeout, QueueTimeout: cfg.QueueTimeout, ProgressDeadline: cfg.ProgressDeadline,
		CloseTimeout: cfg.QuarantineTimeout + cfg.Grace,
		Logger:       cfg.EngineLogger.With(zap.String("engine", string(name))), Observer: n,
		Tuning: tuning.Config{
			NumSlots: s.numSlots, QuarantineTimeout: cfg.QuarantineTimeout, PoisonedBlockBudget: s.poisonedBlockBudget(),
			// Whole 16 KiB blocks take RMA gets; a TP=2 rank's 2 KiB pieces of them do not, and
			// take IOV messages: a direct request exercises both.
			RMAMinRegionBytes: 8 << 10,
		},
	})
	if err != nil {
		_ = n.slot.Close(true)
		return nil, fmt.Errorf("stress: starting engine %s: %w", name, err)
	}
	n.eng = eng
	return n, nil
}

// poisonedBlockBudget is each engine's Config.Tuning.PoisonedBlockBudget: the faults that leave
// quiescence unknown poison about a hundred blocks a minute of soak (30 in a 20 s run), so the
// default's 1024 blocks are allowed per five minutes of run: a long soak is not unhealthy for
// what its schedule injects, and only poison that piles up faster trips it.
func (s *soak) poisonedBlockBudget() int {
	return transferdefaults.PoisonedBlocks * max(1, int(s.cfg.Duration/(5*time.Minute)))
}

// live returns the engines serving now.
func (s *soak) live() []*node {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*node
	for _, n := range []*node{s.decode, s.prefill[0], s.prefill[1]} {
		if n != nil { // the process mode has no prefill nodes in this process
			out = append(out, n)
		}
	}
	return out
}

// skip records a part of the soak that this machine cannot run.
func (s *soak) skip(msg string) {
	s.log.Warn("part of the soak skipped", zap.String("why", msg))
	s.mu.Lock()
	s.skipped = append(s.skipped, msg)
	s.mu.Unlock()
}

func (s *soak) addBreach(msg string) {
	s.log.Error("invariant breached", zap.String("breach", msg))
	s.mu.Lock()
	if len(s.breach) < 200 {
		s.breach = append(s.breach, msg)
	}
	s.mu.Unlock()
}

// fault is the network's fault function. It runs under the network's lock: it must not call
// back into the network.
func (s *soak) fault(fp mem.FaultPoint) mem.Fault {
	if p := s.frozenPeer.Load(); p != nil && (fp.From == *p || fp.To == *p) {
		if d := time.Until(time.Unix(0, s.thawAt.Load())); d > 0 {
			// A stopped process neither sends nor reads: whatever it would exchange waits
			// until it runs again.
			return mem.Fault{Delay: d}
		}
	}
	if fp.Kind != transport.KindData {
		return mem.Fault{}
	}
	for i, f := range pointFaults {
		if !s.armed[i].CompareAndSwap(true, false) {
			continue
		}
		s.injected[f].Add(1)
		s.log.Info("fault injected", zap.String("fault", string(f)), zap.Uint64("request", uint64(fp.Tag.Request)),
			zap.String("from", fp.From.Short()), zap.String("to", fp.To.Short()))
		switch f {
		case FaultHang:
			return mem.Fault{Hang: true}
		case FaultLate:
			// Past any request's deadline, before its quarantine ends: the quarantine is
			// resolved by the late completion, with a release.
			return mem.Fault{Delay: s.cfg.TransferTimeout + s.cfg.QuarantineTimeout/2, IgnoreCancel: true}
		case FaultNeverQuiesce:
			return mem.Fault{Delay: s.cfg.TransferTimeout + s.cfg.QuarantineTimeout + s.cfg.Grace, NeverQuiesce: true}
		}
	}
	return mem.Fault{}
}

// pointInterval is how often a point fault (hang, late, never quiesce) is armed.
func (s *soak) pointInterval() time.Duration {
	return min(max(s.cfg.Duration/8, time.Second), 10*time.Second)
}

// quiesceBound is how long after its start a request with the given deadline may take to be
// quiescent on both sides: queued at most QueueTimeout, its deadline, the cancel grace, the
// quarantine timeout, and the slack Grace twice (once for Done, once for Quiesced).
func (s *soak) quiesceBound(timeout time.Duration) time.Duration {
	return s.doneBound(timeout) + s.cfg.QuarantineTimeout + s.cfg.Grace
}

// doneBound is how long after its start a request may take to reach an outcome.
func (s *soak) doneBound(timeout time.Duration) time.Duration {
	return s.cfg.QueueTimeout + timeout + transferdefaults.CancelGrace + s.cfg.Grace
}

// closeAll closes every engine still open, and the retired ones' transports.
func (s *soak) closeAll() {
	s.mu.Lock()
	ns := append([]*node{s.decode}, s.prefill[:]...)
	s.mu.Unlock()
	for _, n := range ns {
		if n != nil && n.eng != nil { // Close is idempotent
			if err := n.eng.Close(); err != nil {
				s.addBreach(fmt.Sprintf("closing engine %s: %v", n.name, err))
			}
		}
	}
}

// waitGoroutines waits, bounded, for the goroutine count to fall back to where it started.
func (s *soak) waitGoroutines(start int) int {
	deadline := time.Now().Add(5*time.Second + s.cfg.Grace)
	n := runtime.NumGoroutine()
	for n > start && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > start {
		buf := make([]byte, 1<<16)
		buf = buf[:runtime.Stack(buf, true)]
		s.log.Error("goroutines left behind", zap.ByteString("stacks", buf))
		s.addBreach(fmt.Sprintf("%d goroutines at the end, %d at the start", n, start))
	}
	return n
}

// drainAndCheck waits for every engine to finish its transfers, then checks that nothing is
// leased and that every poisoned slot was heard about.
func (s *soak) drainAndCheck() {
	for _, n := range s.live() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.QuarantineTimeout+s.cfg.Grace)
		if err := n.eng.Drain(ctx); err != nil {
			s.addBreach(fmt.Sprintf("engine %s did not drain: %v", n.name, err))
		}
		cancel()
		s.checkDrained(n)
	}
}

// checkDrained checks a drained (or closed) engine's pool: nothing leased, and the poisoned
// slots are exactly those the observer reported.
func (s *soak) checkDrained(n *node) {
	h := n.eng.Health()
	if leased := h.Numbers.TotalSlots - h.Numbers.FreeSlots - h.Numbers.PoisonedSlots; leased != 0 {
		s.addBreach(fmt.Sprintf("engine %s: %d slots still leased after the drain (total %d, free %d, poisoned %d)",
			n.name, leased, h.Numbers.TotalSlots, h.Numbers.FreeSlots, h.Numbers.PoisonedSlots))
	}
	seen, reused, foreign := n.slot.findings()
	if seen != h.Numbers.PoisonedSlots {
		s.addBreach(fmt.Sprintf("engine %s: pool says %d slots poisoned, the observer heard of %d", n.name, h.Numbers.PoisonedSlots, seen))
	}
	for _, r := range reused {
		s.addBreach(fmt.Sprintf("engine %s: poisoned slot reused: %s", n.name, r))
	}
	for _, f := range foreign {
		s.addBreach(fmt.Sprintf("engine %s: %s", n.name, f))
	}
}

func (s *soak) report(goroutinesStart, goroutinesEnd int) *Report {
	s.mu.Lock()
	nodes := append([]*node{s.decode}, s.prefill[:]...)
	nodes = append(nodes, s.retired...)
	outcomes := make(map[string]int64, len(s.cancelOutcomes))
	for k, v := range s.cancelOutcomes {
		outcomes[k] = v
	}
	paths := make(map[string]int64, len(s.paths))
	for k, v := range s.paths {
		paths[k] = v
	}
	breaches := append([]string(nil), s.breach...)
	skipped := append([]string{}, s.skipped...)
	s.mu.Unlock()

	r := &Report{
		DurationSeconds: s.cfg.Duration.Seconds(), Concurrency: s.cfg.Concurrency, Seed: s.cfg.Seed, Faults: s.cfg.Faults,
		Started: s.started.Load(), Refused: s.refused.Load(), Completed: s.completed.Load(), Failed: s.failed.Load(),
		Cancelled: s.cancelled.Load(), CancelOutcomes: outcomes, CompletedByPath: paths, Quarantined: s.quarantined.Load(),
		Wedged: s.wedged.Load(), BlocksPoisoned: s.blocksPoisoned.Load(), Corrupt: s.corrupt.Load(), AccountingErrors: s.accountingErrors.Load(),
		WorkersReplaced:        s.workersReplaced.Load(),
		SecondsUnhealthy:       time.Duration(s.unhealthyNanos.Load()).Seconds(),
		LongestDetectSeconds:   time.Duration(s.longestDetect.Load()).Seconds(),
		LongestRecoverySeconds: time.Duration(s.longestRecovery.Load()).Seconds(),
		FaultsInjected:         map[Fault]int64{}, GoroutinesStart: goroutinesStart, GoroutinesEnd: goroutinesEnd,
		MaxHeapBytes: s.maxHeap.Load(), MaxLiveHeapBytes: s.maxLiveHeap.Load(), Skipped: skipped,
	}
	r.PoisonedSlots, r.LeakedSlots, r.ReusedPoisoned = s.extraPoisoned.Load(), s.extraLeaked.Load(), s.extraReused.Load()
	r.SilentUnhealthySeconds = time.Duration(s.silentUnhealthy.Load()).Seconds()
	total, longest, _ := processStalls().figures()
	r.StallSeconds, r.LongestStallSeconds = total.Seconds(), longest.Seconds()
	for _, n := range nodes {
		if n == nil {
			continue
		}
		h := n.eng.Health()
		r.PoisonedSlots += int64(h.Numbers.PoisonedSlots)
		r.PoisonedBlocks += h.Numbers.PoisonedBlocks
		r.RememberedUnquiesced += h.Numbers.Remembered
		r.PoisonedBlockBudget = h.Numbers.PoisonedBudget // every engine has the same
		if leased := h.Numbers.TotalSlots - h.Numbers.FreeSlots - h.Numbers.PoisonedSlots; leased > 0 {
			r.LeakedSlots += int64(leased)
		}
		_, reused, _ := n.slot.findings()
		r.ReusedPoisoned += int64(len(reused))
	}
	for _, f := range s.cfg.Faults {
		r.FaultsInjected[f] = s.injected[f].Load()
		if r.FaultsInjected[f] == 0 && !(f == FaultPartition && len(skipped) > 0) {
			breaches = append(breaches, fmt.Sprintf("fault %s was enabled but never injected", f))
		}
	}
	if r.Wedged > 0 {
		breaches = append(breaches, fmt.Sprintf("%d handles wedged", r.Wedged))
	}
	if r.Corrupt > 0 {
		breaches = append(breaches, fmt.Sprintf("%d completed transfers corrupt", r.Corrupt))
	}
	if r.BlocksPoisoned > 0 && !slices.ContainsFunc(s.cfg.Faults, leavesQuiescenceUnknown) {
		breaches = append(breaches, fmt.Sprintf("%d one-copy handles poisoned their caller's blocks, with no fault on that can leave quiescence unknown",
			r.BlocksPoisoned))
	}
	if released := s.releasedUnquiesced.Load(); r.RememberedUnquiesced < released {
		breaches = append(breaches, fmt.Sprintf("%d handles released while not quiescent, but their engines remember %d: a handle was forgotten",
			released, r.RememberedUnquiesced))
	}
	if s.silentRan.Load() && r.SilentUnhealthySeconds == 0 {
		breaches = append(breaches, "an engine whose requests to a silent peer failed one after another, no byte moving, never reported unhealthy")
	}
	if r.MaxLiveHeapBytes > s.cfg.MaxHeapBytes {
		breaches = append(breaches, fmt.Sprintf("live heap reached %d bytes, over the %d-byte bound", r.MaxLiveHeapBytes, s.cfg.MaxHeapBytes))
	}
	if r.Started == 0 {
		breaches = append(breaches, "no request started")
	}
	r.Breaches = breaches
	if r.Breaches == nil {
		r.Breaches = []string{}
	}
	r.Passed = len(r.Breaches) == 0
	return r
}

// leavesQuiescenceUnknown reports whether fault f can leave an operation that never says
// whether it let go of its memory: the only cause of poisoned blocks (or slots).
func leavesQuiescenceUnknown(f Fault) bool {
	switch f {
	case FaultHang, FaultNeverQuiesce, FaultLate, FaultFreeze, FaultLostPeer, FaultPartition, FaultRestart, FaultFreezePaths,
		FaultHungPeer: // a quarantine that runs out while the peer is stopped, before the kill
		return true
	}
	return false
}

// errorsIsClosed reports whether err says the engine was closing: the restarted peer's old
// engine refuses new requests, which is not a breach.

func errorsIsClosed(err error) bool { return errors.Is(err, transfer.ErrClosed) }

// errorsIsQuarantined reports whether a handle's error says it passed through quarantine.
func errorsIsQuarantined(err error) bool { return errors.Is(err, transfer.ErrQuarantined) }
