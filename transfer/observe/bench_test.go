// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// BenchmarkMetrics_Transfer is the observer cost the engine pays for one transfer of four
// chunks: start, three handle transitions, four progress reports. It runs on the engine's
// goroutines, sometimes under a handle's lock, so it must stay small next to a chunk's copy.
func BenchmarkMetrics_Transfer(b *testing.B) {
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	obs := observe.Multi(m, observe.NewLogObserver(zap.NewNop()))
	start := obs.(observe.StartObserver)
	now := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		id := transfer.RequestID(time.Now().UnixNano())
		for pb.Next() {
			id++
			start.OnStart(transfer.StartInfo{ID: id, Receive: true, Bytes: 4 << 20})
			obs.OnTransition(id, -1, transfer.Queued, transfer.Advertised, anEvent)
			for range 4 {
				obs.OnProgress(id, 1<<20, now)
			}
			obs.OnTransition(id, -1, transfer.Advertised, transfer.InFlight, anEvent)
			obs.OnTransition(id, -1, transfer.InFlight, transfer.Completed, anEvent)
		}
	})
}

// BenchmarkHandler_Scrape is one /metrics scrape of an engine's series, health gauges
// included.
func BenchmarkHandler_Scrape(b *testing.B) {
	reg := prometheus.NewRegistry()
	m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	eng, err := transfer.New(mem.NewNetwork().Transport("bench"), transfer.Config{Observer: m})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	if err := m.CollectHealth(eng); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := testutil.GatherAndCount(reg); err != nil {
			b.Fatal(err)
		}
	}
}
