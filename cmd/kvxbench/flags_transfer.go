// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/kvxfer/kvxfer/native"
	"os"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/layout"
)

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
	device         string
	prefillTP      int
	decodeTP       int
	connectTimeout time.Duration
	maxMemory      string
	seed           uint64
	staging        bool
	noRMA          bool
	noPull         bool
	noInPlace      bool
	rmaEmulated    bool
	rmaMinRegion   string
	lanes          int
	tcpSegment     string
	shmFIFO        int
	decodeOrder    string
	pool           string
	callerPages    string
	directChunk    string
	http           string
	latency        string
	clusterKey     string
	sender         string
	// set reports whether a flag was given on the command line (flag.FlagSet.Visit).
	set func(name string) bool
}

func (f *transferFlags) register(fs *flagSet, defaultDuration time.Duration) {
	f.layout.register(fs)
	f.out.register(fs, defaultDuration, "run ucx_perftest tag_bw at the same message size and UCX_TLS between the same two hosts, and report the ratio (skipped with a note when ucx_perftest is not installed)")
	fs.StringVar(&f.prompts, "prompts", "1k,4k,16k", "prompt lengths in tokens, comma-separated")
	fs.StringVar(&f.concurrency, "concurrency", "1,16", "requests in flight at once, comma-separated")
	fs.StringVar(&f.latency, "latency", "auto", "the latency rows: a 32-token request and one block's first layer, each at concurrency 1 and 16, p50 and p99 beside the same-run limit (ucx_perftest: one ucp_get or one tagged message of the bytes, the lesser, plus one tag_lat round trip); on, off, or auto: on unless --prompts is given")
	fs.StringVar(&f.sender, "sender", bench.SenderAuto, "when and how the prefill end posts its side of each request: auto (expose for the latency rows where it applies, after elsewhere), after (a Send once the decode end's request reaches it over kvxbench's control connection, whose hop is then on the clock), first (a Send before the decode end's Receive, as a serving stack whose prefill ended before decode asked; the clock runs from the Receive) or expose (an Expose before the Receive, whose params the Receive is given: a one-hop read where the transport can, path rma-one-hop; one prefill rank, host memory)")
	f.set = func(name string) bool {
		given := false
		fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == name })
		return given
	}
	fs.StringVar(&f.slotSize, "slot-size", "4MiB", "staging slot size: the largest message on the wire in staging mode")
	fs.IntVar(&f.pipelineDepth, "pipeline-depth", 4, "staging slots one transfer may hold, so the gather of chunk i+1 overlaps the wire of chunk i and the scatter of chunk i-1 (4: on the pull wire every stage has a slot to spare; docs/benchmarks.md)")
	fs.StringVar(&f.tls, "tls", "", "UCX_TLS for the engine and the baseline, such as shm,self or tcp (default: $UCX_TLS, else UCX's choice)")
	fs.StringVar(&f.memory, "memory", "host", "where the KV pools live: host or device (registered GPU pools, read by gets where UCX can; with --staging, through device staging slots and the CUDA kernels)")
	fs.StringVar(&f.device, "device", "auto", deviceUsage)
	fs.IntVar(&f.prefillTP, "prefill-tp", 1, "prefill tensor parallelism: 2 runs two prefill processes, each holding half the heads, feeding one decode process (TP=1)")
	fs.IntVar(&f.decodeTP, "decode-tp", 1, "decode tensor parallelism: 2 gives the decode process two ranks (two pools of half the heads each, one engine), each reading its half of one prefill pool that holds every head (TP=1->2)")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", 10*time.Second, "how long to wait for the peer to connect or answer")
	fs.StringVar(&f.maxMemory, "max-memory", "auto", "most memory the KV pools of both ends may take together; scenarios that need more are skipped with a note (auto: 45% of RAM)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the random order of each request's blocks in the pool")
	fs.StringVar(&f.directChunk, "direct-chunk", "64MiB", "the largest message of the direct path (no slot bounds it)")
	fs.BoolVar(&f.staging, "staging", false, "force the staging path (gather, wire, scatter through slots); by default the pools are mapped by UCX and transfers take the one-copy direct path")
	fs.StringVar(&f.decodeOrder, "decode-order", "", "the decode pool's order when it differs from --order (layout conversion on the way: block-major, layer-major or layer-major-nhd)")
	fs.IntVar(&f.lanes, "lanes", 0, "UCX workers (each its own thread) the decode end stripes a request's RMA gets over, or, where it reads the prefill pool in place, how many copies of one request run at once; 1 is a single worker; 0: the transport's default (up to 4, at most the cores)")
	fs.IntVar(&f.shmFIFO, "shm-fifo", 0, "messages the receive FIFO of UCX's shared-memory transport holds (ucx.Config.ShmFIFOSize), on both ends: a power of two from 64 to 16384; 0: UCX's 64. Every process that talks to these over shared memory must use the same value")
	fs.StringVar(&f.tcpSegment, "tcp-segment", "0", "largest piece UCX's TCP transport sends in one copy (ucx.Config.TCPSegmentBytes), on both ends: 8KiB to 1MiB; 0: the transport's default (1MiB, which only engines of this build or later take; 64KiB serves any peer)")
	fs.StringVar(&f.rmaMinRegion, "rma-min-region", "", "the smallest mean pool-to-pool range for which the decode end takes RMA gets (transfer.Config.Tuning.RMAMinRegionBytes; default: the engine's)")
	fs.BoolVar(&f.rmaEmulated, "rma-where-emulated", false, "keep the RMA mode where UCX emulates gets (TCP); by default the decode end takes tagged IOV messages there, as the endpoint's lanes say")
	fs.StringVar(&f.callerPages, "caller-pages", "thp", "with --pool caller: thp maps the pools with transparent huge pages (madvise MADV_HUGEPAGE), as a serving process maps a large KV cache; 4k keeps the kernel's base pages")
	fs.StringVar(&f.pool, "pool", "transport", "who maps the host KV pools: transport (ucx.Transport.AllocatePool) or caller (mmap by this process, then ucx.Transport.RegisterHost, as a serving process hands over its own KV cache)")
	fs.BoolVar(&f.noPull, "no-pull", false, "keep the staging path on tagged data messages: the decode end does not read the chunks out of the prefill end's slots with gets (transfer.Config.Tuning.DisablePull)")
	fs.BoolVar(&f.noInPlace, "no-in-place", false, "on the pull wire, read each chunk with a get into a slot even where the decode end maps the prefill end's slots (transfer.Config.Tuning.DisableInPlaceReads; by default the scatter reads them in place)")
	fs.BoolVar(&f.noRMA, "no-rma", false, "keep the direct path on tagged IOV messages: no RMA gets between the pools even where the layouts line up")
	fs.StringVar(&f.clusterKey, "cluster-key", "", "a file of the cluster key (32 random bytes, raw or hex: head -c 32 /dev/urandom >key) both ends' engines hold (transfer.Config.ClusterKeys): hellos sealed, each request's claim proven; the other end must be given the same key (run's peers read this file)")
	fs.StringVar(&f.http, "http", "", "serve /livez, /readyz, /healthz and /metrics (kvxfer_* series) of this process's engine on this address, such as 127.0.0.1:9400 (serve: from the start, before a peer connects)")
}

func (f *transferFlags) resolve(lookupTLS func() string) (bench.RunConfig, error) {
	if err := f.out.check(); err != nil {
		return bench.RunConfig{}, err
	}
	if f.latency != "auto" && f.latency != "on" && f.latency != "off" {
		return bench.RunConfig{}, usagef("--latency %q: choose auto, on or off", f.latency)
	}
	switch f.memory {
	case "host":
	case "device": // registered device pools by gets; --staging keeps to device slots and kernels
	default:
		return bench.RunConfig{}, usagef("--memory %q: choose host or device", f.memory)
	}
	switch {
	case f.pool != "transport" && f.pool != "caller":
		return bench.RunConfig{}, usagef("--pool %q: choose transport or caller", f.pool)
	case f.callerPages != "thp" && f.callerPages != "4k":
		return bench.RunConfig{}, usagef("--caller-pages %q: choose thp or 4k", f.callerPages)
	case f.pool == "caller" && (f.staging || f.memory == "device"):
		return bench.RunConfig{}, usagef("--pool caller registers host pools for the direct path; drop --staging and --memory device")
	}
	switch f.sender {
	case bench.SenderAuto, bench.SenderAfter, bench.SenderFirst:
	case bench.SenderExpose:
		if f.prefillTP != 1 || f.memory != "host" {
			return bench.RunConfig{}, usagef("--sender expose: one prefill rank (--prefill-tp 1) and host memory, as a Receive carries one sender's params")
		}
	default:
		return bench.RunConfig{}, usagef("--sender %q: choose auto, after, first or expose", f.sender)
	}
	if f.connectTimeout <= 0 {
		return bench.RunConfig{}, usagef("--connect-timeout = %v: must be positive", f.connectTimeout)
	}
	if f.lanes < 0 || f.lanes > native.MaxLanes {
		return bench.RunConfig{}, usagef("--lanes = %d: must be between 0 (the default) and %d", f.lanes, native.MaxLanes)
	}
	tcpSegment, err := parseBytes("tcp-segment", f.tcpSegment)
	if err != nil {
		return bench.RunConfig{}, err
	}
	if tcpSegment != 0 && (tcpSegment < 8<<10 || tcpSegment > native.TCPReceiveSegmentBytes) {
		return bench.RunConfig{}, usagef("--tcp-segment = %d: must be 0 (the default) or between 8KiB and 1MiB", tcpSegment)
	}
	var rmaMinRegion int64
	if f.rmaMinRegion != "" {
		if rmaMinRegion, err = parseBytes("rma-min-region", f.rmaMinRegion); err != nil {
			return bench.RunConfig{}, err
		}
		if rmaMinRegion <= 0 {
			return bench.RunConfig{}, usagef("--rma-min-region = %d: must be positive", rmaMinRegion)
		}
	}
	if s := f.shmFIFO; s != 0 && (s < 64 || s > 16384 || s&(s-1) != 0) {
		return bench.RunConfig{}, usagef("--shm-fifo = %d: must be 0 (the default) or a power of two from 64 to 16384", s)
	}
	if f.pipelineDepth <= 0 {
		return bench.RunConfig{}, usagef("--pipeline-depth = %d: must be positive", f.pipelineDepth)
	}
	if f.prefillTP != 1 && f.prefillTP != 2 {
		return bench.RunConfig{}, usagef("--prefill-tp = %d: 1 (same TP on both ends) or 2 (two prefill ranks feed one decode rank)", f.prefillTP)
	}
	switch {
	case f.decodeTP != 1 && f.decodeTP != 2:
		return bench.RunConfig{}, usagef("--decode-tp = %d: 1 (same TP on both ends) or 2 (one prefill rank feeds two decode ranks)", f.decodeTP)
	case f.decodeTP > 1 && f.prefillTP > 1:
		return bench.RunConfig{}, usagef("--decode-tp %d with --prefill-tp %d: one end has TP 1 (the same TP on both ends is --prefill-tp 1)", f.decodeTP, f.prefillTP)
	case f.decodeTP > 1 && f.memory != "host":
		return bench.RunConfig{}, usagef("--decode-tp %d: host memory only", f.decodeTP)
	}
	s, err := f.layout.shape()
	if err != nil {
		return bench.RunConfig{}, err
	}
	prompts, err := parseTokens("prompts", f.prompts)
	if err != nil {
		return bench.RunConfig{}, err
	}
	conc, err := parseInts("concurrency", f.concurrency)
	if err != nil {
		return bench.RunConfig{}, err
	}
	slot, err := parseBytes("slot-size", f.slotSize)
	if err != nil {
		return bench.RunConfig{}, err
	}
	if slot < 4096 {
		return bench.RunConfig{}, usagef("--slot-size = %d: must be at least 4KiB", slot)
	}
	directChunk, err := parseBytes("direct-chunk", f.directChunk)
	if err != nil {
		return bench.RunConfig{}, err
	}
	if directChunk < 4096 {
		return bench.RunConfig{}, usagef("--direct-chunk = %d: must be at least 4KiB", directChunk)
	}
	memCap, err := f.memoryCap()
	if err != nil {
		return bench.RunConfig{}, err
	}
	prefill, decode, err := bench.SizePools(s, prompts, conc, f.prefillTP, f.decodeTP, memCap, f.layout.poolBlocks, f.latencyOn())
	if err == nil && f.decodeOrder != "" {
		o, perr := parseOrder(f.decodeOrder)
		if perr != nil {
			return bench.RunConfig{}, usagef("--decode-order %q: choose block-major, layer-major or layer-major-nhd", f.decodeOrder)
		}
		decode = layout.Packed(decode.Dims(), o) // a block's bytes are the same in every order
	}
	if err != nil {
		return bench.RunConfig{}, err
	}
	tls := f.tls
	if tls == "" {
		tls = lookupTLS()
	}
	var clusterKey []byte
	if f.clusterKey != "" {
		if clusterKey, err = bench.ReadClusterKey(f.clusterKey); err != nil {
			return bench.RunConfig{}, err
		}
	}
	return bench.RunConfig{
		ShapeName: s.Name, MemCap: memCap, Dims: s.Dims, Order: s.Order, Decode: decode, Prefill: prefill,
		Prompts: prompts, Concurrency: conc, SlotBytes: slot, PipelineDepth: f.pipelineDepth,
		TLS: tls, PrefillTP: f.prefillTP, DecodeTP: f.decodeTP, Duration: f.out.Duration, MaxIters: f.out.MaxIters,
		Verify: !f.out.NoVerify, ConnectTimeout: f.connectTimeout, Seed: f.seed, HTTP: f.http,
		Staging: f.staging, DirectChunkBytes: directChunk, NoRMA: f.noRMA, NoPull: f.noPull, NoInPlace: f.noInPlace, RMAWhereEmulated: f.rmaEmulated, RMAMinRegionBytes: rmaMinRegion, Lanes: f.lanes, TCPSegmentBytes: tcpSegment, ShmFIFOSize: f.shmFIFO, Memory: f.memory,
		Pool: f.pool, CallerPages: f.callerPages, Latency: f.latencyOn(), Sender: f.sender, ClusterKeyFile: f.clusterKey, ClusterKey: clusterKey,
	}, nil
}

// latencyOn reads --latency: auto runs the latency rows with the default prompts only, so a
// run that names its prompts measures those alone.
func (f *transferFlags) latencyOn() bool {
	switch f.latency {
	case "on":
		return true
	case "auto":
		return f.set == nil || !f.set("prompts")
	}
	return false
}

// resolveDevice is resolve with $UCX_TLS and, for --memory device, the GPU chosen (--device);
// the note, if any, is for stderr once the device has opened.
func (f *transferFlags) resolveDevice() (cfg bench.RunConfig, note string, err error) {
	if cfg, err = f.resolve(envTLS); err != nil || cfg.Memory != "device" {
		return cfg, "", err
	}
	cfg.Device, cfg.GPU, note, err = chooseDevice(f.device)
	return cfg, note, err
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
