// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"time"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
)

// errEngineMissing is what the transfer subcommands return after their set-up and handshake
// in a build without the engine's UCX transport (built without cgo): the flags, the peers and
// the control connection work; there is no transfer to measure.
var errEngineMissing = errors.New("the transfer engine's UCX transport is not in this build of kvxbench (it needs cgo: build with CGO_ENABLED=1); `kvxbench gather` measures the host gather and scatter alone")

// The --sender flows: when and how a prefill end posts its side of a request.
const (
	// SenderAfter posts the Send when the decode end's request reaches the prefill end over
	// the control connection, after the Receive: that hop is on the request's clock.
	SenderAfter = "after"
	// SenderFirst posts the Send (naming the decode end) before the Receive, as a serving
	// stack whose prefill ended before decode asked: the clock runs from the Receive.
	SenderFirst = "first"
	// SenderExpose posts an Expose before the Receive and hands its params to it (over the
	// control connection, as a serving stack's control plane would): the Receive reads the
	// prefill pool at once where the params carry a one-hop read's section
	// (docs/protocol.md, "One-hop reads"). One prefill rank only.
	SenderExpose = "expose"
	// SenderAuto (the default) takes SenderExpose for the latency rows where it applies (one
	// prefill rank, host memory, an engine that can expose) and SenderAfter elsewhere.
	SenderAuto = "auto"
)

// RunConfig is a validated transfer run. It is also what the parent hands its peer
// processes, as JSON, so both ends build the same pools and requests.
type RunConfig struct {
	ShapeName   string        `json:"shape_name"`
	MemCap      int64         `json:"mem_cap"`
	Dims        layout.Dims   `json:"dims"`
	Order       layout.Order  `json:"order"`
	Decode      layout.Layout `json:"decode"`  // each decode rank's pool (TP=1 when prefill TP is 2)
	Prefill     layout.Layout `json:"prefill"` // each prefill rank's pool
	Prompts     []int64       `json:"prompts"`
	Concurrency []int         `json:"concurrency"`
	// Latency adds the latency rows (latencyScenarios: a 32-token request and one block's
	// layer, each at concurrency 1 and 16) beside their same-run limit (--latency).
	Latency bool `json:"latency,omitempty"`
	// Sender is when and how each prefill end posts its side of a request (--sender):
	// SenderAfter, SenderFirst, SenderExpose or SenderAuto ("" is SenderAfter).
	Sender        string `json:"sender,omitempty"`
	SlotBytes     int64  `json:"slot_bytes"`
	PipelineDepth int    `json:"pipeline_depth"`
	TLS           string `json:"tls"`
	PrefillTP     int    `json:"prefill_tp"`
	// DecodeTP is how many decode ranks the run's process holds (--decode-tp; 0 or 1: one):
	// with 2, one prefill rank (all the heads) feeds two decode pools of half the heads each,
	// one Receive per rank and request (TP=1->2).
	DecodeTP       int           `json:"decode_tp,omitempty"`
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
	// NoPull keeps the staging path on tagged data messages (--no-pull); by default the decode
	// end reads each chunk out of the prefill end's slot with a get where gets are one copy.
	NoPull bool `json:"no_pull,omitempty"`
	// NoInPlace reads each pulled chunk with a get into a slot even where the decode end maps the
	// prefill end's slots (--no-in-place: transfer.Config.Tuning.DisableInPlaceReads).
	NoInPlace bool `json:"no_in_place,omitempty"`
	// RMAWhereEmulated keeps the RMA mode where UCX emulates gets (--rma-where-emulated).
	RMAWhereEmulated bool `json:"rma_where_emulated"`
	// RMAMinRegionBytes is transfer.Config.Tuning.RMAMinRegionBytes (--rma-min-region); 0: the engine's.
	RMAMinRegionBytes int64 `json:"rma_min_region_bytes,omitempty"`
	// Lanes is ucx.Config.Lanes of both ends (--lanes; 0: the transport's default).
	Lanes int `json:"lanes"`
	// TCPSegmentBytes is ucx.Config.TCPSegmentBytes of both ends (--tcp-segment; 0: the
	// transport's default).
	TCPSegmentBytes int64 `json:"tcp_segment_bytes,omitempty"`
	// ShmFIFOSize is ucx.Config.ShmFIFOSize of both ends (--shm-fifo; 0: UCX's 64).
	ShmFIFOSize int `json:"shm_fifo_size,omitempty"`
	// Pool is who maps the host pools for the direct path (--pool): "transport"
	// (AllocatePool) or "caller" (mmap, then RegisterHost).
	Pool string `json:"pool"`
	// CallerPages is the page size of caller pools (--caller-pages): "thp" asks for
	// transparent huge pages (madvise MADV_HUGEPAGE), as a serving process maps a large KV
	// cache; "4k" leaves the kernel's base pages.
	CallerPages string `json:"caller_pages,omitempty"`
	// Memory is where the KV pools and staging slots live: "host" or "device" (--memory;
	// device_engine.go).
	Memory string `json:"memory"`
	// Device is the CUDA ordinal of a device run (--device; ChooseDevice), on both ends.
	Device int `json:"device"`
	// GPU describes that device as NVML reports it, for the results; nil where NVML could
	// not be asked.
	GPU *GPU `json:"gpu,omitempty"`
	// ClusterKeyFile names the file of the cluster key both ends' engines hold
	// (transfer.Config.ClusterKeys; --cluster-key); the peer reads it from the same path.
	// ClusterKey is its content, never handed to peers on their command line.
	ClusterKeyFile string `json:"cluster_key_file,omitempty"`
	ClusterKey     []byte `json:"-"`
	// HTTP is where this process serves its probes and /metrics; never handed to peers, which
	// would all try to listen on it.
	HTTP string `json:"-"`
	// HopsDir, when set (Hops), turns on the hop stamps (internal/hopstamp) in both ends:
	// each prefill rank writes its stamps to hopsFile(HopsDir, rank) when the decode end says
	// bye, and the decode end prints each row's per-hop medians (hops.go).
	HopsDir string `json:"hops_dir,omitempty"`
	// Hops asks Loopback for the hop stamps (--hops): it makes HopsDir.
	Hops bool `json:"-"`
	// HopsRaw, with Hops, is a file the decode end writes every stamp of both ends to, with
	// each timed row's request ids (--hops-raw; hops.go's rawHops).
	HopsRaw string `json:"-"`
	// processHTTP is the endpoint serve opened at start on HTTP, for its engine to report
	// through once made; nil: the engine opens its own.
	processHTTP *observability
}

// SizePools sizes the pools of a run. Prefill requests only read their blocks, so requests in
// flight share one set: each prefill rank's pool holds the largest prompt plus a quarter (so a
// request's blocks are scattered). Decode requests in flight write distinct blocks and are
// checked afterwards, so the decode pool holds concurrency times the prompt, for the largest
// scenario that fits in memCap with the prefill pools (poolBlocks, when set, overrides); with
// latency, also for the latency rows (latencyScenarios). decode is one decode rank's pool: with
// decodeTP ranks, each holds its share of the heads.
func SizePools(s Shape, prompts []int64, conc []int, prefillTP, decodeTP int, memCap, poolBlocks int64, latency bool) (prefill, decode layout.Layout, err error) {
	if s.Dims.NumHeads%int64(prefillTP) != 0 {
		return prefill, decode, Usagef("--prefill-tp %d: the pool's %d heads do not split evenly", prefillTP, s.Dims.NumHeads)
	}
	decodeTP = max(decodeTP, 1)
	if s.Dims.NumHeads%int64(decodeTP) != 0 {
		return prefill, decode, Usagef("--decode-tp %d: the pool's %d heads do not split evenly", decodeTP, s.Dims.NumHeads)
	}
	most := MostBlocks(s, prompts)
	pd := s.Dims
	pd.NumHeads /= int64(prefillTP)
	pd.NumBlocks = most + most/4 + 1
	prefill = layout.Packed(pd, s.Order)
	if err := prefill.Validate(); err != nil {
		return prefill, decode, LayoutUsageError(err)
	}
	one := s.Dims
	one.NumBlocks = 1
	blockBytes := layout.Packed(one, s.Order).BlockBytes()
	room := (memCap - int64(prefillTP)*prefill.SpanBytes()) / blockBytes
	var need int64
	for _, t := range prompts {
		for _, c := range conc {
			if n := blocksFor(s, t) * int64(c); n <= room {
				need = max(need, n)
			}
		}
	}
	if latency {
		for _, l := range latencyScenarios(s.Dims) {
			if n := blocksFor(s, l.tokens) * int64(l.concurrency); n <= room {
				need = max(need, n)
			}
		}
	}
	if need == 0 {
		return prefill, decode, Usagef("--max-memory %s: no scenario fits; the smallest needs %s of pools",
			humanBytes(memCap), humanBytes(int64(prefillTP)*prefill.SpanBytes()+blocksFor(s, prompts[0])*blockBytes))
	}
	numBlocks := need + min(need/4+1, room-need)
	if poolBlocks != 0 {
		if poolBlocks < need {
			return prefill, decode, Usagef("--pool-blocks = %d: the run needs at least %d blocks", poolBlocks, need)
		}
		numBlocks = poolBlocks
	}
	dd := s.Dims
	dd.NumBlocks = numBlocks
	dd.NumHeads /= int64(decodeTP) // each decode rank's pool: room counted every rank's share
	decode = layout.Packed(dd, s.Order)
	if err := decode.Validate(); err != nil {
		return prefill, decode, LayoutUsageError(err)
	}
	return prefill, decode, nil
}

// poolBytes is the memory the run's pools take on this host, both ends together.
func (c RunConfig) poolBytes() int64 {
	return int64(c.decodeRanks())*c.Decode.SpanBytes() + int64(c.PrefillTP)*c.Prefill.SpanBytes()
}

// decodeRanks is how many decode ranks (pools, and Receives per request) the decode end holds.
func (c RunConfig) decodeRanks() int { return max(c.DecodeTP, 1) }

func (c RunConfig) encode() (string, error) {
	b, err := json.Marshal(c)
	return string(b), err
}

func decodeRunConfig(s string) (RunConfig, error) {
	var c RunConfig
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return c, Usagef("peer --config: %v", err)
	}
	if err := c.Decode.Validate(); err != nil {
		return c, Usagef("peer --config: decode layout: %v", err)
	}
	if err := c.Prefill.Validate(); err != nil {
		return c, Usagef("peer --config: prefill layout: %v", err)
	}
	if c.ClusterKeyFile != "" {
		var err error
		if c.ClusterKey, err = ReadClusterKey(c.ClusterKeyFile); err != nil {
			return c, err
		}
	}
	return c, nil
}

// ReadClusterKey reads a cluster key file (--cluster-key): transfer.ClusterKeyBytes random
// bytes, raw or as hex (surrounding white space ignored), such as `head -c 32 /dev/urandom`
// or `openssl rand -hex 32` write.
func ReadClusterKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, Usagef("--cluster-key: %v", err)
	}
	if len(b) == transfer.ClusterKeyBytes {
		return b, nil
	}
	t := bytes.TrimSpace(b)
	if len(t) == 2*transfer.ClusterKeyBytes {
		if k, err := hex.DecodeString(string(t)); err == nil {
			return k, nil
		}
	}
	return nil, Usagef("--cluster-key %s: want %d random bytes, raw or as %d hex digits; it holds %d bytes", path, transfer.ClusterKeyBytes, 2*transfer.ClusterKeyBytes, len(b))
}

// keyID names the run's cluster key in the control hello, so two ends with different keys (or
// one without) are refused at the hello instead of waiting out their transfers' queued
// deadline; "" without a key. It is a hash: the key itself never crosses the control
// connection.
func (c RunConfig) keyID() string {
	if len(c.ClusterKey) == 0 {
		return ""
	}
	h := sha256.Sum256(append([]byte("kvxbench cluster key id\x00"), c.ClusterKey...))
	return hex.EncodeToString(h[:8])
}
