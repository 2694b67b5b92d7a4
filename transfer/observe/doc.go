// SPDX-License-Identifier: Apache-2.0

// Package observe fits a kvxfer engine into a serving process the way operators expect:
// Prometheus metrics, a health and metrics HTTP handler for readiness and liveness probes, and
// structured logs of every lifecycle event.
//
// Everything here hangs off two seams of package transfer: the transfer.Observer the engine
// calls on every transition, cancel, quarantine, poison and chunk (plus the optional
// methods its documentation lists: OnStart, OnPeerLost, ...), and Engine.Health, which never blocks.
// Nothing is global: metrics are registered on the prometheus.Registerer the caller passes,
// and logs go to the *zap.Logger the caller passes.
//
// A process starts with four names: NewMetrics, NewLogObserver, Multi (the engine's
// Config.Observer) and Serve (a HandlerConfig: the probes, /metrics, and the embedded registry
// if it hosts one). Pending, CombineHealth (several engines, one verdict) and Handler (on a mux of your own)
// serve the less common shapes.
//
// Wiring, in order (the engine takes its observer at construction, the health collector
// needs the engine):
//
//	reg := prometheus.NewRegistry()
//	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg})
//	obs := observe.Multi(m, observe.NewLogObserver(logger))
//	eng, err := transfer.New(tr, transfer.Config{Observer: obs, Logger: logger})
//	err = m.CollectHealth(eng)
//	srv, err := observe.Serve(addr, observe.HandlerConfig{Health: eng, Gatherer: reg})
//	// serves /livez, /readyz, /healthz and /metrics; with Registry: discovery.Handler(),
//	// the embedded registry on the same listener too (or mount observe.Handler on a mux)
//
// The handler answers /readyz (and /healthz, its older name) with 503 and Health's reason
// whenever the engine says it is unhealthy, which includes a wedged engine (transfers in
// flight, none progressing for the progress deadline): a probe never reports a worker ready
// while no transfer can move. /livez fails only where a restart helps (a wedged transport, a
// closed engine, an engine that does not answer): see Handler for which Kubernetes probe uses
// which. A process whose engine comes later answers its probes from the start through Pending.
//
// The engine calls observers from a goroutine of its own, one event at a time, never under a
// lock a transfer needs (transfer.Observer). A slow observer still delays the events queued
// behind it, a handle's Done and Quiesced among them, so everything in this package takes one
// short mutex or atomic update per event and never calls back into the engine.
package observe
