// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/observe"
)

// observability is --http: the engine's metrics on a registry of its own, and /livez,
// /readyz, /healthz and /metrics served for it, as a serving process would expose them to its
// probes. The probes answer from the moment the endpoint listens, before the engine exists
// (live, not ready), through an observe.Pending the engine is set into.
type observability struct {
	addr     string
	role     string
	reg      *prometheus.Registry
	metrics  *observe.Metrics
	observer transfer.Observer
	pending  *observe.Pending
	srv      *observe.Server
	// process: the endpoint belongs to the whole process (serve's, opened at start), so the
	// engine's Close leaves it open; closeProcess closes it.
	process bool
}

// newObservability prepares --http for one engine; nil (and no error) when addr is empty.
func newObservability(addr, role string, rank int) (*observability, error) {
	if addr == "" {
		return nil, nil
	}
	reg := prometheus.NewRegistry()
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg,
		ConstLabels: prometheus.Labels{"role": role, "rank": strconv.Itoa(rank)}})
	if err != nil {
		return nil, fmt.Errorf("--http: %w", err)
	}
	return &observability{addr: addr, role: role, reg: reg, metrics: m, observer: m,
		pending: observe.NewPending("the " + role + " engine is not made yet")}, nil
}

// engineObservability is the --http of the engine cfg describes: the process's endpoint when
// serve opened one at start, otherwise a new one.
func engineObservability(cfg RunConfig, role string, rank int) (*observability, error) {
	if cfg.processHTTP != nil {
		return cfg.processHTTP, nil
	}
	return newObservability(cfg.HTTP, role, rank)
}

// listen opens the endpoint, answering for the pending engine until serve sets it.
func (o *observability) listen() error {
	if o == nil || o.srv != nil {
		return nil
	}
	srv, err := observe.Serve(o.addr, observe.HandlerConfig{Health: o.pending, Gatherer: o.reg})
	if err != nil {
		return fmt.Errorf("--http %s: %w", o.addr, err)
	}
	o.srv = srv
	fmt.Fprintf(os.Stderr, "kvxbench: %s engine: /livez, /readyz, /healthz and /metrics on http://%s\n", o.role, srv.Addr())
	return nil
}

// serve hands the probes to the engine once it exists (its health is read at scrape time),
// opening the endpoint if it is not open yet.
func (o *observability) serve(eng *transfer.Engine) error {
	if o == nil {
		return nil
	}
	if err := o.metrics.CollectHealth(eng); err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	if err := o.listen(); err != nil {
		return err
	}
	o.pending.Set(eng)
	return nil
}

// close stops the endpoint, waiting a bounded time for scrapes in progress; an endpoint of
// the whole process stays open (the closed engine's probes say so) until closeProcess.
func (o *observability) close() {
	if o == nil || o.process {
		return
	}
	o.shutdown()
}

// closeProcess closes the process's endpoint.
func (o *observability) closeProcess() {
	if o != nil {
		o.shutdown()
	}
}

func (o *observability) shutdown() {
	if o.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = o.srv.Close(ctx)
	o.srv = nil
}
