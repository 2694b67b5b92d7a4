// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/transferdefaults"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/health"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

func TestNewMetrics_RefusesBadConfig(t *testing.T) {
	shared := prometheus.NewRegistry()
	_, err := observe.NewMetrics(observe.MetricsConfig{Registerer: shared})
	require.NoError(t, err)
	cases := []struct {
		desc  string
		cfg   observe.MetricsConfig
		field string
	}{
		{"no registerer: there is no global default", observe.MetricsConfig{}, "MetricsConfig.Registerer"},
		{"second Metrics on one registry without distinct labels", observe.MetricsConfig{Registerer: shared}, "MetricsConfig.Registerer"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			m, err := observe.NewMetrics(c.cfg)
			require.Nil(t, m)
			require.ErrorIs(t, err, transfer.ErrInvalidConfig)
			var ce *transfer.ConfigError
			require.True(t, errors.As(err, &ce))
			require.Equal(t, c.field, ce.Field)
		})
	}
}

func TestMetrics_CollectHealthTwiceIsRefused(t *testing.T) {
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	src := observe.HealthFunc(func() transfer.Health { return transfer.Health{Healthy: true} })
	require.NoError(t, m.CollectHealth(src))
	require.ErrorIs(t, m.CollectHealth(src), transfer.ErrInvalidConfig)
	require.ErrorIs(t, m.CollectHealth(nil), transfer.ErrInvalidConfig)
}

// TestMetrics_ValuesAfterKnownTransfers moves three requests of known sizes between two real
// engines, cancels three ways, and checks every series against what happened.
func TestMetrics_ValuesAfterKnownTransfers(t *testing.T) {
	p := newPair(t, smallConfig(), nil)
	blockBytes := p.plan(t, 0).Bytes()
	requests := []struct {
		id     transfer.RequestID
		blocks []int32
	}{{1, []int32{0, 1}}, {2, []int32{2, 3, 4}}, {3, []int32{5}}}
	var want float64
	var handles []*transfer.Handle
	for _, r := range requests {
		s, rcv := p.start(t, r.id, r.blocks...)
		handles = append(handles, s, rcv)
		want += float64(int64(len(r.blocks)) * blockBytes)
	}
	for _, h := range handles {
		require.Equal(t, transfer.Completed, waitQuiesced(t, h).State, "request %d", h.ID())
	}
	// A send whose receiver never asks is still queued: cancelling it frees at once.
	queued, err := p.prefill.Send(t.Context(), transfer.Spec{ID: 4, Peer: "decode", Plan: p.plan(t, 6), Pool: p.srcPool})
	require.NoError(t, err)
	require.Equal(t, transfer.CancelledBeforeAdvertise, p.prefill.Cancel(4))
	require.Equal(t, transfer.Cancelled, waitQuiesced(t, queued).State)
	require.Equal(t, transfer.NotFound, p.prefill.Cancel(999))
	require.Equal(t, transfer.AlreadyComplete, p.prefill.Cancel(1))

	pre, dec := map[string]string{"engine": "prefill"}, map[string]string{"engine": "decode"}
	with := func(base map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range base {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	histCount := func(labels map[string]string) uint64 {
		return sample(t, p.reg, "kvxfer_transfer_duration_seconds", labels).GetHistogram().GetSampleCount()
	}
	require.Equal(t, want, value(t, p.reg, "kvxfer_transferred_bytes_total", with(pre, "direction", "send")))
	require.Equal(t, want, value(t, p.reg, "kvxfer_transferred_bytes_total", with(dec, "direction", "receive")))
	require.Zero(t, value(t, p.reg, "kvxfer_transferred_bytes_total", with(pre, "direction", "receive")))
	require.EqualValues(t, 3, histCount(with(pre, "direction", "send", "outcome", "completed")))
	require.EqualValues(t, 3, histCount(with(dec, "direction", "receive", "outcome", "completed")))
	require.EqualValues(t, 1, histCount(with(pre, "direction", "send", "outcome", "cancelled")))
	require.EqualValues(t, 0, histCount(with(dec, "direction", "receive", "outcome", "failed")))
	sum := sample(t, p.reg, "kvxfer_transfer_duration_seconds", with(dec, "direction", "receive", "outcome", "completed")).GetHistogram().GetSampleSum()
	require.Greater(t, sum, 0.0)
	require.Less(t, sum, 3*waitBound.Seconds())
	for outcome, n := range map[string]float64{"cancelled-before-advertise": 1, "not-found": 1, "already-complete": 1,
		"cancel-requested-in-flight": 0, "backend-unhealthy": 0, "not-cancellable": 0} {
		require.Equal(t, n, value(t, p.reg, "kvxfer_cancels_total", with(pre, "outcome", outcome)), outcome)
	}
	require.Zero(t, value(t, p.reg, "kvxfer_quarantines_total", pre))

	cfg := smallConfig()
	slots := float64(cfg.MaxConcurrent * cfg.Tuning.PipelineDepth)
	for _, labels := range []map[string]string{pre, dec} {
		eventually(t, waitBound, func() bool {
			return value(t, p.reg, "kvxfer_staging_slots_free", labels) == slots
		}, "every slot back in %v", labels)
		require.Equal(t, slots, value(t, p.reg, "kvxfer_staging_slots", labels))
		require.Equal(t, float64(cfg.MaxConcurrent), value(t, p.reg, "kvxfer_staging_slots_min", labels))
		require.Zero(t, value(t, p.reg, "kvxfer_staging_slots_poisoned", labels))
		require.Equal(t, 1.0, value(t, p.reg, "kvxfer_healthy", labels))
		require.Zero(t, value(t, p.reg, "kvxfer_transfers_in_flight", labels))
		require.Zero(t, value(t, p.reg, "kvxfer_quarantined_transfers", labels))
		require.Equal(t, float64(transferdefaults.QuarantineBudget), value(t, p.reg, "kvxfer_quarantine_budget_transfers", labels))
		require.Equal(t, transferdefaults.ProgressDeadline.Seconds(), value(t, p.reg, "kvxfer_progress_deadline_seconds", labels))
		require.Less(t, value(t, p.reg, "kvxfer_since_last_progress_seconds", labels), waitBound.Seconds())
	}
	require.Zero(t, p.pm.Tracked(), "every request forgotten once decided")
	require.Zero(t, p.dm.Tracked())
	problems, err := testutil.GatherAndLint(p.reg)
	require.NoError(t, err)
	require.Empty(t, problems, "every series follows Prometheus naming conventions")
}

// TestMetrics_ObserverEventsByHand drives a Metrics through the Observer calls an engine
// makes, including an engine that reports no starts and peers coming and going.
func TestMetrics_ObserverEventsByHand(t *testing.T) {
	cases := []struct {
		desc      string
		start     bool // report OnStart first
		maxTrack  int
		direction string
		timed     bool
	}{
		{"start reported: labelled and timed from acceptance", true, 0, "receive", true},
		{"no start reported: unknown direction, timed from the first transition", false, 0, "unknown", true},
		{"over the tracking bound: counted under unknown, not timed", true, 1, "unknown", false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m, err := observe.NewMetrics(observe.WithMaxTracked(observe.MetricsConfig{Registerer: reg}, c.maxTrack))
			require.NoError(t, err)
			if c.maxTrack == 1 {
				m.OnStart(transfer.StartInfo{ID: 99, Receive: false}) // fills the table
			}
			if c.start {
				m.OnStart(transfer.StartInfo{ID: 7, Receive: true, Peers: []transfer.Peer{"a"}, Bytes: 300})
			}
			m.OnTransition(7, -1, transfer.Queued, transfer.Advertised, anEvent)
			m.OnTransition(7, 0, transfer.Advertised, transfer.InFlight, anEvent) // sub: ignored
			m.OnProgress(7, 100, time.Now())
			m.OnProgress(7, 200, time.Now())
			m.OnQuarantine(7, 0, errors.New("deadline"))
			m.OnTransition(7, -1, transfer.InFlight, transfer.Quarantined, anEvent)
			// Leaving quarantine is not a second outcome.
			m.OnTransition(7, -1, transfer.Quarantined, transfer.Failed, anEvent)
			m.OnPeerConnected("a")
			m.OnPeerConnected("a")
			m.OnPeerLost("a", errors.New("gone"))

			require.Equal(t, 300.0, value(t, reg, "kvxfer_transferred_bytes_total", map[string]string{"direction": c.direction}))
			var count uint64
			if mf, ok := gathered(t, reg)["kvxfer_transfer_duration_seconds"]; ok {
				for _, s := range mf.GetMetric() {
					count += s.GetHistogram().GetSampleCount()
				}
			}
			if c.timed {
				require.EqualValues(t, 1, count)
				require.EqualValues(t, 1, sample(t, reg, "kvxfer_transfer_duration_seconds",
					map[string]string{"direction": c.direction, "outcome": "quarantined"}).GetHistogram().GetSampleCount())
			} else {
				require.EqualValues(t, 0, count)
			}
			require.Equal(t, 1.0, value(t, reg, "kvxfer_quarantines_total", nil))
			require.Equal(t, 2.0, value(t, reg, "kvxfer_peer_connects_total", nil))
			require.Equal(t, 1.0, value(t, reg, "kvxfer_peer_failures_total", nil))
			want := 0
			if c.maxTrack == 1 {
				want = 1 // request 99 never ended
			}
			require.Equal(t, want, m.Tracked())
		})
	}
}

func TestMetrics_HealthGaugesReadAtScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg})
	require.NoError(t, err)
	h := transfer.Health{Healthy: true}
	require.NoError(t, m.CollectHealth(observe.HealthFunc(func() transfer.Health { return h })))
	require.Equal(t, 1.0, value(t, reg, "kvxfer_healthy", nil))
	require.Equal(t, 0.0, value(t, reg, "kvxfer_transport_wedged", nil))
	h = transfer.Health{Reason: "wedged", Numbers: health.Numbers{InFlight: 3, Quarantined: 2, BlocksPoisoned: 1,
		PoisonedBlocks: 6, PoisonedBudget: 4, Remembered: 7,
		TotalSlots: 8, FreeSlots: 1, PoisonedSlots: 4, MinSlots: 4, SinceProgress: 1500 * time.Millisecond,
		ProgressDeadline: time.Second, MalformedControl: 5, TransportWedged: true,
		GenerationWordsHeld: 4096, GenerationWords: 4096, GenerationDeclines: 9, StaleMessages: 11, ProtocolRefusals: 12}}
	for name, want := range map[string]float64{"kvxfer_healthy": 0, "kvxfer_transfers_in_flight": 3,
		"kvxfer_quarantined_transfers": 2, "kvxfer_blocks_poisoned_transfers": 1, "kvxfer_staging_slots": 8, "kvxfer_staging_slots_free": 1,
		"kvxfer_staging_slots_poisoned": 4, "kvxfer_staging_slots_min": 4, "kvxfer_since_last_progress_seconds": 1.5,
		"kvxfer_progress_deadline_seconds": 1, "kvxfer_malformed_control_messages_total": 5, "kvxfer_transport_wedged": 1,
		"kvxfer_blocks_poisoned": 6, "kvxfer_poisoned_block_budget": 4, "kvxfer_transfers_remembered_unquiesced": 7,
		"kvxfer_generation_words_held": 4096, "kvxfer_generation_words": 4096, "kvxfer_offers_declined_no_generation_word_total": 9,
		"kvxfer_stale_messages_total": 11, "kvxfer_protocol_refusals_total": 12} {
		require.Equal(t, want, value(t, reg, name, nil), name)
	}
}

// TestMetrics_PeerFailuresFromTheEngine: a peer the transport loses reaches the Metrics through
// the engine's OnPeerLost call.
func TestMetrics_PeerFailuresFromTheEngine(t *testing.T) {
	p := newPair(t, smallConfig(), nil)
	require.Zero(t, value(t, p.reg, "kvxfer_peer_failures_total", map[string]string{"engine": "prefill"}))
	p.net.LosePeer("decode")
	for _, engine := range []string{"prefill", "decode"} {
		eventually(t, waitBound, func() bool {
			return value(t, p.reg, "kvxfer_peer_failures_total", map[string]string{"engine": engine}) == 1
		}, "%s hears one peer lost", engine)
	}
}

// lostPeers records, in order, the peers an engine reported lost to its observer.
type lostPeers struct {
	nopObserver
	mu    sync.Mutex
	peers []transfer.Peer
}

func (l *lostPeers) OnPeerConnected(transfer.Peer) {}

func (l *lostPeers) OnPeerLost(peer transfer.Peer, _ error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peers = append(l.peers, peer)
}

func (l *lostPeers) saw(peer transfer.Peer) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.peers, peer)
}

// TestMetrics_OneDeadPeerCountsOnce: a transport may report one lost peer several times (UCX
// does for its own endpoint and for each lane's, and again for an endpoint remade to send the
// dead peer a last message), and kvxfer_peer_failures_total counts it once, until the peer is
// heard from again. A report of another peer after them is the barrier: the observer hears
// reports in order.
func TestMetrics_OneDeadPeerCountsOnce(t *testing.T) {
	rec := &lostPeers{}
	p := newPair(t, smallConfig(), func(engine string) transfer.Observer {
		if engine == "prefill" {
			return rec
		}
		return nopObserver{}
	})
	prefill := p.net.Endpoint("prefill")
	lost := fmt.Errorf("%w: test: endpoint failed", transfer.ErrPeerLost)
	failures := func() float64 {
		return value(t, p.reg, "kvxfer_peer_failures_total", map[string]string{"engine": "prefill"})
	}
	for range 3 {
		p.net.ReportPeerLost(prefill, "decode", lost)
	}
	p.net.ReportPeerLost(prefill, "barrier-1", lost)
	eventually(t, waitBound, func() bool { return rec.saw("barrier-1") }, "the reports delivered")
	require.Equal(t, 2.0, failures(), "decode three times and barrier-1 once: two peers lost")

	// Decode is heard from again (a transfer runs), so its next loss is a new one.
	send, recv := p.start(t, 1, 1, 2)
	waitQuiesced(t, recv)
	waitQuiesced(t, send)
	p.net.ReportPeerLost(prefill, "decode", lost)
	p.net.ReportPeerLost(prefill, "barrier-2", lost)
	eventually(t, waitBound, func() bool { return rec.saw("barrier-2") }, "the reports delivered")
	require.Equal(t, 4.0, failures(), "decode lost again after it was heard from")
}

// TestMetrics_HelloRefusalsFromTheEngine: every refusal reason has its series from the start,
// and a hello proof the engine never asked for (forged "from" a peer) is counted under its
// reason through the engine's OnHelloRefused or OnAuthRefused call.
func TestMetrics_HelloRefusalsFromTheEngine(t *testing.T) {
	p := newPair(t, smallConfig(), nil)
	prefill := map[string]string{"engine": "prefill"}
	for _, r := range observe.HelloRefusalReasons {
		require.Zero(t, value(t, p.reg, "kvxfer_hello_refused_total", map[string]string{"engine": "prefill", "reason": r}), r)
	}
	forged := wire.Encode(&wire.HelloProof{Min: wire.MinVersion, Max: wire.Version, Features: wire.KnownFeatures})
	require.NoError(t, p.net.Spoof("decode", "prefill", forged))
	prefill["reason"] = "unsolicited"
	eventually(t, waitBound, func() bool {
		return value(t, p.reg, "kvxfer_hello_refused_total", prefill) == 1
	}, "the forged proof counted")
}

// TestMetrics_AuthRefusalsFromTheEngine: every message and reason has its series from the start,
// and a hello that no cluster key sealed, sent to an engine with keys, is counted under
// hello/unsealed through the engine's OnHelloRefused or OnAuthRefused call.
func TestMetrics_AuthRefusalsFromTheEngine(t *testing.T) {
	cfg := smallConfig()
	cfg.ClusterKeys = [][]byte{make([]byte, transfer.ClusterKeyBytes)}
	p := newPair(t, cfg, nil)
	for _, what := range transport.AuthMessages {
		for r := range transport.AuthRefusalCount {
			require.Zero(t, value(t, p.reg, "kvxfer_auth_refused_total", map[string]string{"engine": "prefill", "what": what, "reason": r.String()}))
		}
	}
	require.NoError(t, p.net.Spoof("decode", "prefill", wire.Encode(&wire.Hello{Min: wire.MinVersion, Max: wire.Version})))
	eventually(t, waitBound, func() bool {
		return value(t, p.reg, "kvxfer_auth_refused_total", map[string]string{"engine": "prefill", "what": "hello", "reason": "unsealed"}) == 1
	}, "the unsealed hello counted")
}

// Every cancel outcome, up to transfer.CancelOutcomeCount, has its series from the start,
// labelled with its name, and counts its own calls: an outcome added to the engine is not
// missing from the metrics.
func TestMetrics_EveryCancelOutcomeHasASeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg})
	require.NoError(t, err)
	require.Len(t, gathered(t, reg)["kvxfer_cancels_total"].GetMetric(), int(transfer.CancelOutcomeCount))
	for o := range transfer.CancelOutcomeCount {
		require.Zero(t, value(t, reg, "kvxfer_cancels_total", map[string]string{"outcome": o.String()}), "%v before any cancel", o)
		m.OnCancel(1, o)
		require.Equal(t, 1.0, value(t, reg, "kvxfer_cancels_total", map[string]string{"outcome": o.String()}), "%v counted", o)
	}
}

// TestMetrics_Exposition pins the names, help, types and labels operators write dashboards
// against, in the text format Prometheus scrapes.
func TestMetrics_Exposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg, ConstLabels: prometheus.Labels{"engine": "decode"}})
	require.NoError(t, err)
	m.OnCancel(1, transfer.CancelRequestedInFlight)
	m.OnCancel(2, transfer.CancelRequestedInFlight)
	m.OnCancel(3, transfer.NotCancellable)
	m.OnStart(transfer.StartInfo{ID: 4, Receive: false})
	m.OnProgress(4, 4096, time.Now())
	m.OnPeerLost("prefill-0", transfer.ErrPeerLost)
	want := `
# HELP kvxfer_cancels_total Engine.Cancel calls by outcome; only not-found, already-complete and cancelled-before-advertise let the caller free KV blocks at once.
# TYPE kvxfer_cancels_total counter
kvxfer_cancels_total{engine="decode",outcome="already-complete"} 0
kvxfer_cancels_total{engine="decode",outcome="backend-unhealthy"} 0
kvxfer_cancels_total{engine="decode",outcome="cancel-requested-in-flight"} 2
kvxfer_cancels_total{engine="decode",outcome="cancelled-before-advertise"} 0
kvxfer_cancels_total{engine="decode",outcome="not-cancellable"} 1
kvxfer_cancels_total{engine="decode",outcome="not-found"} 0
# HELP kvxfer_transferred_bytes_total KV stream bytes moved (sent and confirmed, or received and scattered), by direction.
# TYPE kvxfer_transferred_bytes_total counter
kvxfer_transferred_bytes_total{direction="receive",engine="decode"} 0
kvxfer_transferred_bytes_total{direction="send",engine="decode"} 4096
# HELP kvxfer_peer_failures_total Peers the transport reported lost, each loss once: a peer counts again only after it was heard from.
# TYPE kvxfer_peer_failures_total counter
kvxfer_peer_failures_total{engine="decode"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"kvxfer_cancels_total", "kvxfer_transferred_bytes_total", "kvxfer_peer_failures_total"))
}
