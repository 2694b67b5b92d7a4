// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer"
)

// cycle is the period of the freeze and lost-peer schedule: each cycle freezes the decode
// peer once and kills and restarts one prefill peer once.
func (s *soak) cycle() time.Duration { return min(s.cfg.Duration, 60*time.Second) }

// schedule injects the timed faults until ctx ends: point faults on their own ticker, and
// per cycle one freeze (at 15%) and one lost peer (at 45%), each followed by its health
// checks. A step that runs long delays the next one; none is skipped while traffic runs.
func (s *soak) schedule(ctx context.Context) {
	pointsDone := make(chan struct{})
	go func() { defer close(pointsDone); s.armPointFaults(ctx) }()
	defer func() { <-pointsDone }() // armPointFaults ends with ctx

	c := s.cycle()
	for k := 0; ; k++ {
		base := s.startedAt.Add(time.Duration(k) * c)
		if s.cfg.has(FaultFreeze) {
			if !sleepUntil(ctx, base.Add(c*15/100)) {
				return
			}
			s.freeze()
		}
		if s.cfg.has(FaultLostPeer) {
			if !sleepUntil(ctx, base.Add(c*45/100)) {
				return
			}
			s.losePeer(k % 2)
		}
		if s.cfg.has(FaultRestart) {
			if !sleepUntil(ctx, base.Add(c*70/100)) {
				return
			}
			s.restartUnderLoad(k % 2)
		}
		if !sleepUntil(ctx, base.Add(c)) {
			return
		}
	}
}

// sleepUntil waits for t or ctx; it reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	tm := time.NewTimer(max(time.Until(t), 0))
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return ctx.Err() == nil
	}
}

// armPointFaults arms hang, late and never-quiesce in turn, one per pointInterval; the next
// data chunk to travel takes it.
func (s *soak) armPointFaults(ctx context.Context) {
	var enabled []int
	for i, f := range pointFaults {
		if s.cfg.has(f) {
			enabled = append(enabled, i)
		}
	}
	if len(enabled) == 0 {
		return
	}
	t := time.NewTicker(s.pointInterval())
	defer t.Stop()
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.armed[enabled[k%len(enabled)]].Store(true)
		}
	}
}

// freeze holds every message to or from the decode peer for FreezeFor, as SIGSTOP would.
// The prefill engines, whose only peer it is, and decode itself, whose requests keep being
// issued while no byte reaches it, must turn unhealthy within the progress deadline (plus
// Grace), and every live engine must be healthy within RecoveryBound of the thaw.
func (s *soak) freeze() {
	s.mu.Lock()
	peer := s.decode.name
	stalled := []*node{s.prefill[0], s.prefill[1], s.decode}
	s.mu.Unlock()
	t0 := time.Now()
	thaw := t0.Add(s.cfg.FreezeFor)
	s.thawAt.Store(thaw.UnixNano())
	s.frozenPeer.Store(&peer)
	s.injected[FaultFreeze].Add(1)
	s.log.Info("peer frozen", zap.String("peer", peer.Short()), zap.Duration("for", s.cfg.FreezeFor))
	defer s.frozenPeer.Store(nil)

	detectBy := t0.Add(min(s.cfg.ProgressDeadline+s.cfg.Grace, s.cfg.FreezeFor))
	seen := map[transfer.Peer]time.Duration{}
	// An engine all of whose transfers in flight await the model (a streaming transfer waiting
	// for its layers) has no stall of its own to report at that moment. An RMA sender whose
	// receiver froze is no longer excused: no Done comes, and it reports the stall (L12).
	excused := map[transfer.Peer]bool{}
	for len(seen) < len(stalled) && time.Now().Before(detectBy) {
		for _, n := range stalled {
			if _, ok := seen[n.name]; ok {
				continue
			}
			h := n.eng.Health()
			if !h.Healthy {
				seen[n.name] = time.Since(t0)
			} else if h.Numbers.InFlight <= h.Numbers.AwaitingReady {
				excused[n.name] = true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, n := range stalled {
		d, ok := seen[n.name]
		if !ok && excused[n.name] {
			s.log.Info("engine healthy while its peer was frozen, with nothing of its own stalled at times",
				zap.String("engine", string(n.name)))
			continue
		}
		if !ok {
			s.addBreach(fmt.Sprintf("engine %s stayed healthy for %v while its only peer %s was frozen (progress deadline %v)",
				n.name, detectBy.Sub(t0).Round(time.Millisecond), peer, s.cfg.ProgressDeadline))
			continue
		}
		storeMax(&s.longestDetect, d)
	}
	time.Sleep(time.Until(thaw))
	s.frozenPeer.Store(nil)
	s.log.Info("peer thawed", zap.String("peer", peer.Short()))
	s.awaitRecovery(fmt.Sprintf("the thaw of %s", peer), thaw)
}

// losePeer cuts prefill peer i off for good, as SIGKILL would, closes its engine as the dead
// process's would be gone, checks that engine's pool, and starts a new engine under a new
// name, as a restarted process would register anew. Every live engine must then be healthy
// within RecoveryBound.
func (s *soak) losePeer(i int) {
	s.mu.Lock()
	old := s.prefill[i]
	s.mu.Unlock()
	s.injected[FaultLostPeer].Add(1)
	s.log.Info("peer lost", zap.String("peer", string(old.name)))
	s.net.LosePeer(old.name)
	time.Sleep(min(500*time.Millisecond, s.cfg.Duration/20)) // the peer stays down a moment
	if err := old.eng.Close(); err != nil {
		s.addBreach(fmt.Sprintf("closing the lost engine %s: %v", old.name, err))
	}
	s.checkDrained(old)

	s.mu.Lock()
	s.gens[i]++
	name := s.prefillName(i)
	s.mu.Unlock()
	fresh, err := s.newNode(name)
	if err != nil {
		s.addBreach(fmt.Sprintf("restarting %s as %s: %v", old.name, name, err))
		return
	}
	s.mu.Lock()
	s.prefill[i] = fresh
	s.retired = append(s.retired, old)
	s.mu.Unlock()
	s.log.Info("peer restarted", zap.String("peer", string(name)))
	s.awaitRecovery(fmt.Sprintf("the restart of %s as %s", old.name, name), time.Now())
}

// abruptEnd says whether the restart of an engine's incarnation n gives its Drain no time at
// all: its Close then meets every transfer in flight, as when a pod's termination grace runs
// out (docs/serving.md, "Graceful shutdown"). The others drain for DrainFor first, which on
// this soak's small transfers usually ends them all; alternating covers both promises.
func abruptEnd(n int) bool { return n%2 == 1 }

// restartUnderLoad (fault restart, in-process) restarts prefill engine i the way a rolling
// update does, still connected and under load: Drain with a deadline (none at all every other
// cycle: abruptEnd), then Close with whatever is in flight, then a new engine under a new
// name. Unlike lost-peer, nothing cuts the old engine off first: its Close must end its
// transfers itself, and its peers must see them end.
func (s *soak) restartUnderLoad(i int) {
	s.mu.Lock()
	old := s.prefill[i]
	s.mu.Unlock()
	s.injected[FaultRestart].Add(1)
	drainFor := s.cfg.DrainFor
	if abruptEnd(int(s.injected[FaultRestart].Load())) {
		drainFor = 0
	}
	s.log.Info("engine restarting under load", zap.String("engine", string(old.name)), zap.Duration("drain_for", drainFor))
	s.mu.Lock()
	s.gens[i]++
	name := s.prefillName(i)
	s.mu.Unlock()
	fresh, err := s.newNode(name) // the new incarnation first, as a rolling update starts it
	if err != nil {
		s.addBreach(fmt.Sprintf("restart: starting %s: %v", name, err))
		return
	}
	s.mu.Lock()
	s.prefill[i] = fresh // new requests go to it from now on
	s.retired = append(s.retired, old)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), drainFor)
	_ = old.eng.Drain(ctx) // a deadline missed is the point: Close meets what is left
	cancel()
	if err := old.eng.Close(); err != nil {
		s.addBreach(fmt.Sprintf("restart: closing %s under load: %v", old.name, err))
	}
	s.checkDrained(old)
	s.awaitRecovery(fmt.Sprintf("the restart of %s as %s", old.name, name), time.Now())
}

// awaitRecovery waits, bounded by RecoveryBound, for every live engine to be healthy after
// what happened at since.
func (s *soak) awaitRecovery(what string, since time.Time) {
	deadline := since.Add(s.cfg.RecoveryBound)
	for {
		var sick []string
		for _, n := range s.live() {
			if h := n.eng.Health(); !h.Healthy {
				sick = append(sick, fmt.Sprintf("%s (%s)", n.name, h.Reason))
			}
		}
		if len(sick) == 0 {
			storeMax(&s.longestRecovery, time.Since(since))
			return
		}
		if time.Now().After(deadline) {
			s.addBreach(fmt.Sprintf("still unhealthy %v after %s: %v", s.cfg.RecoveryBound, what, sick))
			storeMax(&s.longestRecovery, time.Since(since))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func storeMax(v interface {
	Load() int64
	CompareAndSwap(old, new int64) bool
}, d time.Duration) {
	for {
		cur := v.Load()
		if int64(d) <= cur || v.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// monitor samples every live engine's health until ctx ends: pool accounting (free +
// leased + poisoned = total: Health reports free and poisoned, so leased = total - free -
// poisoned must never be negative), poisoned counts that only grow, time spent unhealthy,
// and the heap.
func (s *soak) monitor(ctx context.Context) {
	const every = 50 * time.Millisecond
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			sick := false
			for _, n := range s.live() {
				h := n.eng.Health()
				if h.Numbers.FreeSlots < 0 || h.Numbers.PoisonedSlots < 0 || h.Numbers.FreeSlots+h.Numbers.PoisonedSlots > h.Numbers.TotalSlots {
					s.accountingErrors.Add(1)
					s.addBreach(fmt.Sprintf("engine %s: free %d + poisoned %d exceeds total %d", n.name, h.Numbers.FreeSlots, h.Numbers.PoisonedSlots, h.Numbers.TotalSlots))
				}
				if p := int64(h.Numbers.PoisonedSlots); p < n.maxPoisoned.Load() {
					s.accountingErrors.Add(1)
					s.addBreach(fmt.Sprintf("engine %s: poisoned slots fell from %d to %d", n.name, n.maxPoisoned.Load(), p))
				} else {
					n.maxPoisoned.Store(p)
				}
				sick = sick || !h.Healthy
			}
			if sick {
				s.unhealthyNanos.Add(int64(now.Sub(last)))
			}
			last = now
			if k%20 == 0 {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > s.maxHeap.Load() {
					s.maxHeap.Store(ms.HeapInuse)
				}
				if live := liveHeap(); live > s.maxLiveHeap.Load() {
					s.maxLiveHeap.Store(live)
				}
			}
		}
	}
}

// liveHeap is the heap the last garbage collection found reachable. The bound applies to it,
// not to HeapInuse: the soak allocates a fresh pool per request (hundreds of GB over a long
// run), so HeapInuse between two collections is mostly garbage and swings with GC pacing,
// while a leak shows as live heap that keeps growing.
func liveHeap() uint64 {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0 // not provided by this runtime; the HeapInuse figure still reports
	}
	return sample[0].Value.Uint64()
}

// recordPath counts a completed request by the path its receive took (a transfer.Path's
// name, or a finer one of the peer-process mix: staging-pull, rma-host).
func (s *soak) recordPath(key string) {
	s.mu.Lock()
	s.paths[key]++
	s.mu.Unlock()
}

// recordCancel counts one Engine.Cancel outcome.
func (s *soak) recordCancel(outcome string) {
	s.mu.Lock()
	s.cancelOutcomes[outcome]++
	s.mu.Unlock()
}
