// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
)

// errEngineMissing is what the transfer subcommands return after their set-up and handshake
// in a build without the engine's UCX transport (built without cgo): the flags, the peers and
// the control connection work; there is no transfer to measure.
var errEngineMissing = errors.New("the transfer engine's UCX transport is not in this build of kvxbench (it needs cgo: build with CGO_ENABLED=1); `kvxbench gather` measures the host gather and scatter alone")

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
	maxMemory      string
	seed           uint64
	staging        bool
	noRMA          bool
	rmaEmulated    bool
	lanes          int
	decodeOrder    string
	pool           string
	directChunk    string
	http           string
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
	fs.StringVar(&f.maxMemory, "max-memory", "auto", "most memory the KV pools of both ends may take together; scenarios that need more are skipped with a note (auto: 45% of RAM)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the random order of each request's blocks in the pool")
	fs.StringVar(&f.directChunk, "direct-chunk", "64MiB", "the largest message of the direct path (no slot bounds it)")
	fs.BoolVar(&f.staging, "staging", false, "force the staging path (gather, wire, scatter through slots); by default the pools are mapped by UCX and transfers take the one-copy direct path")
	fs.StringVar(&f.decodeOrder, "decode-order", "", "the decode pool's order when it differs from --order (layout conversion on the way: block-major, layer-major or layer-major-nhd)")
	fs.IntVar(&f.lanes, "lanes", 0, "UCX workers (each its own thread) the decode end stripes a request's RMA gets over; 1 is a single worker; 0: the transport's default (up to 4, at most the cores)")
	fs.BoolVar(&f.rmaEmulated, "rma-where-emulated", false, "keep the RMA mode where UCX emulates gets (TCP); by default the decode end takes tagged IOV messages there, as the endpoint's lanes say")
	fs.StringVar(&f.pool, "pool", "transport", "who maps the host KV pools: transport (UCXTransport.AllocatePool) or caller (mmap by this process, then UCXTransport.RegisterHost, as a serving process hands over its own KV cache)")
	fs.BoolVar(&f.noRMA, "no-rma", false, "keep the direct path on tagged IOV messages: no RMA gets between the pools even where the layouts line up")
	fs.StringVar(&f.http, "http", "", "serve /livez, /readyz, /healthz and /metrics (kvxfer_* series) of this process's engine on this address, such as 127.0.0.1:9400 (serve: from the start, before a peer connects)")
}

// runConfig is a validated transfer run. It is also what the parent hands its peer
// processes, as JSON, so both ends build the same pools and requests.
type runConfig struct {
	ShapeName      string        `json:"shape_name"`
	MemCap         int64         `json:"mem_cap"`
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
	// Staging forces the staging path on both ends (--staging); otherwise pools are mapped
	// by the transport and transfers go direct.
	Staging bool `json:"staging"`
	// DirectChunkBytes is the direct path's largest message (--direct-chunk), and its
	// largest RMA get.
	DirectChunkBytes int64 `json:"direct_chunk_bytes"`
	// NoRMA keeps the direct path on IOV messages (--no-rma); by default the decode end reads
	// the prefill pool with RMA gets where the layouts line up.
	NoRMA bool `json:"no_rma"`
	// RMAWhereEmulated keeps the RMA mode where UCX emulates gets (--rma-where-emulated).
	RMAWhereEmulated bool `json:"rma_where_emulated"`
	// Lanes is UCXConfig.Lanes of both ends (--lanes; 0: the transport's default).
	Lanes int `json:"lanes"`
	// Pool is who maps the host pools for the direct path (--pool): "transport"
	// (AllocatePool) or "caller" (mmap, then RegisterHost).
	Pool string `json:"pool"`
	// Memory is where the KV pools and staging slots live: "host" or "device" (--memory;
	// cmd/kvxbench/device_engine.go).
	Memory string `json:"memory"`
	// HTTP is where this process serves its probes and /metrics; never handed to peers, which
	// would all try to listen on it.
	HTTP string `json:"-"`
	// processHTTP is the endpoint serve opened at start on HTTP, for its engine to report
	// through once made; nil: the engine opens its own.
	processHTTP *observability
}

func (f *transferFlags) resolve(lookupTLS func() string) (runConfig, error) {
	if err := f.out.check(); err != nil {
		return runConfig{}, err
	}
	switch f.memory {
	case "host":
	case "device":
		if f.staging {
			return runConfig{}, usagef("--memory device always stages (in GPU memory); drop --staging")
		}
	default:
		return runConfig{}, usagef("--memory %q: choose host or device", f.memory)
	}
	switch {
	case f.pool != "transport" && f.pool != "caller":
		return runConfig{}, usagef("--pool %q: choose transport or caller", f.pool)
	case f.pool == "caller" && (f.staging || f.memory == "device"):
		return runConfig{}, usagef("--pool caller registers host pools for the direct path; drop --staging and --memory device")
	}
	if f.connectTimeout <= 0 {
		return runConfig{}, usagef("--connect-timeout = %v: must be positive", f.connectTimeout)
	}
	if f.lanes < 0 || f.lanes > transfer.MaxUCXLanes {
		return runConfig{}, usagef("--lanes = %d: must be between 0 (the default) and %d", f.lanes, transfer.MaxUCXLanes)
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
	directChunk, err := parseBytes("direct-chunk", f.directChunk)
	if err != nil {
		return runConfig{}, err
	}
	if directChunk < 4096 {
		return runConfig{}, usagef("--direct-chunk = %d: must be at least 4KiB", directChunk)
	}
	memCap, err := f.memoryCap()
	if err != nil {
		return runConfig{}, err
	}
	prefill, decode, err := sizePools(s, prompts, conc, f.prefillTP, memCap, f.layout.poolBlocks)
	if err == nil && f.decodeOrder != "" {
		o, perr := parseOrder(f.decodeOrder)
		if perr != nil {
			return runConfig{}, usagef("--decode-order %q: choose block-major, layer-major or layer-major-nhd", f.decodeOrder)
		}
		decode = layout.Packed(decode.Dims(), o) // a block's bytes are the same in every order
	}
	if err != nil {
		return runConfig{}, err
	}
	tls := f.tls
	if tls == "" {
		tls = lookupTLS()
	}
	return runConfig{
		ShapeName: s.name, MemCap: memCap, Dims: s.dims, Order: s.order, Decode: decode, Prefill: prefill,
		Prompts: prompts, Concurrency: conc, SlotBytes: slot, PipelineDepth: f.pipelineDepth,
		TLS: tls, PrefillTP: f.prefillTP, Duration: f.out.duration, MaxIters: f.out.maxIters,
		Verify: !f.out.noVerify, ConnectTimeout: f.connectTimeout, Seed: f.seed, HTTP: f.http,
		Staging: f.staging, DirectChunkBytes: directChunk, NoRMA: f.noRMA, RMAWhereEmulated: f.rmaEmulated, Lanes: f.lanes, Memory: f.memory,
		Pool: f.pool,
	}, nil
}

// sizePools sizes the pools of a run. Prefill requests only read their blocks, so requests in
// flight share one set: each prefill rank's pool holds the largest prompt plus a quarter (so a
// request's blocks are scattered). Decode requests in flight write distinct blocks and are
// checked afterwards, so the decode pool holds concurrency times the prompt, for the largest
// scenario that fits in memCap with the prefill pools (poolBlocks, when set, overrides).
func sizePools(s shape, prompts []int64, conc []int, prefillTP int, memCap, poolBlocks int64) (prefill, decode layout.Layout, err error) {
	if s.dims.NumHeads%int64(prefillTP) != 0 {
		return prefill, decode, usagef("--prefill-tp %d: the pool's %d heads do not split evenly", prefillTP, s.dims.NumHeads)
	}
	most := mostBlocks(s, prompts)
	pd := s.dims
	pd.NumHeads /= int64(prefillTP)
	pd.NumBlocks = most + most/4 + 1
	prefill = layout.Packed(pd, s.order)
	if err := prefill.Validate(); err != nil {
		return prefill, decode, layoutUsageError(err)
	}
	one := s.dims
	one.NumBlocks = 1
	blockBytes := layout.Packed(one, s.order).BlockBytes()
	room := (memCap - int64(prefillTP)*prefill.SpanBytes()) / blockBytes
	var need int64
	for _, t := range prompts {
		for _, c := range conc {
			if n := blocksFor(s, t) * int64(c); n <= room {
				need = max(need, n)
			}
		}
	}
	if need == 0 {
		return prefill, decode, usagef("--max-memory %s: no scenario fits; the smallest needs %s of pools",
			humanBytes(memCap), humanBytes(int64(prefillTP)*prefill.SpanBytes()+blocksFor(s, prompts[0])*blockBytes))
	}
	numBlocks := need + min(need/4+1, room-need)
	if poolBlocks != 0 {
		if poolBlocks < need {
			return prefill, decode, usagef("--pool-blocks = %d: the run needs at least %d blocks", poolBlocks, need)
		}
		numBlocks = poolBlocks
	}
	dd := s.dims
	dd.NumBlocks = numBlocks
	decode = layout.Packed(dd, s.order)
	if err := decode.Validate(); err != nil {
		return prefill, decode, layoutUsageError(err)
	}
	return prefill, decode, nil
}

// memoryCap reads --max-memory: a size, or auto for 45% of the machine's memory.
func (f *transferFlags) memoryCap() (int64, error) {
	if f.maxMemory != "auto" {
		n, err := parseBytes("max-memory", f.maxMemory)
		if err != nil {
			return 0, err
		}
		if n <= 0 {
			return 0, usagef("--max-memory = %s: must be positive", f.maxMemory)
		}
		return n, nil
	}
	total, err := memTotal()
	if err != nil {
		return 8 << 30, nil // no /proc/meminfo: a cap most machines that run this have
	}
	return total * 45 / 100, nil
}

// memTotal reads MemTotal from /proc/meminfo.
func memTotal() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no MemTotal in /proc/meminfo")
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
