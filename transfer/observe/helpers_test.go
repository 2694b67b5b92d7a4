// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/observe"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
	"github.com/kvxfer/kvxfer/transfer/tuning"
)

// testDims is a small pool: 1 KiB per block, so a few blocks span several 512-byte chunks.
var testDims = layout.Dims{NumLayers: 2, KVFactor: 2, NumHeads: 2, HeadDim: 16, ElemSize: 2, TokensPerBlock: 4, NumBlocks: 8}

// waitBound bounds every wait in these tests; the transfers take milliseconds.
const waitBound = 10 * time.Second

// pair is a prefill engine and a decode engine over one in-memory network, each with its own
// Metrics (told apart by an "engine" label) on one registry.
type pair struct {
	net              *mem.Network
	prefill, decode  *transfer.Engine
	reg              *prometheus.Registry
	pm, dm           *observe.Metrics
	layout           layout.Layout
	srcPool, dstPool []byte
}

// newPair starts the engines with cfg (Observer replaced by the Metrics, plus what extra
// returns for the engine's name, if extra is set) and closes them when the test ends.
func newPair(t *testing.T, cfg transfer.Config, extra func(engine string) transfer.Observer) *pair {
	t.Helper()
	p := &pair{net: mem.NewNetwork(), reg: prometheus.NewRegistry(), layout: layout.Packed(testDims, layout.BlockMajor)}
	p.srcPool = make([]byte, p.layout.SpanBytes())
	for i := range p.srcPool {
		p.srcPool[i] = byte(i*7 + 3)
	}
	p.dstPool = make([]byte, p.layout.SpanBytes())
	start := func(name string) (*transfer.Engine, *observe.Metrics) {
		m, err := observe.NewMetrics(observe.MetricsConfig{Registerer: p.reg, ConstLabels: prometheus.Labels{"engine": name}})
		require.NoError(t, err)
		c := cfg
		c.Observer = m
		if extra != nil {
			c.Observer = observe.Multi(m, extra(name))
		}
		e, err := transfer.New(p.net.Transport(transfer.Peer(name)), c)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, e.Close()) })
		require.NoError(t, m.CollectHealth(e))
		return e, m
	}
	p.prefill, p.pm = start("prefill")
	p.decode, p.dm = start("decode")
	return p
}

// smallConfig is an engine configuration with small slots (several chunks per transfer) and
// short deadlines, so failure paths finish in milliseconds.
func smallConfig() transfer.Config {
	return transfer.Config{
		SlotBytes:       transport.DataHeaderBytes + 512,
		MaxConcurrent:   4,
		TransferTimeout: 5 * time.Second,
		QueueTimeout:    5 * time.Second,
		Tuning:          tuning.Config{PipelineDepth: 2},
	}
}

func (p *pair) plan(t *testing.T, blocks ...int32) *layout.Plan {
	t.Helper()
	pl, err := layout.NewPlan(p.layout, p.layout.All(), blocks)
	require.NoError(t, err)
	return pl
}

// start posts the receive on decode and the send on prefill for one request.
func (p *pair) start(t *testing.T, id transfer.RequestID, blocks ...int32) (send, recv *transfer.Handle) {
	t.Helper()
	pl := p.plan(t, blocks...)
	recv, err := p.decode.Receive(context.Background(), transfer.Spec{ID: id, Peer: "prefill", Plan: pl, Pool: p.dstPool})
	require.NoError(t, err)
	send, err = p.prefill.Send(context.Background(), transfer.Spec{ID: id, Peer: "decode", Plan: pl, Pool: p.srcPool})
	require.NoError(t, err)
	return send, recv
}

// waitQuiesced waits, bounded, for h's memory to be released to the caller.
func waitQuiesced(t *testing.T, h *transfer.Handle) transfer.Status {
	t.Helper()
	select {
	case <-h.Quiesced():
	case <-time.After(waitBound):
		require.FailNow(t, "handle did not quiesce", "request %d: %+v", h.ID(), h.Status())
	}
	return h.Status()
}

// gathered returns the families of reg by name.
func gathered(t *testing.T, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// sample finds the metric of family name whose labels include want, or fails.
func sample(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) *dto.Metric {
	t.Helper()
	mf, ok := gathered(t, reg)[name]
	require.True(t, ok, "no family %s", name)
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	require.FailNow(t, "no sample", "%s%v", name, want)
	return nil
}

// value reads a counter's or gauge's value.
func value(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	m := sample(t, reg, name, want)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	require.FailNow(t, "not a counter or gauge", name)
	return 0
}

// eventually polls cond every few milliseconds, at most bound.
func eventually(t *testing.T, bound time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, bound, 5*time.Millisecond, append([]any{msg}, args...)...)
}

// nopObserver ignores every event; a test's observer embeds it and adds the methods it needs.
type nopObserver struct{}

func (nopObserver) OnTransition(transfer.RequestID, int, transfer.State, transfer.State, transfer.Event) {
}
func (nopObserver) OnCancel(transfer.RequestID, transfer.CancelOutcome) {}
func (nopObserver) OnQuarantine(transfer.RequestID, int, error)         {}
func (nopObserver) OnPoison(transfer.RequestID, int, string)            {}
func (nopObserver) OnProgress(transfer.RequestID, int64, time.Time)     {}

// anEvent is the event the tests that call an observer directly pass with each transition:
// the observers under test count states, not events (the engine's own tests check which event
// moved a transfer where), and Multi passes it on unread.
var anEvent transfer.Event
