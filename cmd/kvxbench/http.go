// SPDX-License-Identifier: Apache-2.0

package main

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

// observability is --http: the engine's metrics on a registry of its own, and /healthz and
// /metrics served for it, as a serving process would expose them to its probes.
type observability struct {
	addr     string
	role     string
	reg      *prometheus.Registry
	metrics  *observe.Metrics
	observer transfer.Observer
	srv      *observe.Server
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
	return &observability{addr: addr, role: role, reg: reg, metrics: m, observer: m}, nil
}

// serve starts the HTTP endpoint once the engine exists (its health is read at scrape time).
func (o *observability) serve(eng *transfer.Engine) error {
	if o == nil {
		return nil
	}
	if err := o.metrics.CollectHealth(eng); err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	srv, err := observe.Serve(o.addr, observe.HandlerConfig{Health: eng, Gatherer: o.reg})
	if err != nil {
		return fmt.Errorf("--http %s: %w", o.addr, err)
	}
	o.srv = srv
	fmt.Fprintf(os.Stderr, "kvxbench: %s engine: /healthz and /metrics on http://%s\n", o.role, srv.Addr())
	return nil
}

// close stops the endpoint, waiting a bounded time for scrapes in progress.
func (o *observability) close() {
	if o == nil || o.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = o.srv.Close(ctx)
	o.srv = nil
}
