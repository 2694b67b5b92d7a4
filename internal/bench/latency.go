// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench/perftest"
	"github.com/kvxfer/kvxfer/layout"
)

// The latency rows: most requests a disaggregated cluster serves are short, and with prefix
// caching most transfers are a few new blocks, so what sets their time to first token is the
// fixed cost of a transfer, not its bandwidth. Each row is measured like a transfer row (every
// byte checked between rounds, off the clock) and set beside the least any transfer of its
// bytes can take on the same wire in the same run: one ucx_perftest get or one tagged message
// of one prefill rank's bytes (the ranks move at once), whichever is less, plus one round trip
// of a small tagged message (a request and its answer).

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

// latencyLimit is a latency row's same-run limit, in microseconds: the least ucx_perftest
// takes to move bytes once, by one get or by one tagged message (the engine reads with gets
// where they are one copy and sends messages where UCX would emulate gets, as over TCP), and
// its median round trip of a small tagged message (a request and its answer).
type latencyLimit struct {
	bytes       int64
	moveUs      float64
	roundTripUs float64
}

// us is the limit: the move and the round trip, one after the other.
func (l latencyLimit) us() float64 { return l.moveUs + l.roundTripUs }

// name is how the table names the limit.
func (l latencyLimit) name(tls string) string {
	if tls == "" {
		tls = "default"
	}
	return "move+rtt " + tls
}

// setLimit records the latency limit a latency row is compared to.
func (r *Result) setLimit(name string, l latencyLimit) {
	limit, ratio, ok := l.against(r.P50us)
	if !ok {
		return
	}
	r.Baseline, r.BaselineBytes, r.LimitUs, r.LimitRatio = name, l.bytes, &limit, &ratio
}

// setEngineLimit records the latency limit measured as the engine runs UCX (Result.LimitEngineUs).
func (r *Result) setEngineLimit(l latencyLimit) {
	limit, ratio, ok := l.against(r.P50us)
	if !ok {
		return
	}
	r.LimitEngineUs, r.LimitEngineRatio = &limit, &ratio
}

// against is the limit and p50 over it, unless the limit is no time.
func (l latencyLimit) against(p50 float64) (limit, ratio float64, ok bool) {
	limit = l.us()
	if limit <= 0 || math.IsNaN(limit) || math.IsInf(limit, 0) {
		return 0, 0, false
	}
	return limit, p50 / limit, true
}

// latencyMoveIters bounds the gets or messages of one measurement of a move: a median needs no
// more, and over TCP, where UCX emulates gets, 60,000 small ones outlast the timeout.
const latencyMoveIters = 1000

// latencyProbeBytes is the size of the tag_lat messages of the round trip: a control message.
const latencyProbeBytes = 8

// latencyLimits measures, and keeps, the parts of the latency limits of a run: the round trip
// once, the moves once per size. run is perftest.Run, or the two-host run's remote baseline.
type latencyLimits struct {
	run       func(context.Context, perftest.Config) (perftest.Result, error)
	base      perftest.Config // binary, TLS, memory type, timeout
	budget    int64           // bytes each move measurement moves, about
	roundTrip float64
	moves     map[int64]float64
}

// limit is the limit for moving bytes once.
func (m *latencyLimits) limit(ctx context.Context, bytes int64) (latencyLimit, error) {
	if m.roundTrip == 0 {
		rt, err := m.median(ctx, "tag_lat", latencyProbeBytes, 10000, 1000)
		if err != nil {
			return latencyLimit{}, err
		}
		m.roundTrip = 2 * rt // ucx_perftest reports a ping-pong one way
	}
	move, ok := m.moves[bytes]
	if !ok {
		iters, warmup := perftest.Iters(bytes, m.budget)
		iters, warmup = min(iters, latencyMoveIters), min(warmup, latencyMoveIters/10)
		get, err := m.median(ctx, "ucp_get", bytes, iters, warmup)
		if err != nil {
			return latencyLimit{}, err
		}
		send, err := m.median(ctx, "tag_lat", bytes, iters, warmup) // one way: one message
		if err != nil {
			return latencyLimit{}, err
		}
		move = min(get, send)
		if m.moves == nil {
			m.moves = map[int64]float64{}
		}
		m.moves[bytes] = move
	}
	return latencyLimit{bytes: bytes, moveUs: move, roundTripUs: m.roundTrip}, nil
}

// median runs one ucx_perftest test and returns its median time per operation.
func (m *latencyLimits) median(ctx context.Context, test string, size int64, iters, warmup int) (float64, error) {
	c := m.base
	c.Test, c.Size, c.Iters, c.Warmup = test, size, iters, warmup
	res, err := m.run(ctx, c)
	if err != nil {
		return 0, fmt.Errorf("latency limit: %w", err)
	}
	v, err := medianUs(res)
	if err != nil {
		return 0, fmt.Errorf("latency limit: %s of %d bytes: %w", test, size, err)
	}
	return v, nil
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

// runLimits are a run's two latency limits: UCX as it comes (Result.LimitUs, the least the wire
// takes) and UCX as the engine runs it (Result.LimitEngineUs: peer error handling and the
// engine's settings, such as TCP without zero-copy, which copies each byte twice more), nil
// where the engine reported no settings (no UCX context).
type runLimits struct {
	asUCXComes, asEngine *latencyLimits
}

// newRunLimits measures with run, from base, and as the engine runs UCX with settings
// (native.Settings of the run's engine) where there are any.
func newRunLimits(run func(context.Context, perftest.Config) (perftest.Result, error), base perftest.Config, budget int64, settings []string) runLimits {
	l := runLimits{asUCXComes: &latencyLimits{run: run, base: base, budget: budget}}
	if len(settings) > 0 {
		eng := base
		eng.ErrorHandling, eng.Env = true, slices.Clone(settings)
		l.asEngine = &latencyLimits{run: run, base: eng, budget: budget}
	}
	return l
}

// set measures (once per size) and records both limits of a latency row of bytes per send.
func (l runLimits) set(ctx context.Context, res *Result, bytes int64, tls string) error {
	lim, err := l.asUCXComes.limit(ctx, bytes)
	if err != nil {
		return err
	}
	res.setLimit(lim.name(tls), lim)
	if l.asEngine == nil {
		return nil
	}
	lim, err = l.asEngine.limit(ctx, bytes)
	if err != nil {
		return fmt.Errorf("as the engine runs UCX: %w", err)
	}
	res.setEngineLimit(lim)
	return nil
}
