// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/health"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// get fetches path from srv and returns the status and body.
func get(t *testing.T, srv *httptest.Server, method, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, nil)
	require.NoError(t, err)
	client := &http.Client{Timeout: waitBound}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestHandler_RequiresHealth(t *testing.T) {
	h, err := observe.Handler(observe.HandlerConfig{})
	require.Nil(t, h)
	require.ErrorIs(t, err, transfer.ErrInvalidConfig)
}

func TestHandler_States(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg})
	require.NoError(t, err)
	var health atomic.Pointer[transfer.Health] // written by the test, read by the server
	health.Store(&transfer.Health{Healthy: true})
	src := observe.HealthFunc(func() transfer.Health { return *health.Load() })
	require.NoError(t, m.CollectHealth(src))
	m.OnCancel(1, transfer.NotFound)

	cases := []struct {
		desc     string
		health   transfer.Health
		gatherer prometheus.Gatherer
		method   string
		path     string
		code     int
		body     string // substring
	}{
		{"healthy: 200 ok", transfer.Health{Healthy: true}, reg, http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
		{"unhealthy: 503 with the reason", transfer.Health{Reason: "no transfer progressed for 12s"}, reg, http.MethodGet, "/healthz", http.StatusServiceUnavailable, "no transfer progressed for 12s\n"},
		{"unhealthy without a reason still 503", transfer.Health{}, reg, http.MethodGet, "/healthz", http.StatusServiceUnavailable, "unhealthy"},
		{"HEAD probes work", transfer.Health{Healthy: true}, reg, http.MethodHead, "/healthz", http.StatusOK, ""},
		{"POST refused", transfer.Health{Healthy: true}, reg, http.MethodPost, "/healthz", http.StatusMethodNotAllowed, "not allowed"},
		{"metrics served from the gatherer", transfer.Health{Healthy: true}, reg, http.MethodGet, "/metrics", http.StatusOK, `kvxfer_cancels_total{outcome="not-found"} 1`},
		{"metrics show unhealthy as 0", transfer.Health{Reason: "x"}, reg, http.MethodGet, "/metrics", http.StatusOK, "kvxfer_healthy 0"},
		{"no gatherer: no metrics page", transfer.Health{Healthy: true}, nil, http.MethodGet, "/metrics", http.StatusNotFound, ""},
		{"other paths: 404", transfer.Health{Healthy: true}, reg, http.MethodGet, "/", http.StatusNotFound, ""},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			health.Store(&c.health)
			h, err := observe.Handler(observe.HandlerConfig{Health: src, Gatherer: c.gatherer})
			require.NoError(t, err)
			srv := httptest.NewServer(h)
			defer srv.Close()
			code, body := get(t, srv, c.method, c.path)
			require.Equal(t, c.code, code)
			require.Contains(t, body, c.body)
		})
	}
}

// TestL12_WedgedEngineAnswers503 freezes the wire under a transfer: the engine must turn
// unhealthy within its progress deadline and /healthz must answer 503 with the reason (the
// failure this project exists to end is a probe saying 200 while nothing can move). When the
// wire moves again the transfer completes and /healthz answers 200.
func TestL12_WedgedEngineAnswers503(t *testing.T) {
	const deadline = 500 * time.Millisecond
	cfg := smallConfig()
	cfg.ProgressDeadline = deadline
	cfg.TransferTimeout = time.Minute // the transfer must stay in flight, not be quarantined
	p := newPair(t, cfg, nil)
	p.net.SetFault(func(fp mem.FaultPoint) mem.Fault {
		return mem.Fault{Hang: fp.Kind == transport.KindData}
	})
	handler, err := observe.Handler(observe.HandlerConfig{Health: p.decode, Gatherer: p.reg})
	require.NoError(t, err)
	srv := httptest.NewServer(handler)
	defer srv.Close()

	began := time.Now()
	send, recv := p.start(t, 1, 0, 1, 2)
	eventually(t, waitBound, func() bool { return recv.Status().State == transfer.Advertised }, "receive posted")
	if code, body := get(t, srv, http.MethodGet, "/healthz"); time.Since(began) < deadline {
		require.Equal(t, http.StatusOK, code, "healthy before the deadline passes: %s", body)
	}

	var code int
	var body string
	eventually(t, deadline+waitBound, func() bool {
		code, body = get(t, srv, http.MethodGet, "/healthz")
		return code == http.StatusServiceUnavailable
	}, "a wedged engine answers 503")
	require.GreaterOrEqual(t, time.Since(began), deadline, "not before the progress deadline")
	require.Contains(t, body, "no transfer progressed")
	require.Contains(t, body, "in flight")
	// The sender's clock started when the receiver's request reached it, a little later.
	eventually(t, deadline+waitBound, func() bool { return !p.prefill.Health().Healthy }, "the sender is wedged too")
	_, metrics := get(t, srv, http.MethodGet, "/metrics")
	require.Contains(t, metrics, `kvxfer_healthy{engine="decode"} 0`)
	require.Contains(t, metrics, `kvxfer_transfers_in_flight{engine="decode"} 1`)

	p.net.SetFault(nil)
	p.net.Resume()
	require.Equal(t, transfer.Completed, waitQuiesced(t, recv).State)
	require.Equal(t, transfer.Completed, waitQuiesced(t, send).State)
	code, body = get(t, srv, http.MethodGet, "/healthz")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "ok\n", body)
	_, metrics = get(t, srv, http.MethodGet, "/metrics")
	require.Contains(t, metrics, `kvxfer_healthy{engine="decode"} 1`)
}

func TestCombineHealth(t *testing.T) {
	ok := observe.HealthFunc(func() transfer.Health {
		return transfer.Health{Healthy: true, Numbers: health.Numbers{InFlight: 1, TotalSlots: 4,
			SinceProgress: time.Second, ProgressDeadline: 10 * time.Second}}
	})
	stalled := observe.HealthFunc(func() transfer.Health {
		return transfer.Health{Reason: "no transfer progressed for 6s", Numbers: health.Numbers{InFlight: 2,
			TotalSlots: 8, SinceProgress: 6 * time.Second, ProgressDeadline: 5 * time.Second}}
	})
	silent := observe.HealthFunc(func() transfer.Health { return transfer.Health{} })
	cases := []struct {
		desc    string
		engines []observe.NamedHealth
		healthy bool
		reason  string
	}{
		{"all healthy", []observe.NamedHealth{{"prefill", ok}, {"decode", ok}}, true, ""},
		{"one stalled: named in the reason", []observe.NamedHealth{{"prefill", ok}, {"decode", stalled}}, false, "decode: no transfer progressed for 6s"},
		{"two unhealthy: both, in order", []observe.NamedHealth{{"a", stalled}, {"b", silent}}, false, "a: no transfer progressed for 6s; b: unhealthy (no reason given)"},
		{"none: unhealthy", nil, false, "no engines to report on"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			h := observe.CombineHealth(c.engines...).Health()
			require.Equal(t, c.healthy, h.Healthy)
			require.Equal(t, c.reason, h.Reason)
		})
	}
	h := observe.CombineHealth(observe.NamedHealth{"prefill", ok}, observe.NamedHealth{"decode", stalled}).Health()
	require.EqualValues(t, 3, h.Numbers.InFlight)
	require.Equal(t, 12, h.Numbers.TotalSlots)
	require.Equal(t, 6*time.Second, h.Numbers.SinceProgress, "the worst stall")
	require.Equal(t, 5*time.Second, h.Numbers.ProgressDeadline, "the strictest deadline")
	require.False(t, h.Numbers.TransportWedged)
	wedged := observe.HealthFunc(func() transfer.Health {
		return transfer.Health{Reason: "transport wedged", Numbers: health.Numbers{TransportWedged: true}}
	})
	h = observe.CombineHealth(observe.NamedHealth{"prefill", ok}, observe.NamedHealth{"decode", wedged}).Health()
	require.True(t, h.Numbers.TransportWedged, "one engine's wedged transport is the process's")
}
