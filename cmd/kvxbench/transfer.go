// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/kvxfer/kvxfer/cuda/layout"
)

// errEngineMissing is what the transfer subcommands return after their set-up and handshake
// until the transfer engine (package transfer) and its UCX transport are part of kvxfer: the
// flags, the peers, the control connection and the baseline are real; the transfer is not
// there to measure.
var errEngineMissing = errors.New("the transfer engine (package transfer with its UCX transport) is not in this build of kvxfer yet; `kvxbench gather` measures the host gather and scatter alone")

// transferFlags are the flags of run, sweep, serve and connect.
type transferFlags struct {
	layout         layoutFlags
	out            outputFlags
	prompts        string
	concurrency    string
	slotSize       string
	pipelineDepth  int
	tls            string
	memory         string
	prefillTP      int
	connectTimeout time.Duration
	seed           uint64
}

func (f *transferFlags) register(fs *flagSet, defaultDuration time.Duration) {
	f.layout.register(fs)
	f.out.register(fs, defaultDuration, "run ucx_perftest tag_bw at the same message size and UCX_TLS between the same two hosts, and report the ratio (skipped with a note when ucx_perftest is not installed)")
	fs.StringVar(&f.prompts, "prompts", "1k,4k,16k", "prompt lengths in tokens, comma-separated")
	fs.StringVar(&f.concurrency, "concurrency", "1,16", "requests in flight at once, comma-separated")
	fs.StringVar(&f.slotSize, "slot-size", "4MiB", "staging slot size: the largest message on the wire in staging mode")
	fs.IntVar(&f.pipelineDepth, "pipeline-depth", 2, "staging slots one transfer may hold, so the gather of chunk i+1 overlaps the wire of chunk i")
	fs.StringVar(&f.tls, "tls", "", "UCX_TLS for the engine and the baseline, such as shm,self or tcp (default: $UCX_TLS, else UCX's choice)")
	fs.StringVar(&f.memory, "memory", "host", "where the KV pools live: host or device")
	fs.IntVar(&f.prefillTP, "prefill-tp", 1, "prefill tensor parallelism: 2 runs two prefill processes, each holding half the heads, feeding one decode process (TP=1)")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", 10*time.Second, "how long to wait for the peer to connect or answer")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the random order of each request's blocks in the pool")
}

// runConfig is a validated transfer run. It is also what the parent hands its peer
// processes, as JSON, so both ends build the same pools and requests.
type runConfig struct {
	ShapeName      string        `json:"shape_name"`
	Dims           layout.Dims   `json:"dims"`
	Order          layout.Order  `json:"order"`
	Decode         layout.Layout `json:"decode"`  // the decode pool (TP=1 when prefill TP is 2)
	Prefill        layout.Layout `json:"prefill"` // each prefill rank's pool
	Prompts        []int64       `json:"prompts"`
	Concurrency    []int         `json:"concurrency"`
	SlotBytes      int64         `json:"slot_bytes"`
	PipelineDepth  int           `json:"pipeline_depth"`
	TLS            string        `json:"tls"`
	PrefillTP      int           `json:"prefill_tp"`
	Duration       time.Duration `json:"duration"`
	MaxIters       int           `json:"max_iters"`
	Verify         bool          `json:"verify"`
	ConnectTimeout time.Duration `json:"connect_timeout"`
	Seed           uint64        `json:"seed"`
}

func (f *transferFlags) resolve(lookupTLS func() string) (runConfig, error) {
	if err := f.out.check(); err != nil {
		return runConfig{}, err
	}
	switch f.memory {
	case "host":
	case "device":
		return runConfig{}, errDeviceMemory
	default:
		return runConfig{}, usagef("--memory %q: choose host or device", f.memory)
	}
	if f.connectTimeout <= 0 {
		return runConfig{}, usagef("--connect-timeout = %v: must be positive", f.connectTimeout)
	}
	if f.pipelineDepth <= 0 {
		return runConfig{}, usagef("--pipeline-depth = %d: must be positive", f.pipelineDepth)
	}
	if f.prefillTP != 1 && f.prefillTP != 2 {
		return runConfig{}, usagef("--prefill-tp = %d: 1 (same TP on both ends) or 2 (two prefill ranks feed one decode rank)", f.prefillTP)
	}
	s, err := f.layout.shape()
	if err != nil {
		return runConfig{}, err
	}
	prompts, err := parseTokens("prompts", f.prompts)
	if err != nil {
		return runConfig{}, err
	}
	conc, err := parseInts("concurrency", f.concurrency)
	if err != nil {
		return runConfig{}, err
	}
	slot, err := parseBytes("slot-size", f.slotSize)
	if err != nil {
		return runConfig{}, err
	}
	if slot < 4096 {
		return runConfig{}, usagef("--slot-size = %d: must be at least 4KiB", slot)
	}
	// A request's blocks must not be shared by two requests in flight, so the pool holds
	// the largest concurrency's worth of the largest prompt, plus a quarter.
	mostConc := int64(0)
	for _, c := range conc {
		mostConc = max(mostConc, int64(c))
	}
	need := mostBlocks(s, prompts) * mostConc
	decode, err := f.layout.layout(s, need, need+need/4+1)
	if err != nil {
		return runConfig{}, err
	}
	prefill := decode
	if f.prefillTP > 1 {
		if s.dims.NumHeads%int64(f.prefillTP) != 0 {
			return runConfig{}, usagef("--prefill-tp %d: the pool's %d heads do not split evenly", f.prefillTP, s.dims.NumHeads)
		}
		d := decode.Dims()
		d.NumHeads /= int64(f.prefillTP)
		prefill = layout.Packed(d, s.order)
	}
	tls := f.tls
	if tls == "" {
		tls = lookupTLS()
	}
	return runConfig{
		ShapeName: s.name, Dims: s.dims, Order: s.order, Decode: decode, Prefill: prefill,
		Prompts: prompts, Concurrency: conc, SlotBytes: slot, PipelineDepth: f.pipelineDepth,
		TLS: tls, PrefillTP: f.prefillTP, Duration: f.out.duration, MaxIters: f.out.maxIters,
		Verify: !f.out.noVerify, ConnectTimeout: f.connectTimeout, Seed: f.seed,
	}, nil
}

// poolBytes is the memory the run's pools take on this host, both ends together.
func (c runConfig) poolBytes() int64 {
	return c.Decode.SpanBytes() + int64(c.PrefillTP)*c.Prefill.SpanBytes()
}

func (c runConfig) encode() (string, error) {
	b, err := json.Marshal(c)
	return string(b), err
}

func decodeRunConfig(s string) (runConfig, error) {
	var c runConfig
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return c, usagef("peer --config: %v", err)
	}
	if err := c.Decode.Validate(); err != nil {
		return c, usagef("peer --config: decode layout: %v", err)
	}
	if err := c.Prefill.Validate(); err != nil {
		return c, usagef("peer --config: prefill layout: %v", err)
	}
	return c, nil
}
