// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
)

// minIters is the fewest requests a scenario times, however long they take, so p50 and p99
// are not one sample.
const minIters = 3

// GatherConfig is a validated `kvxbench gather`.
type GatherConfig struct {
	Shape   Shape
	Pool    layout.Layout // the pool the requests' blocks are drawn from
	Prompts []int64       // a request's length in tokens, one scenario each
	Slot    int64         // bytes gathered or scattered per call
	Out     Output
	Seed    uint64 // seed of the pool's pattern and the requests' block order
	// DeviceMemory runs the CUDA kernels against a device copy of the pool, on CUDA device
	// Ordinal (GPU describes it in the results, when NVML could), instead of the host gather.
	DeviceMemory bool
	Ordinal      int
	GPU          *GPU
}

// blocksFor is how many blocks a prompt of tokens fills.
func blocksFor(s Shape, tokens int64) int64 {
	return (tokens + s.Dims.TokensPerBlock - 1) / s.Dims.TokensPerBlock
}

// MostBlocks is the block count of the largest prompt.
func MostBlocks(s Shape, prompts []int64) int64 {
	var most int64
	for _, t := range prompts {
		most = max(most, blocksFor(s, t))
	}
	return most
}

// PoolBlocksFor sizes a pool for the largest prompt plus a quarter, so each request's blocks
// are a random, non-contiguous subset, as in a serving engine's pool.
func PoolBlocksFor(s Shape, prompts []int64) int64 {
	most := MostBlocks(s, prompts)
	return most + most/4 + 1
}

// randomBlocks picks n distinct blocks of the pool in random order.
func randomBlocks(r *rand.Rand, poolBlocks, n int64) []int32 {
	perm := r.Perm(int(poolBlocks))[:n]
	ids := make([]int32, n)
	for i, b := range perm {
		ids[i] = int32(b)
	}
	return ids
}

// Gather is `kvxbench gather`: each prompt's host (or device) gather and scatter, chunk by
// chunk through one slot, against memcpy of the same bytes.
func Gather(ctx context.Context, cfg GatherConfig, out *Outputs) error {
	if cfg.DeviceMemory {
		return runDeviceGather(ctx, cfg, out)
	}
	// Every scenario runs its operation and its baseline for --duration each; allow three
	// times that plus set-up before calling the run stuck.
	budget := time.Duration(len(cfg.Prompts))*2*(3*cfg.Out.Duration+10*time.Second) + time.Minute
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()

	span := cfg.Pool.SpanBytes()
	pool := make([]byte, span)
	fillPattern(pool, cfg.Seed)
	slot := make([]byte, cfg.Slot)
	r := rand.New(rand.NewPCG(cfg.Seed, 0x6b7678))

	bar := newProgress(out.Stderr, 2*len(cfg.Prompts), 2*cfg.Out.Duration)
	defer bar.done()
	pr := NewPrinter(out.Stdout, cfg.Out.JSON)
	for _, tokens := range cfg.Prompts {
		blocks := randomBlocks(r, cfg.Pool.NumBlocks, blocksFor(cfg.Shape, tokens))
		plan, err := layout.NewPlan(cfg.Pool, cfg.Pool.All(), blocks)
		if err != nil {
			return fmt.Errorf("plan for %d tokens: %w", tokens, err)
		}
		chunks, err := kvplan.Chunks(plan, cfg.Slot)
		if err != nil {
			return fmt.Errorf("chunks for %d tokens: %w", tokens, err)
		}
		for _, op := range []string{"gather", "scatter"} {
			name := fmt.Sprintf("%s %s %s", op, cfg.Shape.Name, humanTokens(tokens))
			bar.step(name)
			m := hostMeasure{plan: plan, chunks: chunks, pool: pool, slot: slot, op: op}
			res, err := m.run(ctx, cfg.Out, bar)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			res.Name, res.Model, res.Tokens = name, cfg.Shape.Name, tokens
			if err := pr.Add(res); err != nil {
				return err
			}
		}
	}
	bar.done()
	return pr.Finish(cfg.Out.Plot)
}

// hostMeasure times one host gather or scatter of a whole request, chunk by chunk through one
// staging slot, against memcpy of the same chunks.
type hostMeasure struct {
	plan   *layout.Plan
	chunks []kvplan.Chunk
	pool   []byte
	slot   []byte
	op     string // gather or scatter
}

// once moves the whole request once.
func (m *hostMeasure) once() error {
	for _, c := range m.chunks {
		var err error
		if m.op == "gather" {
			err = native.HostGather(m.plan, m.pool, c.Offset, m.slot[:c.Length])
		} else {
			err = native.HostScatter(m.plan, m.slot[:c.Length], c.Offset, m.pool)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// baselineOnce copies the same bytes with memcpy: chunk for chunk between the slot and the
// contiguous range of the pool at the chunk's stream offset (the pool spans at least the
// request's bytes).
func (m *hostMeasure) baselineOnce() {
	for _, c := range m.chunks {
		if m.op == "gather" {
			native.HostCopy(m.slot[:c.Length], m.pool[c.Offset:c.Offset+c.Length])
		} else {
			native.HostCopy(m.pool[c.Offset:c.Offset+c.Length], m.slot[:c.Length])
		}
	}
}

// verify moves the request once and checks every byte against a checksum computed with Go's
// plan math: for a gather, the chunks gathered against the pool; for a scatter, a distinct
// pattern scattered and then read back out of the pool.
func (m *hostMeasure) verify() error {
	h := newChecksum()
	for _, c := range m.chunks {
		buf := m.slot[:c.Length]
		if m.op == "gather" {
			if err := native.HostGather(m.plan, m.pool, c.Offset, buf); err != nil {
				return err
			}
		} else {
			fillPattern(buf, uint64(c.Offset)*7+1)
			if err := native.HostScatter(m.plan, buf, c.Offset, m.pool); err != nil {
				return err
			}
		}
		h.Write(buf)
	}
	if got, want := h.Sum32(), streamChecksum(m.plan, m.pool); got != want {
		return fmt.Errorf("verification failed: %s stream checksum %08x, the pool holds %08x", m.op, got, want)
	}
	return nil
}

func (m *hostMeasure) run(ctx context.Context, o Output, bar *progress) (Result, error) {
	bytes := m.plan.Bytes()
	res := Result{Op: m.op, Concurrency: 1, Bytes: bytes, MessageBytes: int64(len(m.slot))}
	if len(m.chunks) == 1 {
		res.MessageBytes = m.chunks[0].Length
	}
	// Warm up: fault in the pages and the caches' working set before timing.
	if err := m.once(); err != nil {
		return res, err
	}
	if o.Baseline {
		m.baselineOnce()
	}
	var opTimes latencies
	var opTotal, baseTotal time.Duration
	for i := 0; i < o.MaxIters && (i < minIters || opTotal < o.Duration); i++ {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("stopped after %d requests: %w", i, err)
		}
		t0 := time.Now()
		if err := m.once(); err != nil {
			return res, err
		}
		d := time.Since(t0)
		opTimes = append(opTimes, d)
		opTotal += d
		if o.Baseline {
			t1 := time.Now()
			m.baselineOnce()
			baseTotal += time.Since(t1)
		}
		bar.tick()
	}
	res.Requests = len(opTimes)
	res.GBps = gbps(bytes*int64(len(opTimes)), opTotal)
	res.P50us, res.P99us = us(opTimes.percentile(50)), us(opTimes.percentile(99))
	if m.op == "gather" {
		res.GatherUs = us(opTimes.mean())
	} else {
		res.ScatterUs = us(opTimes.mean())
	}
	if o.Baseline {
		res.setBaseline("memcpy", bytes, gbps(bytes*int64(len(opTimes)), baseTotal))
	}
	if !o.NoVerify {
		if err := m.verify(); err != nil {
			return res, err
		}
		res.Verified = true
	}
	return res, nil
}
