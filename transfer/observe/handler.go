// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"net/http"
	"time"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Paths the handler serves (Handler lists what each answers).
const (
	healthzPath = "/healthz"
	livezPath   = "/livez"
	readyzPath  = "/readyz"
	metricsPath = "/metrics"
)

// HandlerConfig configures Handler.
type HandlerConfig struct {
	// Health is the engine (or several, through CombineHealth). Required.
	Health HealthSource
	// Gatherer serves /metrics: the registry the Metrics were registered on. If nil,
	// /metrics answers 404, for a process that exposes metrics elsewhere.
	Gatherer prometheus.Gatherer
	// Logger hears about unhealthy answers (at debug: probes repeat them every few
	// seconds) and metric gathering errors. Default zap.NewNop().
	Logger *zap.Logger
	// Registry, if set, is served on the same mux at every path the probes and /metrics do
	// not take: pass discovery.Handler() (which answers under discovery.WorkersPath and 404s
	// the rest) and one listener serves the probes, the metrics and the embedded registry.
	Registry http.Handler

	// livenessTimeout bounds /livez's wait for the engine's Health call: an engine that does
	// not answer within it is reported dead. Zero takes defaultLivenessTimeout (tests set it).
	livenessTimeout time.Duration
}

// Handler returns an http.Handler serving:
//
//	GET /livez    200 "ok\n" while the engine answers its Health call within 500 ms
//	              and is live (not closed, its transport not wedged); 503 with the reason when not
//	GET /readyz   200 "ok\n" when cfg.Health says healthy (transfers progressing, quarantine
//	              within budget, staging slots enough); 503 with Health's reason when not
//	GET /healthz  the same answer as /readyz, kept for probes configured before the split
//	GET /metrics  the Prometheus exposition of cfg.Gatherer
//	anything else cfg.Registry (the embedded registry, discovery.Handler()), or 404
//
// Point Kubernetes' livenessProbe at /livez and its readinessProbe at /readyz. A stall, such
// as transfers to a frozen peer that make no progress, turns /readyz to 503 so the pod gets
// no new work, but leaves /livez at 200: restarting a healthy prefill pod because its decode
// peer froze would not help. /livez fails only where a restart does help: a wedged transport,
// a closed engine, or an engine that does not answer. Both flip back as soon as the cause
// ends. Health never blocks, so neither do /readyz and /healthz. Mount the handler at the
// root of its own listener, or under a prefix with http.StripPrefix.
//
// It fails only when cfg.Health is nil.
func Handler(cfg HandlerConfig) (http.Handler, error) {
	if cfg.Health == nil {
		return nil, &transfer.ConfigError{Field: "HandlerConfig.Health", Reason: "required: pass the engine, or CombineHealth of several"}
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	live := &liveness{src: cfg.Health, timeout: cfg.livenessTimeout}
	if live.timeout == 0 {
		live.timeout = defaultLivenessTimeout
	}
	ready := func(path string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !probeMethods(w, r) {
				return
			}
			h := cfg.Health.Health()
			writeProbe(w, r, h.Healthy, h.Reason, log, path)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc(healthzPath, ready(healthzPath))
	mux.HandleFunc(readyzPath, ready(readyzPath))
	mux.HandleFunc(livezPath, func(w http.ResponseWriter, r *http.Request) {
		if probeMethods(w, r) {
			live.serveLivez(w, r, log)
		}
	})
	if cfg.Gatherer != nil {
		mux.Handle(metricsPath, promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
			ErrorLog:      zapErrorLog{log},
			ErrorHandling: promhttp.ContinueOnError,
		}))
	}
	if cfg.Registry != nil {
		mux.Handle("/", cfg.Registry)
	}
	return mux, nil
}

// zapErrorLog adapts a zap logger to promhttp's error logger.
type zapErrorLog struct{ log *zap.Logger }

// Println implements promhttp.Logger.
func (l zapErrorLog) Println(v ...any) { l.log.Sugar().Warnln(v...) }
