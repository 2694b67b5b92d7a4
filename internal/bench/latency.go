// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench/perftest"
	"github.com/kvxfer/kvxfer/layout"
)

// The latency rows: most requests a disaggregated cluster serves are short, and with prefix
// caching most transfers are a few new blocks, so what sets their time to first token is the
// fixed cost of a transfer, not its bandwidth. Each row is measured like a transfer row (every
// byte checked between rounds, off the clock) and set beside the least any transfer of its
// bytes can take on the same wire in the same run: one ucx_perftest get of one prefill rank's
// bytes (the ranks read at once), plus one round trip of a small tagged message (a request and
// its answer).

// latencyTokens is the short request of the latency rows: 32 tokens, one Llama block.
const latencyTokens = 32

// latencyConcurrency are the latency rows' concurrencies: one request alone, and a burst.
var latencyConcurrency = []int{1, 16}

// latencyScenarios are the latency rows of a pool of dims: a 32-token request, and one block's
// first layer (128 KiB for Llama-3-8B: a one-layer chunk of a streamed request, or the one
// new block of a prefix-cached one), each at every latencyConcurrency.
func latencyScenarios(dims layout.Dims) []scenario {
	var out []scenario
	for _, c := range latencyConcurrency {
		out = append(out, scenario{tokens: latencyTokens, concurrency: c, latency: true})
	}
	for _, c := range latencyConcurrency {
		out = append(out, scenario{tokens: dims.TokensPerBlock, concurrency: c, latency: true, layers: 1})
	}
	return out
}

// firstLayers narrows sel to its first layers layers; 0 keeps it whole.
func firstLayers(sel layout.Selection, layers int64) (layout.Selection, error) {
	switch {
	case layers == 0:
		return sel, nil
	case layers < 0 || layers > sel.Layers():
		return sel, fmt.Errorf("a request of %d layers from a selection of %d", layers, sel.Layers())
	}
	sel.LayerEnd = sel.LayerBegin + layers
	return sel, nil
}

// latencyLimit is a latency row's same-run limit, in microseconds: ucx_perftest's median for
// one get of getBytes, and its median round trip of a small tagged message.
type latencyLimit struct {
	getBytes    int64
	getUs       float64
	roundTripUs float64
}

// us is the limit: the get and the round trip, one after the other.
func (l latencyLimit) us() float64 { return l.getUs + l.roundTripUs }

// name is how the table names the limit.
func (l latencyLimit) name(tls string) string {
	if tls == "" {
		tls = "default"
	}
	return "get+rtt " + tls
}

// setLimit records the latency limit a latency row is compared to.
func (r *Result) setLimit(name string, l latencyLimit) {
	limit := l.us()
	if limit <= 0 || math.IsNaN(limit) || math.IsInf(limit, 0) {
		return
	}
	ratio := r.P50us / limit
	r.Baseline, r.BaselineBytes, r.LimitUs, r.LimitRatio = name, l.getBytes, &limit, &ratio
}

// latencyGetIters bounds the gets of a limit's measurement: a median needs no more, and over
// TCP, where UCX emulates gets, 60,000 small ones outlast the measurement's timeout.
const latencyGetIters = 1000

// latencyProbeBytes is the size of the tag_lat messages of the round trip: a control message.
const latencyProbeBytes = 8

// latencyLimits measures, and keeps, the parts of the latency limits of a run: the round trip
// once, a get per size. run is perftest.Run, or the two-host run's remote baseline.
type latencyLimits struct {
	run       func(context.Context, perftest.Config) (perftest.Result, error)
	base      perftest.Config // binary, TLS, memory type, timeout
	budget    int64           // bytes each get measurement moves, about
	roundTrip float64
	gets      map[int64]float64
}

// limit is the limit for one get of getBytes.
func (m *latencyLimits) limit(ctx context.Context, getBytes int64) (latencyLimit, error) {
	if m.roundTrip == 0 {
		c := m.base
		c.Test, c.Size, c.Iters, c.Warmup = "tag_lat", latencyProbeBytes, 10000, 1000
		res, err := m.run(ctx, c)
		if err != nil {
			return latencyLimit{}, fmt.Errorf("latency limit: %w", err)
		}
		if m.roundTrip, err = medianUs(res); err != nil {
			return latencyLimit{}, fmt.Errorf("latency limit: tag_lat: %w", err)
		}
		m.roundTrip *= 2 // ucx_perftest reports a ping-pong one way
	}
	get, ok := m.gets[getBytes]
	if !ok {
		c := m.base
		c.Test, c.Size = "ucp_get", getBytes
		c.Iters, c.Warmup = perftest.Iters(getBytes, m.budget)
		c.Iters, c.Warmup = min(c.Iters, latencyGetIters), min(c.Warmup, latencyGetIters/10)
		res, err := m.run(ctx, c)
		if err != nil {
			return latencyLimit{}, fmt.Errorf("latency limit: %w", err)
		}
		if get, err = medianUs(res); err != nil {
			return latencyLimit{}, fmt.Errorf("latency limit: ucp_get: %w", err)
		}
		if m.gets == nil {
			m.gets = map[int64]float64{}
		}
		m.gets[getBytes] = get
	}
	return latencyLimit{getBytes: getBytes, getUs: get, roundTripUs: m.roundTrip}, nil
}

// medianUs is ucx_perftest's median time per operation; a ucx_perftest that prints no median
// gives its average over the whole run instead.
func medianUs(r perftest.Result) (float64, error) {
	v := r.TypicalLatencyUs
	if v == 0 {
		v = r.AvgLatencyUs
	}
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("ucx_perftest reported a time of %v us per operation", v)
	}
	return v, nil
}

// latencyPerftest is the configuration the latency limits start from: the run's transports and
// memory, bounded like the bandwidth baseline.
func latencyPerftest(cfg RunConfig, bin string) perftest.Config {
	return perftest.Config{Binary: bin, TLS: cfg.TLS, MemType: perftestMemType(cfg),
		Timeout: cfg.Duration*10 + 30*time.Second}
}
