// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Label values of the direction label. A transfer whose start the engine did not report (an
// OnStart this observer never heard) is labelled "unknown".
const (
	directionSend    = "send"
	directionReceive = "receive"
	directionUnknown = "unknown"
)

// helloRefusalReasons are the reasons an engine gives OnHelloRefused (transfer.Observer lists
// them), each with its series from the start; a reason a later engine adds is counted too,
// from its first refusal.
var helloRefusalReasons = []string{"unsolicited", "mismatch", "replayed"}

// direction is the label value of a request the engine reported started.
func direction(info transfer.StartInfo) string {
	if info.Receive {
		return directionReceive
	}
	return directionSend
}

// durationBuckets are the transfer duration histogram's buckets: 0.5 ms doubling to
// about 33 s, so both a single-block handover on shared memory and a long prompt near the
// default 30 s deadline land in a bucket of their own.
var durationBuckets = prometheus.ExponentialBuckets(0.0005, 2, 17)

// defaultMaxTracked bounds the requests Metrics remembers: well above the 10,000 concurrent
// transfers the engine is built for.
const defaultMaxTracked = 1 << 17

// MetricsConfig configures NewMetrics. Zero values take the documented defaults.
type MetricsConfig struct {
	// Registerer receives every collector. Required: there is no global default, so two
	// engines (or two tests) never fight over one registry.
	Registerer prometheus.Registerer
	// ConstLabels are added to every series, to tell several engines in one process apart
	// (for example {"engine": "prefill"}). Two Metrics may share a Registerer only if their
	// ConstLabels differ. Default none.
	ConstLabels prometheus.Labels

	// maxTracked bounds how many live requests the observer remembers (to know a request's
	// direction and start time); past it, new requests are labelled "unknown" and not
	// timed, so a leak elsewhere cannot grow memory here without bound. Zero takes
	// defaultMaxTracked (tests set another).
	maxTracked int
}

// Metrics is a transfer.Observer, with its optional methods, that
// keeps Prometheus series of an engine's transfers. CollectHealth adds the gauges read from
// Engine.Health at scrape time. Safe for concurrent use.
//
// The series, all prefixed kvxfer_:
//
//	transfer_duration_seconds{direction,outcome}  histogram, acceptance to outcome
//	transferred_bytes_total{direction}            counter, stream bytes moved
//	cancels_total{outcome}                        counter, Engine.Cancel by outcome
//	quarantines_total                             counter, sub-transfers quarantined
//	peer_connects_total, peer_failures_total      counters, from the transport
//	hello_refused_total{reason}                   counter, peers' hello proofs refused
//	auth_refused_total{what,reason}               counter, unauthenticated handshake messages
//
// outcome is completed, failed, cancelled, or quarantined (failed for the caller while its
// memory was still pinned). A transfer's duration runs from the engine accepting the
// request (Send or Receive) to its outcome being decided (Handle.Done closing).
type Metrics struct {
	duration     *prometheus.HistogramVec
	bytes        *prometheus.CounterVec
	cancels      *prometheus.CounterVec
	quarantines  prometheus.Counter
	peerConnects prometheus.Counter
	peerFailures prometheus.Counter
	helloRefused *prometheus.CounterVec
	authRefused  *prometheus.CounterVec

	reg         prometheus.Registerer
	constLabels prometheus.Labels
	maxTracked  int

	mu   sync.Mutex
	live map[transfer.RequestID]tracked
}

// tracked is what Metrics remembers about a live request.
type tracked struct {
	direction string
	bytes     prometheus.Counter // the direction's, looked up once rather than per chunk
	start     time.Time
}

var (
	_ transfer.Observer = (*Metrics)(nil)
	_ startObserver     = (*Metrics)(nil)
	_ peerObserver      = (*Metrics)(nil)
	_ trustObserver     = (*Metrics)(nil)
)

// NewMetrics validates cfg, creates the series and registers them on cfg.Registerer.
func NewMetrics(cfg MetricsConfig) (*Metrics, error) {
	if cfg.Registerer == nil {
		return nil, &transfer.ConfigError{Field: "MetricsConfig.Registerer", Reason: "required: pass prometheus.NewRegistry() or your process's registry"}
	}
	if cfg.maxTracked == 0 {
		cfg.maxTracked = defaultMaxTracked
	}
	cl := cfg.ConstLabels
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvxfer_transfer_duration_seconds", ConstLabels: cl, Buckets: durationBuckets,
			Help: "Time from the engine accepting a transfer to its outcome being decided, by direction and outcome (completed, failed, cancelled, quarantined).",
		}, []string{"direction", "outcome"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvxfer_transferred_bytes_total", ConstLabels: cl,
			Help: "KV stream bytes moved (sent and confirmed, or received and scattered), by direction.",
		}, []string{"direction"}),
		cancels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvxfer_cancels_total", ConstLabels: cl,
			Help: "Engine.Cancel calls by outcome; only not-found, already-complete and cancelled-before-advertise let the caller free KV blocks at once.",
		}, []string{"outcome"}),
		quarantines: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvxfer_quarantines_total", ConstLabels: cl,
			Help: "Sub-transfers that entered quarantine: failed or cancelled while the transport could still touch their memory.",
		}),
		peerConnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvxfer_peer_connects_total", ConstLabels: cl,
			Help: "Connections the transport established to peers, reconnects included.",
		}),
		peerFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvxfer_peer_failures_total", ConstLabels: cl,
			Help: "Peers the transport reported lost, each loss once: a peer counts again only after it was heard from.",
		}),
		helloRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvxfer_hello_refused_total", ConstLabels: cl,
			Help: "Hello proofs from peers that the engine refused, by reason (unsolicited, mismatch, replayed): a peer claimed what it could not prove, or a proof was replayed.",
		}, []string{"reason"}),
		authRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvxfer_auth_refused_total", ConstLabels: cl,
			Help: "Hellos, hello challenges and proofs, ContextParams and claims refused unauthenticated (Config.ClusterKeys; a claim of a request secret), by message and reason (unsealed, unknown-key, bad-mac, claimed: a proven claim of an exposure claimed before).",
		}, []string{"what", "reason"}),
		reg: cfg.Registerer, constLabels: cl, maxTracked: cfg.maxTracked,
		live: make(map[transfer.RequestID]tracked),
	}
	// Create every labelled series up front, so dashboards and rate() see zeros rather
	// than missing series before the first event of each kind.
	for _, d := range []string{directionSend, directionReceive} {
		m.bytes.WithLabelValues(d)
		for _, o := range []transfer.State{transfer.Completed, transfer.Failed, transfer.Cancelled, transfer.Quarantined} {
			m.duration.WithLabelValues(d, o.String())
		}
	}
	for o := range transfer.CancelOutcomeCount {
		m.cancels.WithLabelValues(o.String())
	}
	for _, r := range helloRefusalReasons {
		m.helloRefused.WithLabelValues(r)
	}
	for _, what := range transport.AuthMessages {
		for r := range transport.AuthRefusalCount {
			m.authRefused.WithLabelValues(what, r.String())
		}
	}
	for _, c := range []struct {
		name string
		c    prometheus.Collector
	}{
		{"kvxfer_transfer_duration_seconds", m.duration}, {"kvxfer_transferred_bytes_total", m.bytes},
		{"kvxfer_cancels_total", m.cancels}, {"kvxfer_quarantines_total", m.quarantines},
		{"kvxfer_peer_connects_total", m.peerConnects}, {"kvxfer_peer_failures_total", m.peerFailures},
		{"kvxfer_hello_refused_total", m.helloRefused}, {"kvxfer_auth_refused_total", m.authRefused},
	} {
		if err := cfg.Registerer.Register(c.c); err != nil {
			return nil, &transfer.ConfigError{Field: "MetricsConfig.Registerer", Reason: "registering " + c.name + " (two engines on one registry need different ConstLabels)", Cause: err}
		}
	}
	return m, nil
}

// OnStart implements transfer.Observer's optional method: it remembers the request's
// direction and the moment it was accepted.
func (m *Metrics) OnStart(info transfer.StartInfo) {
	dir := direction(info)
	m.mu.Lock()
	if len(m.live) < m.maxTracked {
		m.live[info.ID] = tracked{direction: dir, bytes: m.bytes.WithLabelValues(dir), start: time.Now()}
	}
	m.mu.Unlock()
}

// OnTransition implements transfer.Observer: when a request's outcome is decided it observes
// the duration and forgets the request. Sub-transfer transitions only feed the handle's.
func (m *Metrics) OnTransition(id transfer.RequestID, sub int, from, to transfer.State, _ transfer.Event) {
	if sub != -1 {
		return
	}
	decided := from != transfer.Quarantined && (to.Terminal() || to == transfer.Quarantined)
	if !decided {
		if from == transfer.Queued {
			m.trackLate(id)
		}
		return
	}
	m.mu.Lock()
	t, ok := m.live[id]
	delete(m.live, id)
	m.mu.Unlock()
	if !ok || t.start.IsZero() {
		// Never tracked (over maxTracked, or ended while queued without a reported start):
		// there is no honest duration to observe.
		return
	}
	m.duration.WithLabelValues(t.direction, to.String()).Observe(time.Since(t.start).Seconds())
}

// trackLate starts timing a request whose start the engine did not report, from its first
// transition: the best a transfer whose OnStart this observer missed allows.
func (m *Metrics) trackLate(id transfer.RequestID) {
	m.mu.Lock()
	if _, ok := m.live[id]; !ok && len(m.live) < m.maxTracked {
		m.live[id] = tracked{direction: directionUnknown, bytes: m.bytes.WithLabelValues(directionUnknown), start: time.Now()}
	}
	m.mu.Unlock()
}

// OnProgress implements transfer.Observer: it adds the chunk's bytes under the request's
// direction.
func (m *Metrics) OnProgress(id transfer.RequestID, bytes int64, _ time.Time) {
	m.mu.Lock()
	c := m.live[id].bytes
	m.mu.Unlock()
	if c == nil {
		c = m.bytes.WithLabelValues(directionUnknown)
	}
	c.Add(float64(bytes))
}

// OnCancel implements transfer.Observer.
func (m *Metrics) OnCancel(_ transfer.RequestID, outcome transfer.CancelOutcome) {
	m.cancels.WithLabelValues(outcome.String()).Inc()
}

// OnQuarantine implements transfer.Observer.
func (m *Metrics) OnQuarantine(transfer.RequestID, int, error) { m.quarantines.Inc() }

// OnPoison implements transfer.Observer. Poisoned slots are counted at scrape time from
// Engine.Health (kvxfer_staging_slots_poisoned), which is authoritative: a poisoned slot never
// comes back, so the gauge is also the running total.
func (m *Metrics) OnPoison(transfer.RequestID, int, string) {}

// OnPeerConnected implements transfer.Observer's optional method.
func (m *Metrics) OnPeerConnected(transfer.Peer) { m.peerConnects.Inc() }

// OnPeerLost implements transfer.Observer's optional method.
func (m *Metrics) OnPeerLost(transfer.Peer, error) { m.peerFailures.Inc() }

// OnAuthRefused implements transfer.Observer's optional method: it counts the refusal by message and reason.
func (m *Metrics) OnAuthRefused(err *transfer.AuthError) {
	m.authRefused.WithLabelValues(err.What, err.Reason.String()).Inc()
}

// OnHelloRefused implements transfer.Observer's optional method: it counts the refusal by reason.
func (m *Metrics) OnHelloRefused(_ transfer.Peer, reason string) {
	m.helloRefused.WithLabelValues(reason).Inc()
}

// SentBytes returns the counter of stream bytes this engine sent (for tests and examples;
// Prometheus reads it through the registry).
func (m *Metrics) SentBytes() prometheus.Counter { return m.bytes.WithLabelValues(directionSend) }

// ReceivedBytes returns the counter of stream bytes this engine received.
func (m *Metrics) ReceivedBytes() prometheus.Counter {
	return m.bytes.WithLabelValues(directionReceive)
}

// trackedCount returns how many live requests the observer remembers; it falls back to zero
// when the engine is idle, which tests use to check that nothing leaks (export_test.go).
func (m *Metrics) trackedCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}
