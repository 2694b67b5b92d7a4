// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Paths the handler serves.
const (
	HealthzPath = "/healthz"
	MetricsPath = "/metrics"
)

// HandlerConfig configures Handler.
type HandlerConfig struct {
	// Health is the engine (or several, through HealthFunc). Required.
	Health HealthSource
	// Gatherer serves /metrics: the registry the Metrics were registered on. If nil,
	// /metrics answers 404, for a process that exposes metrics elsewhere.
	Gatherer prometheus.Gatherer
	// Logger hears about unhealthy answers (at debug: probes repeat them every few
	// seconds) and metric gathering errors. Default zap.NewNop().
	Logger *zap.Logger
}

// Handler returns an http.Handler serving:
//
//	GET /healthz  200 "ok\n" when cfg.Health says healthy; 503 with Health's reason when not
//	GET /metrics  the Prometheus exposition of cfg.Gatherer
//
// Use /healthz for both readiness and liveness: it answers 503 while the engine is wedged
// (transfers in flight, none progressing for the progress deadline), over its quarantine
// budget, short of usable staging slots, or closed, and 200 again as soon as that ends.
// Health never blocks, so neither does the probe. Mount the handler at the root of its own
// listener, or under a prefix with http.StripPrefix.
//
// It fails only when cfg.Health is nil.
func Handler(cfg HandlerConfig) (http.Handler, error) {
	if cfg.Health == nil {
		return nil, &ConfigError{Field: "HandlerConfig.Health", Reason: "required: pass the engine, or a HealthFunc"}
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	mux := http.NewServeMux()
	mux.HandleFunc(HealthzPath, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := cfg.Health.Health()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if h.Healthy {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		reason := h.Reason
		if reason == "" {
			reason = "unhealthy (no reason given)"
		}
		log.Debug("health probe answered unhealthy", zap.String("reason", reason), zap.String("remote", r.RemoteAddr))
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(reason + "\n"))
	})
	if cfg.Gatherer != nil {
		mux.Handle(MetricsPath, promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
			ErrorLog:      zapErrorLog{log},
			ErrorHandling: promhttp.ContinueOnError,
		}))
	}
	return mux, nil
}

// zapErrorLog adapts a zap logger to promhttp's error logger.
type zapErrorLog struct{ log *zap.Logger }

// Println implements promhttp.Logger.
func (l zapErrorLog) Println(v ...any) { l.log.Sugar().Warnln(v...) }
