// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/health"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// /livez and /readyz split /healthz's verdict: a stalled engine (a frozen peer) is not ready
// but still live, so Kubernetes stops sending it work without restarting it; a wedged
// transport or a closed engine is neither.
func TestHandler_LivenessAndReadiness(t *testing.T) {
	stalled := transfer.Health{Reason: "no transfer progressed for 3s (deadline 1s) while 2 are in flight",
		Numbers: health.Numbers{InFlight: 2, SinceProgress: 3 * time.Second, ProgressDeadline: time.Second}}
	wedged := transfer.Health{Reason: "kvxfer: transport wedged", Numbers: health.Numbers{TransportWedged: true}}
	closed := transfer.Health{Reason: "engine closed", Numbers: health.Numbers{Closed: true}}
	cases := []struct {
		desc                   string
		health                 transfer.Health
		healthz, readyz, livez int
		liveBody               string
	}{
		{"healthy: all 200", transfer.Health{Healthy: true}, 200, 200, 200, "ok"},
		{"stalled: not ready, live", stalled, 503, 503, 200, "ok"},
		{"over the quarantine budget: not ready, live", transfer.Health{Reason: "5 transfers quarantined"}, 503, 503, 200, "ok"},
		{"transport wedged: neither", wedged, 503, 503, 503, "transport wedged"},
		{"engine closed: neither", closed, 503, 503, 503, "engine closed"},
		{"mover wedged: neither", transfer.Health{Reason: "mover wedged: kernel overran", Numbers: health.Numbers{MoverWedged: true}}, 503, 503, 503, "mover wedged"},
	}
	var health atomic.Pointer[transfer.Health]
	src := observe.HealthFunc(func() transfer.Health { return *health.Load() })
	h, err := observe.Handler(observe.HandlerConfig{Health: src})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			health.Store(&c.health)
			code, _ := get(t, srv, http.MethodGet, observe.HealthzPath)
			require.Equal(t, c.healthz, code, "/healthz")
			code, _ = get(t, srv, http.MethodGet, observe.ReadyzPath)
			require.Equal(t, c.readyz, code, "/readyz")
			code, body := get(t, srv, http.MethodGet, observe.LivezPath)
			require.Equal(t, c.livez, code, "/livez")
			require.Contains(t, body, c.liveBody)
			code, _ = get(t, srv, http.MethodPost, observe.LivezPath)
			require.Equal(t, http.StatusMethodNotAllowed, code)
		})
	}
}

// An engine whose Health call does not return (a loop stuck on a lock) fails /livez within
// its liveness timeout, and the probes that follow do not pile up goroutines behind it: they
// answer at once while the stuck call is outstanding.
func TestHandler_LivezWhenHealthHangs(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	src := observe.HealthFunc(func() transfer.Health {
		calls.Add(1)
		<-release
		return transfer.Health{Healthy: true}
	})
	h, err := observe.Handler(observe.WithLivenessTimeout(observe.HandlerConfig{Health: src}, 50*time.Millisecond))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	for range 3 {
		code, body := get(t, srv, http.MethodGet, observe.LivezPath)
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, body, "did not answer")
	}
	require.Equal(t, int32(1), calls.Load(), "one stuck Health call at a time")
	close(release)
	require.Eventually(t, func() bool {
		code, _ := get(t, srv, http.MethodGet, observe.LivezPath)
		return code == http.StatusOK
	}, waitBound, 10*time.Millisecond)
}

// A process that has no engine yet (it waits for its peer) answers its probes from the
// start: live, not ready.
func TestPending_AnswersBeforeTheEngine(t *testing.T) {
	p := observe.NewPending("waiting for a peer")
	h := p.Health()
	require.False(t, h.Healthy)
	require.Contains(t, h.Reason, "waiting for a peer")
	require.True(t, observe.Live(h))
	p.Set(observe.HealthFunc(func() transfer.Health { return transfer.Health{Healthy: true} }))
	require.True(t, p.Health().Healthy)
}

func TestCombineHealth_Closed(t *testing.T) {
	ok := observe.HealthFunc(func() transfer.Health { return transfer.Health{Healthy: true} })
	closed := observe.HealthFunc(func() transfer.Health {
		return transfer.Health{Reason: "engine closed", Numbers: health.Numbers{Closed: true}}
	})
	h := observe.CombineHealth(observe.NamedHealth{Name: "a", Source: ok}, observe.NamedHealth{Name: "b", Source: closed}).Health()
	require.True(t, h.Numbers.Closed)
	require.False(t, observe.Live(h))
}

// A real engine is live until it is closed, idle or not.
func TestLive_RealEngine(t *testing.T) {
	e, err := transfer.New(mem.NewNetwork().Transport("a"), transfer.Config{})
	require.NoError(t, err)
	require.True(t, observe.Live(e.Health()))
	require.NoError(t, e.Close())
	h := e.Health()
	require.True(t, h.Numbers.Closed)
	require.False(t, observe.Live(h))
}
