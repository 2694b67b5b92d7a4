// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// ExampleNewMetrics wires metrics into two engines (over the in-memory transport, so it runs
// anywhere), moves one request, and reads two of the series.
func ExampleNewMetrics() {
	reg := prometheus.NewRegistry()
	net := mem.NewNetwork()
	newEngine := func(name string) (*transfer.Engine, *observe.Metrics) {
		m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg, ConstLabels: prometheus.Labels{"engine": name}})
		if err != nil {
			panic(err)
		}
		e, err := transfer.New(net.Transport(transfer.Peer(name)), transfer.Config{Observer: m})
		if err != nil {
			panic(err)
		}
		if err := m.CollectHealth(e); err != nil { // needs the engine, so after New
			panic(err)
		}
		return e, m
	}
	prefill, _ := newEngine("prefill")
	defer prefill.Close()
	decode, dm := newEngine("decode")
	defer decode.Close()

	l := layout.Packed(layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 4}, layout.BlockMajor)
	plan, _ := layout.NewPlan(l, l.All(), []int32{1, 2})
	src, dst := make([]byte, l.SpanBytes()), make([]byte, l.SpanBytes())
	ctx := context.Background()
	recv, _ := decode.Receive(ctx, transfer.Spec{ID: 1, Peer: "prefill", Plan: plan, Pool: dst})
	send, _ := prefill.Send(ctx, transfer.Spec{ID: 1, Peer: "decode", Plan: plan, Pool: src})
	<-recv.Quiesced() // bounded: the transfer's deadline ends it either way
	<-send.Quiesced()

	fmt.Println("received bytes:", testutil.ToFloat64(dm.ReceivedBytes()))
	n, _ := testutil.GatherAndCount(reg, "kvxfer_transfer_duration_seconds")
	fmt.Println("duration series:", n)
	// Output:
	// received bytes: 32768
	// duration series: 16
}

// ExampleHandler serves /healthz and /metrics for an engine; a closed engine, like a wedged
// one, answers 503 with the reason.
func ExampleHandler() {
	reg := prometheus.NewRegistry()
	m, _ := observe.NewMetrics(observe.MetricsConfig{Registerer: reg})
	eng, _ := transfer.New(mem.NewNetwork().Transport("decode-0"), transfer.Config{Observer: m})
	_ = m.CollectHealth(eng)

	h, err := observe.Handler(observe.HandlerConfig{Health: eng, Gatherer: reg})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(h) // in a server: http.Server{Addr: ":9400", Handler: h}
	defer srv.Close()
	probe := func(path string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if path == "/healthz" || strings.HasPrefix(line, "kvxfer_healthy ") {
				fmt.Println(path, resp.StatusCode, line)
				break
			}
		}
	}
	probe("/healthz")
	probe("/metrics")
	_ = eng.Close()
	probe("/healthz")
	probe("/metrics")
	// Output:
	// /healthz 200 ok
	// /metrics 200 kvxfer_healthy 1
	// /healthz 503 engine closed
	// /metrics 200 kvxfer_healthy 0
}

// ExampleMulti gives one engine both metrics and structured logs.
func ExampleMulti() {
	m, _ := observe.NewMetrics(observe.MetricsConfig{Registerer: prometheus.NewRegistry()})
	logger := zap.NewExample() // in a server: the process's own logger
	eng, err := transfer.New(mem.NewNetwork().Transport("prefill-0"), transfer.Config{
		Logger:   logger,
		Observer: observe.Multi(m, observe.NewLogObserver(logger.Named("kvxfer"))),
	})
	if err != nil {
		panic(err)
	}
	out := eng.Cancel(7)
	_ = eng.Close() // the observer hears events on its own goroutine; Close waits for it
	fmt.Println(out)
	// Output:
	// {"level":"debug","logger":"kvxfer","msg":"transfer cancel","request":7,"outcome":"not-found","free_now":true}
	// not-found
}

// ExampleCombineHealth gives one probe to a process with two engines; the reason names the
// engine that is unhealthy.
func ExampleCombineHealth() {
	net := mem.NewNetwork()
	prefill, _ := transfer.New(net.Transport("prefill-0"), transfer.Config{})
	decode, _ := transfer.New(net.Transport("decode-0"), transfer.Config{})
	defer prefill.Close()
	health := observe.CombineHealth(
		observe.NamedHealth{Name: "prefill", Source: prefill},
		observe.NamedHealth{Name: "decode", Source: decode},
	)
	fmt.Println(health.Health().Healthy)
	_ = decode.Close()
	h := health.Health()
	fmt.Println(h.Healthy, h.Reason)
	// Output:
	// true
	// false decode: engine closed
}
