// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvxfer/kvxfer/transfer"
)

// HealthSource is what this package needs of an engine: its verdict on itself. *transfer.Engine
// implements it; Health must not block (the engine's never does).
type HealthSource interface {
	Health() transfer.Health
}

// healthFunc adapts a function to HealthSource (CombineHealth's verdict).
type healthFunc func() transfer.Health

// Health calls f.
func (f healthFunc) Health() transfer.Health { return f() }

var _ HealthSource = (*transfer.Engine)(nil)

// CollectHealth registers, on the Metrics' Registerer and with its ConstLabels, gauges read
// from src.Health() at every scrape, so they are never staler than the scrape itself:
//
//	kvxfer_healthy                          1 when healthy, 0 when not
//	kvxfer_transfers_in_flight              handles advertised or in flight
//	kvxfer_quarantined_transfers            handles quarantined now
//	kvxfer_quarantine_budget_transfers      the most that may wait there, healthy
//	kvxfer_blocks_poisoned_transfers        quarantined for good, the caller's blocks poisoned
//	                                        (not counted against the budget; the blocks are lost
//	                                        to the caller until it restarts: alert on growth)
//	kvxfer_staging_slots                    staging slots, poisoned included
//	kvxfer_staging_slots_free               slots free now
//	kvxfer_staging_slots_poisoned           slots out of circulation for good
//	kvxfer_staging_slots_min                slots needed to serve MaxConcurrent transfers
//	kvxfer_since_last_progress_seconds      since a chunk last moved or a transfer ended
//	kvxfer_progress_deadline_seconds        when that exceeds this with work in flight: unhealthy
//	kvxfer_malformed_control_messages_total control messages that did not decode
//	kvxfer_transport_wedged                 1 when the transport reports it cannot deliver
//	                                        (UCX's receive probe): restart the process
//	kvxfer_generation_words_held            generation words held by rma and pull exposures
//	kvxfer_generation_words                 the transport's generation words in all: when
//	                                        every one is held, offers are declined (unhealthy)
//	kvxfer_offers_declined_no_generation_word_total
//	                                        rma and pull offers declined for want of a word
//	kvxfer_stale_messages_total             messages of an older transfer (another nonce), dropped
//	kvxfer_protocol_refusals_total          transfers failed because the peer broke the protocol
//	                                        (an offer, key or range refused: docs/security.md)
//
// Call it once per Metrics, after the engine exists (the engine takes the Metrics as its
// observer at construction, so the two cannot be made in one step).
func (m *Metrics) CollectHealth(src HealthSource) error {
	if src == nil {
		return &transfer.ConfigError{Field: "CollectHealth(src)", Reason: "required: pass the engine"}
	}
	if err := m.reg.Register(newHealthCollector(src, m.constLabels)); err != nil {
		return &transfer.ConfigError{Field: "MetricsConfig.Registerer", Reason: "registering the health gauges (CollectHealth called twice?)", Cause: err}
	}
	return nil
}

// healthCollector turns one Health() call per scrape into gauges.
type healthCollector struct {
	src                                                           HealthSource
	healthy, inFlight, quarantined, budget                        *prometheus.Desc
	slots, free, poisoned, minSlots, sinceProgress, deadline, bad *prometheus.Desc
	wedged, blocksPoisoned, poisonedBlocks, poisonedBudget        *prometheus.Desc
	remembered                                                    *prometheus.Desc
	genHeld, genWords, genDeclines                                *prometheus.Desc
	stale, refused                                                *prometheus.Desc
}

func newHealthCollector(src HealthSource, cl prometheus.Labels) *healthCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, cl) }
	return &healthCollector{
		src:            src,
		healthy:        d("kvxfer_healthy", "1 when Engine.Health says healthy, 0 when not (see /healthz for the reason)."),
		inFlight:       d("kvxfer_transfers_in_flight", "Transfers advertised or in flight."),
		quarantined:    d("kvxfer_quarantined_transfers", "Transfers quarantined now: failed for the caller, memory still pinned."),
		budget:         d("kvxfer_quarantine_budget_transfers", "Quarantined transfers the engine tolerates before it reports unhealthy."),
		slots:          d("kvxfer_staging_slots", "Staging slots, poisoned included."),
		free:           d("kvxfer_staging_slots_free", "Staging slots free now."),
		poisoned:       d("kvxfer_staging_slots_poisoned", "Staging slots taken out of circulation for good because quiescence could not be proven."),
		minSlots:       d("kvxfer_staging_slots_min", "Usable staging slots needed to serve MaxConcurrent transfers; fewer is unhealthy."),
		sinceProgress:  d("kvxfer_since_last_progress_seconds", "Seconds since a chunk last moved or a transfer ended."),
		deadline:       d("kvxfer_progress_deadline_seconds", "With transfers in flight, no progress for this long makes the engine unhealthy."),
		bad:            d("kvxfer_malformed_control_messages_total", "Control messages from peers that did not decode."),
		blocksPoisoned: d("kvxfer_blocks_poisoned_transfers", "Quarantined transfers the engine gave up on: their caller's KV blocks are poisoned for good (unknown quiescence) and never to be reused; not counted against the quarantine budget."),
		poisonedBlocks: d("kvxfer_blocks_poisoned", "The callers' KV blocks poisoned for good, each counted once: never to be used again; the engine refuses transfers over them."),
		poisonedBudget: d("kvxfer_poisoned_block_budget", "Poisoned blocks the engine tolerates before it reports unhealthy (Config.Tuning.PoisonedBlockBudget); past it only a restart helps."),
		remembered:     d("kvxfer_transfers_remembered_unquiesced", "Handles their callers released while not quiescent: the engine keeps them, their ids and their blocks, until they are (for ever when poisoned)."),
		genHeld:        d("kvxfer_generation_words_held", "Generation words held by rma and pull exposures (validated reads); when every word is held, offers are declined and the engine is unhealthy."),
		genWords:       d("kvxfer_generation_words", "The transport's generation words in all (0: it does not count them)."),
		genDeclines:    d("kvxfer_offers_declined_no_generation_word_total", "RMA and pull offers declined because every generation word was held: those transfers fell back to messages."),
		stale:          d("kvxfer_stale_messages_total", "Messages of an older transfer with the same request id (another nonce: a replay, or a late one), dropped."),
		refused:        d("kvxfer_protocol_refusals_total", "Transfers failed because what their peer sent broke the protocol: an offer, remote key or range refused before anything was read (docs/security.md)."),
		wedged:         d("kvxfer_transport_wedged", "1 when the transport reports that nothing will reach this engine any more (UCX's receive probe: a wedged shared-memory queue); only a restart helps."),
	}
}

// Describe implements prometheus.Collector.
func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.healthy, c.inFlight, c.quarantined, c.budget, c.slots, c.free,
		c.poisoned, c.minSlots, c.sinceProgress, c.deadline, c.bad, c.wedged, c.blocksPoisoned, c.poisonedBlocks, c.poisonedBudget,
		c.remembered, c.genHeld, c.genWords, c.genDeclines, c.stale, c.refused} {
		ch <- d
	}
}

// Collect implements prometheus.Collector with one Health call, so the gauges of one scrape
// agree with each other.
func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	h := c.src.Health()
	healthy := 0.0
	if h.Healthy {
		healthy = 1
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	gauge(c.healthy, healthy)
	gauge(c.inFlight, float64(h.Numbers.InFlight))
	gauge(c.quarantined, float64(h.Numbers.Quarantined))
	gauge(c.blocksPoisoned, float64(h.Numbers.BlocksPoisoned))
	gauge(c.poisonedBlocks, float64(h.Numbers.PoisonedBlocks))
	gauge(c.poisonedBudget, float64(h.Numbers.PoisonedBudget))
	gauge(c.remembered, float64(h.Numbers.Remembered))
	gauge(c.budget, float64(h.Numbers.QuarantineBudget))
	gauge(c.slots, float64(h.Numbers.TotalSlots))
	gauge(c.free, float64(h.Numbers.FreeSlots))
	gauge(c.poisoned, float64(h.Numbers.PoisonedSlots))
	gauge(c.minSlots, float64(h.Numbers.MinSlots))
	gauge(c.sinceProgress, h.Numbers.SinceProgress.Seconds())
	gauge(c.deadline, h.Numbers.ProgressDeadline.Seconds())
	ch <- prometheus.MustNewConstMetric(c.bad, prometheus.CounterValue, float64(h.Numbers.MalformedControl))
	gauge(c.genHeld, float64(h.Numbers.GenerationWordsHeld))
	gauge(c.genWords, float64(h.Numbers.GenerationWords))
	ch <- prometheus.MustNewConstMetric(c.genDeclines, prometheus.CounterValue, float64(h.Numbers.GenerationDeclines))
	ch <- prometheus.MustNewConstMetric(c.stale, prometheus.CounterValue, float64(h.Numbers.StaleMessages))
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(h.Numbers.ProtocolRefusals))
	wedged := 0.0
	if h.Numbers.TransportWedged {
		wedged = 1
	}
	gauge(c.wedged, wedged)
}

// NamedHealth is one engine of a process, named for the reasons CombineHealth reports.
type NamedHealth struct {
	// Name prefixes the engine's reasons ("prefill", "decode-3").
	Name string
	// Source is the engine.
	Source HealthSource
}

// CombineHealth returns one verdict over several engines of a process (a worker with a
// prefill and a decode engine, say): healthy only when every engine is; each unhealthy
// engine's reason is prefixed with its name, and the reasons are joined with "; " in the order
// given. The snapshot adds up the counts, and takes the longest time since progress and the
// shortest progress deadline, so it errs towards reporting a stall. With no engines it is
// unhealthy: a probe with nothing behind it must not pass.
func CombineHealth(engines ...NamedHealth) HealthSource {
	engines = append([]NamedHealth(nil), engines...)
	return healthFunc(func() transfer.Health {
		if len(engines) == 0 {
			return transfer.Health{Reason: "no engines to report on"}
		}
		var out transfer.Health
		out.Healthy = true
		var why []string
		for i, e := range engines {
			h := e.Source.Health()
			if !h.Healthy {
				out.Healthy = false
				reason := h.Reason
				if reason == "" {
					reason = "unhealthy (no reason given)"
				}
				why = append(why, e.Name+": "+reason)
			}
			s, o := h.Numbers, &out.Numbers
			o.InFlight += s.InFlight
			o.Quarantined += s.Quarantined
			o.BlocksPoisoned += s.BlocksPoisoned
			o.PoisonedBlocks += s.PoisonedBlocks
			o.PoisonedBudget += s.PoisonedBudget
			o.Remembered += s.Remembered
			o.QuarantineBudget += s.QuarantineBudget
			o.TotalSlots += s.TotalSlots
			o.FreeSlots += s.FreeSlots
			o.PoisonedSlots += s.PoisonedSlots
			o.MinSlots += s.MinSlots
			o.MalformedControl += s.MalformedControl
			o.StaleMessages += s.StaleMessages
			o.ProtocolRefusals += s.ProtocolRefusals
			o.GenerationWordsHeld += s.GenerationWordsHeld
			o.GenerationWords += s.GenerationWords
			o.GenerationDeclines += s.GenerationDeclines
			o.TransportWedged = o.TransportWedged || s.TransportWedged
			o.Closed = o.Closed || s.Closed
			o.MoverWedged = o.MoverWedged || s.MoverWedged
			o.SinceProgress = max(o.SinceProgress, s.SinceProgress)
			if i == 0 || s.ProgressDeadline < o.ProgressDeadline {
				o.ProgressDeadline = s.ProgressDeadline
			}
		}
		out.Reason = strings.Join(why, "; ")
		return out
	})
}
