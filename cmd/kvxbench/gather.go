// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
)

// outputFlags are the flags every measuring subcommand shares.
type outputFlags struct {
	json     bool
	plot     string
	baseline bool
	noVerify bool
	duration time.Duration
	maxIters int
}

func (f *outputFlags) register(fs *flagSet, defaultDuration time.Duration, baselineHelp string) {
	fs.BoolVar(&f.json, "json", false, "print one JSON object per result instead of the table")
	fs.StringVar(&f.plot, "plot", "", "also draw bandwidth against message size, with the baseline beside it, into this .svg file")
	fs.BoolVar(&f.baseline, "baseline", true, baselineHelp)
	fs.BoolVar(&f.noVerify, "no-verify", false, "skip the checksum of every moved byte")
	fs.DurationVar(&f.duration, "duration", defaultDuration, "how long each scenario is measured")
	fs.IntVar(&f.maxIters, "max-iters", 10000, "most requests timed per scenario, whatever the duration")
}

func (f *outputFlags) check() error {
	if err := checkDuration("duration", f.duration); err != nil {
		return err
	}
	if f.maxIters <= 0 {
		return usagef("--max-iters = %d: must be positive", f.maxIters)
	}
	return checkPlotPath(f.plot)
}

// minIters is the fewest requests a scenario times, however long they take, so p50 and p99
// are not one sample.
const minIters = 3

// gatherFlags are the flags of `kvxbench gather`.
type gatherFlags struct {
	layout   layoutFlags
	out      outputFlags
	prompts  string
	slotSize string
	memory   string
	seed     uint64
}

func cmdGather(ctx context.Context, args []string, out *outputs) error {
	var f gatherFlags
	fs := newFlagSet("gather", "gather [flags]", out)
	f.layout.register(fs)
	f.out.register(fs, time.Second, "measure memcpy of the same bytes in turn with each operation, and report the ratio")
	fs.StringVar(&f.prompts, "prompts", "1k,4k,16k", "prompt lengths in tokens, comma-separated")
	fs.StringVar(&f.slotSize, "slot-size", "4MiB", "bytes gathered or scattered per call: one staging slot, as the engine moves them")
	fs.StringVar(&f.memory, "memory", "host", "where the pool lives: host or device")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the random order of each request's blocks in the pool")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("gather takes no arguments, got %q", fs.Args())
	}
	cfg, err := f.resolve()
	if err != nil {
		return err
	}
	return runGather(ctx, cfg, out)
}

// gatherConfig is a validated `kvxbench gather`.
type gatherConfig struct {
	shape   shape
	pool    layout.Layout
	prompts []int64
	slot    int64
	out     outputFlags
	seed    uint64
	device  bool // --memory device: the CUDA kernels against a device copy
}

func (f *gatherFlags) resolve() (gatherConfig, error) {
	if err := f.out.check(); err != nil {
		return gatherConfig{}, err
	}
	var device bool
	switch f.memory {
	case "host":
	case "device":
		device = true
	default:
		return gatherConfig{}, usagef("--memory %q: choose host or device", f.memory)
	}
	s, err := f.layout.shape()
	if err != nil {
		return gatherConfig{}, err
	}
	prompts, err := parseTokens("prompts", f.prompts)
	if err != nil {
		return gatherConfig{}, err
	}
	slot, err := parseBytes("slot-size", f.slotSize)
	if err != nil {
		return gatherConfig{}, err
	}
	if slot < s.dims.ElemSize {
		return gatherConfig{}, usagef("--slot-size = %d: must hold at least one %d-byte element", slot, s.dims.ElemSize)
	}
	pool, err := f.layout.layout(s, mostBlocks(s, prompts), poolBlocksFor(s, prompts))
	if err != nil {
		return gatherConfig{}, err
	}
	return gatherConfig{shape: s, pool: pool, prompts: prompts, slot: slot, out: f.out, seed: f.seed, device: device}, nil
}

// blocksFor is how many blocks a prompt of tokens fills.
func blocksFor(s shape, tokens int64) int64 {
	return (tokens + s.dims.TokensPerBlock - 1) / s.dims.TokensPerBlock
}

// mostBlocks is the block count of the largest prompt.
func mostBlocks(s shape, prompts []int64) int64 {
	var most int64
	for _, t := range prompts {
		most = max(most, blocksFor(s, t))
	}
	return most
}

// poolBlocksFor sizes a pool for the largest prompt plus a quarter, so each request's blocks
// are a random, non-contiguous subset, as in a serving engine's pool.
func poolBlocksFor(s shape, prompts []int64) int64 {
	most := mostBlocks(s, prompts)
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

func runGather(ctx context.Context, cfg gatherConfig, out *outputs) error {
	if cfg.device {
		return runDeviceGather(ctx, cfg, out)
	}
	// Every scenario runs its operation and its baseline for --duration each; allow three
	// times that plus set-up before calling the run stuck.
	budget := time.Duration(len(cfg.prompts))*2*(3*cfg.out.duration+10*time.Second) + time.Minute
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()

	span := cfg.pool.SpanBytes()
	pool := make([]byte, span)
	fillPattern(pool, cfg.seed)
	slot := make([]byte, cfg.slot)
	r := rand.New(rand.NewPCG(cfg.seed, 0x6b7678))

	bar := newProgress(out.stderr, 2*len(cfg.prompts), 2*cfg.out.duration)
	defer bar.done()
	pr := &printer{w: out.stdout, json: cfg.out.json}
	for _, tokens := range cfg.prompts {
		blocks := randomBlocks(r, cfg.pool.NumBlocks, blocksFor(cfg.shape, tokens))
		plan, err := layout.NewPlan(cfg.pool, cfg.pool.All(), blocks)
		if err != nil {
			return fmt.Errorf("plan for %d tokens: %w", tokens, err)
		}
		chunks, err := plan.Chunks(cfg.slot)
		if err != nil {
			return fmt.Errorf("chunks for %d tokens: %w", tokens, err)
		}
		for _, op := range []string{"gather", "scatter"} {
			name := fmt.Sprintf("%s %s %s", op, cfg.shape.name, humanTokens(tokens))
			bar.step(name)
			m := hostMeasure{plan: plan, chunks: chunks, pool: pool, slot: slot, op: op}
			res, err := m.run(ctx, cfg.out, bar)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			res.Name, res.Model, res.Tokens = name, cfg.shape.name, tokens
			if err := pr.add(res); err != nil {
				return err
			}
		}
	}
	bar.done()
	return pr.finish(cfg.out.plot)
}

// hostMeasure times one host gather or scatter of a whole request, chunk by chunk through one
// staging slot, against memcpy of the same chunks.
type hostMeasure struct {
	plan   *layout.Plan
	chunks []layout.Chunk
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

func (m *hostMeasure) run(ctx context.Context, o outputFlags, bar *progress) (Result, error) {
	bytes := m.plan.Bytes()
	res := Result{Op: m.op, Concurrency: 1, Bytes: bytes, MessageBytes: int64(len(m.slot))}
	if len(m.chunks) == 1 {
		res.MessageBytes = m.chunks[0].Length
	}
	// Warm up: fault in the pages and the caches' working set before timing.
	if err := m.once(); err != nil {
		return res, err
	}
	if o.baseline {
		m.baselineOnce()
	}
	var opTimes latencies
	var opTotal, baseTotal time.Duration
	for i := 0; i < o.maxIters && (i < minIters || opTotal < o.duration); i++ {
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
		if o.baseline {
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
	if o.baseline {
		res.setBaseline("memcpy", bytes, gbps(bytes*int64(len(opTimes)), baseTotal))
	}
	if !o.noVerify {
		if err := m.verify(); err != nil {
			return res, err
		}
		res.Verified = true
	}
	return res, nil
}
