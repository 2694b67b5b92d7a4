// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// Report is a soak's result. The counters with "must be 0" in their comment are invariants:
// any of them above zero is also listed in Breaches.
type Report struct {
	// Config echoes what ran.
	DurationSeconds float64 `json:"duration_seconds"`
	Concurrency     int     `json:"concurrency"`
	Seed            uint64  `json:"seed"`
	Faults          []Fault `json:"faults"`

	// Started counts requests whose handles were created (a TP=2 request is one request).
	Started int64 `json:"started"`
	// Refused counts requests an engine refused because it was closing (the restarted peer).
	Refused int64 `json:"refused"`
	// Completed counts requests whose receive completed; their bytes were checked.
	Completed int64 `json:"completed"`
	// CompletedByPath splits Completed by the path the receive took (transfer.Path: staging,
	// direct, rma).
	CompletedByPath map[string]int64 `json:"completed_by_path"`
	// Failed and Cancelled count receives that ended so.
	Failed    int64 `json:"failed"`
	Cancelled int64 `json:"cancelled"`
	// CancelOutcomes counts Engine.Cancel results by outcome name.
	CancelOutcomes map[string]int64 `json:"cancel_outcomes"`
	// Quarantined counts handles (either side) that passed through quarantine.
	Quarantined int64 `json:"quarantined"`
	// PoisonedSlots counts staging slots poisoned, over every engine and generation.
	PoisonedSlots int64 `json:"poisoned_slots"`
	// Wedged handles missed their deadline-plus-grace bound (must be 0).
	Wedged int64 `json:"wedged"`
	// BlocksPoisoned counts one-copy handles whose caller's blocks were poisoned: an operation
	// on them never said whether it let go (a hung or never-quiescent chunk, a peer frozen
	// past the quarantine timeout), so the handle never quiesces (L9). Without any of those
	// faults it must be 0.
	BlocksPoisoned int64 `json:"blocks_poisoned"`
	// PoisonedBlocks counts the callers' KV blocks poisoned for good, over every engine
	// (Health.Numbers.PoisonedBlocks); PoisonedBlockBudget is each engine's bound on them
	// (Config.Tuning.PoisonedBlockBudget), past which it reports unhealthy.
	PoisonedBlocks      int64 `json:"poisoned_blocks"`
	PoisonedBlockBudget int   `json:"poisoned_block_budget"`
	// RememberedUnquiesced counts the handles the engines keep because they are not quiescent
	// although the soak released them (Health.Numbers.Remembered): every released handle
	// whose blocks were poisoned must be counted (fewer is a breach: a handle forgotten).
	RememberedUnquiesced int64 `json:"remembered_unquiesced"`
	// SilentUnhealthySeconds is how long an engine issuing requests one after another to a
	// silent peer (each failing at its deadline, no byte moving) reported unhealthy; with the
	// freeze fault on it must be above 0 (the in-process soak runs the check; 0 elsewhere).
	SilentUnhealthySeconds float64 `json:"silent_unhealthy_seconds"`
	// LeakedSlots were still leased after the drain (must be 0).
	LeakedSlots int64 `json:"leaked_slots"`
	// Corrupt completed transfers whose bytes did not match the sender's checksum (must be 0).
	Corrupt int64 `json:"corrupt"`
	// ReusedPoisoned posts handed a poisoned slot to the transport (must be 0).
	ReusedPoisoned int64 `json:"reused_poisoned"`
	// AccountingErrors: samples where free + leased + poisoned did not add up, or the
	// poisoned count shrank (must be 0).
	AccountingErrors int64 `json:"accounting_errors"`
	// WorkersReplaced counts decode's UCX workers replaced because a killed peer wedged their
	// shared-memory receive queue (peer-process soak; ucx.Config.ReplaceWedgedWorker).
	WorkersReplaced int64 `json:"workers_replaced"`
	// CMAReads counts decode's reads by process_vm_readv (the UCX transport's CMAStats; peer-process
	// soak, route cma).
	CMAReads int64 `json:"cma_reads"`
	// WindowsExhausted counts requests of the peer-process mix that found every window of a
	// registered pool out (each window a handle never quiescent keeps, L9): decode's fall back
	// to Go memory, a peer's are refused. Reported, not bounded: it shows poisoned blocks
	// piling up faster than restarts give them back.
	WindowsExhausted int64 `json:"windows_exhausted"`
	// Crashes counts peer processes that ended other than as the soak told them: a signal it
	// did not send, or a non-zero exit (must be 0).
	Crashes int64 `json:"crashes"`
	// Restarts counts rolling restarts (fault restart), either side; RestartsUnderLoad those
	// whose Close met transfers still in flight after the drain's deadline.
	Restarts          int64 `json:"restarts"`
	RestartsUnderLoad int64 `json:"restarts_under_load"`
	// DeadPeerRequests counts requests to a peer decode knew was dead (fault dead-peer), and
	// LongestDeadPeerSeconds the longest any took to end (each must fail within
	// Config.DeadPeerBound).
	DeadPeerRequests       int64   `json:"dead_peer_requests"`
	LongestDeadPeerSeconds float64 `json:"longest_dead_peer_seconds"`
	// FrozenSeenSeconds is, per route, the longest a freeze with only that route in flight took
	// to turn decode unhealthy (fault freeze-paths; each must be under ProgressDeadline +
	// Config.FrozenSeenSlack, or a breach says so).
	FrozenSeenSeconds map[string]float64 `json:"frozen_seen_seconds,omitempty"`
	// HungPeerHandles splits, by route, decode's handles with a prefill process that hung
	// past their deadline and was then killed (fault hung-peer; FaultsInjected counts the hung
	// peers), and HungPeerQuarantined counts those in quarantine at the kill: the loss must end
	// each of them within the loss bound, with nothing of theirs poisoned after decode heard of
	// it (a breach). HungPeerPoisonedBeforeLoss counts those poisoned before (a quarantine that
	// ran out while the peer was stopped: L9, allowed), and LongestHungPeerQuiesceSeconds is
	// the longest from a kill to decode's last handle with the peer quiescent.
	HungPeerHandles               map[string]int64 `json:"hung_peer_handles,omitempty"`
	HungPeerQuarantined           int64            `json:"hung_peer_quarantined,omitempty"`
	HungPeerPoisonedBeforeLoss    int64            `json:"hung_peer_poisoned_before_loss,omitempty"`
	LongestHungPeerQuiesceSeconds float64          `json:"longest_hung_peer_quiesce_seconds,omitempty"`
	// SecondsUnhealthy is the time any live engine reported unhealthy.
	SecondsUnhealthy float64 `json:"seconds_unhealthy"`
	// LongestDetectSeconds is the longest time from a freeze to the stalled engines
	// reporting unhealthy.
	LongestDetectSeconds float64 `json:"longest_detect_seconds"`
	// LongestRecoverySeconds is the longest time from a peer being back to every live engine
	// reporting healthy.
	LongestRecoverySeconds float64 `json:"longest_recovery_seconds"`
	// StallSeconds is how long the soak's own process was due to run and did not (every
	// goroutine late beyond a few milliseconds, summed; stall.go), and LongestStallSeconds
	// its longest such stall: the wedge check credits a handle with the stalls of its
	// lifetime. Reported, not bounded: it measures the host, not the engine.
	StallSeconds        float64 `json:"stall_seconds"`
	LongestStallSeconds float64 `json:"longest_stall_seconds"`
	// FaultsInjected counts each fault's injections.
	FaultsInjected map[Fault]int64 `json:"faults_injected"`
	// GoroutinesStart and GoroutinesEnd are runtime.NumGoroutine before and after.
	GoroutinesStart int `json:"goroutines_start"`
	GoroutinesEnd   int `json:"goroutines_end"`
	// MaxHeapBytes is the largest heap in use sampled during the run, garbage not yet
	// collected included (it follows GC pacing; reported, not bounded).
	MaxHeapBytes uint64 `json:"max_heap_bytes"`
	// MaxLiveHeapBytes is the largest live heap (what the last collection found reachable)
	// sampled during the run; Config.MaxHeapBytes bounds it.
	MaxLiveHeapBytes uint64 `json:"max_live_heap_bytes"`
	// Skipped lists the parts this machine could not run (the partition without
	// CAP_NET_ADMIN), each with the reason.
	Skipped []string `json:"skipped"`
	// Breaches lists every invariant broken; empty means the run passed.
	Breaches []string `json:"breaches"`
	// Passed is len(Breaches) == 0.
	Passed bool `json:"passed"`
}

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the summary table a person reads after a run.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("duration", fmt.Sprintf("%.0fs, %d concurrent, seed %d", r.DurationSeconds, r.Concurrency, r.Seed))
	row("started", r.Started)
	row("refused (peer restarting)", r.Refused)
	counts := func(prefix string, m map[string]int64) { // one row per key, in order
		for _, k := range slices.Sorted(maps.Keys(m)) {
			row(prefix+k, m[k])
		}
	}
	row("completed (bytes checked)", r.Completed)
	counts("  by ", r.CompletedByPath)
	row("failed", r.Failed)
	row("cancelled", r.Cancelled)
	counts("  cancel ", r.CancelOutcomes)
	row("quarantined", r.Quarantined)
	row("poisoned slots", r.PoisonedSlots)
	row("wedged (must be 0)", r.Wedged)
	row("one-copy handles with blocks poisoned", r.BlocksPoisoned)
	row("  blocks poisoned / budget", fmt.Sprintf("%d / %d", r.PoisonedBlocks, r.PoisonedBlockBudget))
	row("  released, remembered unquiesced", r.RememberedUnquiesced)
	row("unhealthy while a silent peer failed every request", fmt.Sprintf("%.1fs", r.SilentUnhealthySeconds))
	row("leaked slots (must be 0)", r.LeakedSlots)
	row("corrupt (must be 0)", r.Corrupt)
	row("reused poisoned (must be 0)", r.ReusedPoisoned)
	row("accounting errors (must be 0)", r.AccountingErrors)
	if r.WorkersReplaced > 0 {
		row("wedged UCX workers replaced", r.WorkersReplaced)
	}
	if r.CMAReads > 0 {
		row("CMA reads (process_vm_readv)", r.CMAReads)
	}
	if r.WindowsExhausted > 0 {
		row("requests that found every registered window out", r.WindowsExhausted)
	}
	row("crashes (must be 0)", r.Crashes)
	if r.Restarts > 0 {
		row("rolling restarts / Close under load", fmt.Sprintf("%d / %d", r.Restarts, r.RestartsUnderLoad))
	}
	if r.DeadPeerRequests > 0 {
		row("requests to a dead peer / longest", fmt.Sprintf("%d / %.2fs", r.DeadPeerRequests, r.LongestDeadPeerSeconds))
	}
	if n, ok := r.FaultsInjected[FaultHungPeer]; ok && n > 0 {
		var handles int64
		for _, v := range r.HungPeerHandles {
			handles += v
		}
		row("hung peers killed / their handles on decode / quarantined at the kill", fmt.Sprintf("%d / %d / %d", n, handles, r.HungPeerQuarantined))
		counts("  with a hung peer, route ", r.HungPeerHandles)
		row("  poisoned before the loss / longest kill to quiescent", fmt.Sprintf("%d / %.2fs", r.HungPeerPoisonedBeforeLoss, r.LongestHungPeerQuiesceSeconds))
	}
	for _, k := range slices.Sorted(maps.Keys(r.FrozenSeenSeconds)) {
		row("  frozen peer seen, "+k+" in flight", fmt.Sprintf("%.2fs", r.FrozenSeenSeconds[k]))
	}
	row("seconds unhealthy", fmt.Sprintf("%.1f", r.SecondsUnhealthy))
	row("longest detect", fmt.Sprintf("%.2fs", r.LongestDetectSeconds))
	row("longest recovery", fmt.Sprintf("%.2fs", r.LongestRecoverySeconds))
	row("this process stalled / longest", fmt.Sprintf("%.1fs / %.2fs", r.StallSeconds, r.LongestStallSeconds))
	for _, f := range AllFaults {
		if n, ok := r.FaultsInjected[f]; ok {
			row("  injected "+string(f), n)
		}
	}
	row("goroutines start/end", fmt.Sprintf("%d/%d", r.GoroutinesStart, r.GoroutinesEnd))
	row("max heap in use / live", fmt.Sprintf("%.1f / %.1f MiB", float64(r.MaxHeapBytes)/(1<<20), float64(r.MaxLiveHeapBytes)/(1<<20)))
	verdict := "PASS"
	if !r.Passed {
		verdict = fmt.Sprintf("FAIL: %d breaches", len(r.Breaches))
	}
	for _, sk := range r.Skipped {
		row("SKIPPED", sk)
	}
	row("verdict", verdict)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Breaches) > 0 {
		_, err := fmt.Fprintf(w, "breaches:\n  %s\n", strings.Join(r.Breaches, "\n  "))
		return err
	}
	return nil
}
