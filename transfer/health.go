// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/transfer/health"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Health is the engine's verdict on itself, with the reason when unhealthy and the numbers
// behind it.
type Health struct {
	Healthy bool
	// Reason says why the engine is unhealthy ("" when healthy); several reasons are joined
	// with "; ".
	Reason string
	// Numbers are what the verdict was computed from (package transfer/health): package
	// observe exports them as gauges; a serving program's probes need only Healthy and Reason.
	Numbers health.Numbers
}

// Health tells the truth (L12): unhealthy when no byte moved and no transfer completed for
// Config.ProgressDeadline while transfers were asked for (in flight, other than streaming
// ones waiting on the model's layers, or ending without success one after another, whether
// active or still queued: a request that timed out waiting for its peer's hello, its
// receiver's request or admission counts as an active failure does),
// when more transfers wait in quarantine than the budget allows (those quarantined for good
// with their caller's blocks poisoned are settled, not waiting), when more of the callers'
// blocks are poisoned for good than Config.Tuning.PoisonedBlockBudget, when poisoned slots leave
// fewer than MaxConcurrent, while every generation word of the transport is held (rma and pull
// offers are declined then), or once a Mover could not say whether its copy ended (a GPU kernel
// past its timeout: the device is wedged). It never blocks.
func (e *Engine) Health() Health {
	st := e.pool.Stats()
	// The settled count first: a handle joins it only after it joined the quarantined count
	// and never leaves either, so a snapshot never holds more settled than quarantined.
	settled := e.poisonedForGood.Load()
	s := health.Numbers{
		InFlight: e.inFlight.Load(), AwaitingReady: e.awaiting.Load(), Quarantined: e.quarantined.Load(), QuarantineBudget: e.cfg.Tuning.QuarantineBudget,
		TotalSlots: st.Total, FreeSlots: st.Free, PoisonedSlots: st.Poisoned, MinSlots: e.cfg.MaxConcurrent,
		ProgressDeadline: e.cfg.ProgressDeadline,
		MalformedControl: e.malformed.Load(), StaleMessages: e.stale.Load(), ProtocolRefusals: e.refused.Load(), BlocksPoisoned: settled, Remembered: e.remembered.Load(),
		PoisonedBlocks: e.blocksPoisoned.Load(), PoisonedBudget: e.cfg.Tuning.PoisonedBlockBudget,
	}
	now := time.Now().UnixNano()
	stallFrom, lastFailure := e.stallFrom.Load(), e.lastFailure.Load()
	s.SinceProgress = time.Duration(now - stallFrom)
	var why []string
	if e.isClosed() {
		s.Closed = true
		why = append(why, "engine closed")
	}
	// Transfers were asked for since the clock started: one is in flight now, or one ended
	// without completing (failed, cancelled, quarantined; active or still queued) less than
	// a deadline ago. A streaming transfer that waits for its layers is not stalled: the
	// model is computing. It is bounded by its own deadline, not by this rule.
	asked := s.InFlight > s.AwaitingReady ||
		(lastFailure > stallFrom && time.Duration(now-lastFailure) <= s.ProgressDeadline)
	if asked && s.SinceProgress > s.ProgressDeadline {
		while := fmt.Sprintf("%d are in flight", s.InFlight)
		if s.InFlight <= s.AwaitingReady {
			while = "transfers were asked for and failed"
		}
		why = append(why, fmt.Sprintf("no transfer progressed for %v (deadline %v) while %s",
			s.SinceProgress.Round(time.Millisecond), s.ProgressDeadline, while))
	}
	if th, ok := e.tr.(transport.TransportHealth); ok {
		if err := th.TransportHealth(); err != nil {
			s.TransportWedged = true
			why = append(why, err.Error())
		}
	}
	if w := e.generationHealth(&s); w != "" {
		why = append(why, w)
	}
	if p := e.moverWedged.Load(); p != nil {
		s.MoverWedged = true
		why = append(why, fmt.Sprintf("mover wedged: %v", *p))
	}
	// A transfer quarantined for good with its caller's blocks poisoned is settled: the engine
	// gave up on it and the caller owns the blocks. Only those still waiting count.
	if waiting := s.Quarantined - s.BlocksPoisoned; waiting > int64(s.QuarantineBudget) {
		why = append(why, fmt.Sprintf("%d transfers quarantined, over the budget of %d", waiting, s.QuarantineBudget))
	}
	if s.PoisonedBlocks > int64(s.PoisonedBudget) {
		why = append(why, fmt.Sprintf("%d KV blocks poisoned for good (in %d transfers), over the budget of %d",
			s.PoisonedBlocks, s.BlocksPoisoned, s.PoisonedBudget))
	}
	if usable := s.TotalSlots - s.PoisonedSlots; usable < s.MinSlots {
		why = append(why, fmt.Sprintf("%d of %d staging slots poisoned: %d usable, %d needed for MaxConcurrent",
			s.PoisonedSlots, s.TotalSlots, usable, s.MinSlots))
	}
	return Health{Healthy: len(why) == 0, Reason: strings.Join(why, "; "), Numbers: s}
}
