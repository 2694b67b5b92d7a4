// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Fault names one kind of injected fault. Each can be switched off on its own.
type Fault string

// The faults the soak injects.
const (
	// FaultCancel: a cancel storm; CancelFraction of requests are cancelled at a random point,
	// on the sending or the receiving side.
	FaultCancel Fault = "cancel"
	// FaultDeadline: DeadlineFraction of requests get a deadline of a few milliseconds, which
	// many of them miss.
	FaultDeadline Fault = "deadline"
	// FaultHang: a chunk stays on the wire forever (until the engine force-closes), so its
	// transfer is quarantined and its slots poisoned.
	FaultHang Fault = "hang"
	// FaultLate: a chunk ignores its cancel and completes after its transfer's deadline, so the
	// quarantine ends with a release, not a poison.
	FaultLate Fault = "late"
	// FaultNeverQuiesce: a chunk, once cancelled, never says whether it let go of its memory.
	FaultNeverQuiesce Fault = "never-quiesce"
	// FaultFreeze: the decode peer is frozen (every message to or from it held, as SIGSTOP
	// would) for FreezeFor, then thawed.
	FaultFreeze Fault = "freeze"
	// FaultLostPeer: a prefill peer is cut off for good (as SIGKILL would) and started again
	// under a new name.
	FaultLostPeer Fault = "lost-peer"
	// FaultPartition (--processes only): a prefill and a decode peer process in two network
	// namespaces joined by a veth pair, over UCX TCP; the link is cut and restored, then made
	// lossy: nftables drops LossPercent of the packets at random and a tbf qdisc limits the
	// rate to 1 Gbit/s, while requests keep flowing. Skipped, loudly, where network
	// namespaces (or nft, or tc) are not to be had.
	FaultPartition Fault = "partition"
	// FaultRestart: rolling restarts under load. In-process, a prefill engine still
	// connected is replaced by a new one, drained for DrainFor (every other time not at all)
	// and closed with what is in flight. With processes, each side in turn: a
	// prefill process gets SIGTERM, drains for DrainFor, closes its engine with whatever is
	// still in flight and exits; its next incarnation publishes itself in a discovery registry,
	// where the soak finds its address. Decode, in this process, is drained for DrainFor,
	// closed under load, and replaced by a new engine on a new UCX worker whose address the
	// peers are told. Every exit must be clean (a crash is a breach) and every pool accounted.
	FaultRestart Fault = "restart"
	// FaultDeadPeer (--processes only, with lost-peer): once decode has heard that a killed
	// prefill process is lost, a request to it must fail within DeadPeerBound.
	FaultDeadPeer Fault = "dead-peer"
	// FaultFreezePaths (--processes only, with freeze): each freeze first pins every new
	// request to one path of the mix (in turn, a different one each cycle) and waits for the
	// others to end, so the peers are stopped with only that path in flight; decode must turn
	// unhealthy within ProgressDeadline + FrozenSeenSlack.
	FaultFreezePaths Fault = "freeze-paths"
	// FaultHostile (--processes only): beside the soak, for its traffic phase, a lying peer
	// process on the same host attacks an engine of this process (internal/hostile): every
	// forgery must be refused and counted and no canary byte may change. It needs the
	// hostilepeer binary ($KVX_HOSTILEPEER_BIN, or next to this executable).
	FaultHostile Fault = "hostile"
	// FaultHungPeer (--processes only): once a cycle one prefill process (in turn) is stopped
	// with SIGSTOP past decode's TransferTimeout and cancel grace, so decode's transfers with it
	// pass their deadline and quarantine, then killed with SIGKILL before their quarantine can
	// run out (as a supervisor kills a hung pod) and started again. Decode must end every one
	// of its handles with that peer within the loss bound after the kill, and poison nothing
	// of theirs once it heard the peer was lost.
	FaultHungPeer Fault = "hung-peer"
)

// AllFaults lists every fault, in the order the report prints them.
var AllFaults = []Fault{FaultCancel, FaultDeadline, FaultHang, FaultLate, FaultNeverQuiesce, FaultFreeze, FaultLostPeer, FaultPartition,
	FaultRestart, FaultDeadPeer, FaultFreezePaths, FaultHostile, FaultHungPeer}

// memFaults are the faults the in-process soak (Run) injects.
var memFaults = []Fault{FaultCancel, FaultDeadline, FaultHang, FaultLate, FaultNeverQuiesce, FaultFreeze, FaultLostPeer, FaultRestart}

// Route is one way the peer-process soak moves a request between the processes: which
// prefill process sends it (the serving default, or one with the pull wire and the RMA mode
// off) and which pools both sides use (Go memory, or pools registered with UCX).
type Route string

// The routes of the peer-process soak's mix.
const (
	// RouteStaging: Go memory on both sides, the plain prefill process: staging slots and
	// tagged data messages.
	RouteStaging Route = "staging"
	// RoutePull: Go memory on both sides, the default prefill process: the staging path's pull
	// wire (the receiver reads the sender's slots).
	RoutePull Route = "pull"
	// RouteDirect: registered pools on both sides, the plain prefill process: the one-copy
	// path's IOV messages.
	RouteDirect Route = "direct"
	// RouteRMA: registered pools (the sender's allocated by UCX), the default prefill process:
	// RMA gets (read in place over shared memory).
	RouteRMA Route = "rma"
	// RouteCMA: as RouteRMA, but the sender's pool is its own mmap registered with UCX
	// (RegisterHost): over shared memory decode reads it with process_vm_readv.
	RouteCMA Route = "cma"
	// RouteRMASend: the other way, decode sends to the default prefill process, which reads
	// decode's registered pool with RMA gets into a UCX-allocated one of its own and checks
	// the bytes: decode is then the RMA sender whose exposed pool waits on its peer.
	RouteRMASend Route = "rma-send"
)

// AllRoutes lists every route of the mix.
var AllRoutes = []Route{RouteStaging, RoutePull, RouteDirect, RouteRMA, RouteCMA, RouteRMASend}

// ParseRoutes reads a comma-separated list of routes ("all" for every one).
func ParseRoutes(s string) ([]Route, error) {
	s = strings.TrimSpace(s)
	if s == "all" || s == "" {
		return slices.Clone(AllRoutes), nil
	}
	var out []Route
	for _, name := range strings.Split(s, ",") {
		r := Route(strings.TrimSpace(name))
		if !slices.Contains(AllRoutes, r) {
			return nil, &ConfigError{Field: "Routes", Value: name, Reason: fmt.Sprintf("unknown route; known: %v", AllRoutes)}
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// only keeps the faults of fs that are also in allowed, in order.
func only(fs, allowed []Fault) []Fault {
	var out []Fault
	for _, f := range fs {
		if slices.Contains(allowed, f) {
			out = append(out, f)
		}
	}
	return out
}

// ParseFaults reads a comma-separated list of fault names ("all" for every one, "none" or
// the empty string for none).
func ParseFaults(s string) ([]Fault, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "all":
		return slices.Clone(AllFaults), nil
	case "", "none":
		return nil, nil
	}
	var out []Fault
	for _, name := range strings.Split(s, ",") {
		f := Fault(strings.TrimSpace(name))
		if !slices.Contains(AllFaults, f) {
			return nil, &ConfigError{Field: "Faults", Value: name, Reason: fmt.Sprintf("unknown fault; known: %v", AllFaults)}
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out, nil
}

// Config tunes a soak. Zero values take the defaults documented on each field; Run validates
// the result once and names the first field that cannot work.
type Config struct {
	// Duration is how long new requests are started; the drain follows. Default 60s.
	Duration time.Duration
	// Concurrency is the number of requests in progress at once. Default 256.
	Concurrency int
	// LargeFraction of requests are larger than one staging slot, so they stream through it
	// chunk by chunk. Default 0.2.
	LargeFraction float64
	// TPFraction of requests are received from two TP=2 prefill ranks at once (Spec.Subs).
	// Default 0.25.
	TPFraction float64
	// CancelFraction of requests are cancelled at a random point when FaultCancel is on.
	// Default 0.3.
	CancelFraction float64
	// DeadlineFraction of requests get a deadline of 1 to 20 ms when FaultDeadline is on.
	// Default 0.1.
	DeadlineFraction float64
	// DirectFraction of the in-process soak's requests name their pools to the transport, so
	// they take the one-copy path (RMA gets where whole blocks line up, IOV messages for the
	// TP=2 halves) instead of staging slots. Default 0.25. The peer-process soak draws a
	// route per request instead (Routes).
	DirectFraction float64
	// NoDirect sends every request by staging (DirectFraction is then ignored).
	NoDirect bool
	// Routes is the peer-process soak's mix: each request takes one of them at random.
	// Default (nil): AllRoutes.
	Routes []Route
	// DecodeDisablesPull sets Config.Tuning.DisablePull on the peer-process soak's decode engine, so
	// it never asks for the pull wire and the staging route's prefill process never declines
	// one: plain tagged data messages on both sides (the pull route then stages the same way).
	DecodeDisablesPull bool
	// DrainFor is the deadline of the Drain a restarted engine gets before its Close (fault
	// restart): shorter than TransferTimeout, so Close meets transfers still in flight.
	// Default 1s.
	DrainFor time.Duration
	// DeadPeerBound is how long a request to a peer decode knows is dead may take to fail
	// (fault dead-peer). Default 1s.
	DeadPeerBound time.Duration
	// FrozenSeenSlack is how long after ProgressDeadline a frozen peer on one path must be
	// seen (fault freeze-paths). Default 1s.
	FrozenSeenSlack time.Duration
	// LossPercent is the share of packets the lossy link drops at random (fault partition).
	// Default 3; at most 50.
	LossPercent int
	// HungPeerFirst is the prefill process the first cycle's hung peer stops (fault hung-peer):
	// 0 (the default) or 1; later cycles take the other in turn. Prefill 1 is the direct
	// route's TP=1 sender, so 1 puts the direct path's receives in the first hang.
	HungPeerFirst int
	// Faults lists the faults to inject. Default (nil): AllFaults. Use NoFaults for none.
	Faults []Fault
	// NoFaults turns every fault off (Faults is then ignored).
	NoFaults bool
	// Seed makes the run's random choices repeatable. Default 1.
	Seed uint64
	// SlotBytes is each engine's staging slot size. Default 64 KiB + the chunk header.
	SlotBytes int64
	// MaxConcurrent is each engine's Config.MaxConcurrent. Default 64.
	MaxConcurrent int
	// TransferTimeout is the deadline of a request without a tight one. Default 3s.
	TransferTimeout time.Duration
	// QueueTimeout is each engine's Config.QueueTimeout. Default 3s.
	QueueTimeout time.Duration
	// ProgressDeadline is each engine's Config.ProgressDeadline. Default 2s.
	ProgressDeadline time.Duration
	// QuarantineTimeout is each engine's Config.Tuning.QuarantineTimeout. Default 4s.
	QuarantineTimeout time.Duration
	// FreezeFor is how long the frozen peer stays frozen. Default 4s; it must exceed
	// ProgressDeadline so health has a stall to see.
	FreezeFor time.Duration
	// Grace is the slack on every bound the checker enforces: scheduling on a loaded host,
	// the race detector, the garbage collector. Default 2s.
	Grace time.Duration
	// RecoveryBound: health must be back within this long after a frozen or lost peer is
	// back. Default 10s.
	RecoveryBound time.Duration
	// MaxHeapBytes bounds the live Go heap (reachable after a collection) during the run.
	// Default 2 GiB.
	MaxHeapBytes uint64
	// Logger receives the soak's events (faults, breaches). Default zap.NewNop().
	Logger *zap.Logger
	// EngineLogger is handed to every engine. Default zap.NewNop().
	EngineLogger *zap.Logger
}

// Defaults of Config.
const (
	DefaultDuration          = 60 * time.Second
	DefaultConcurrency       = 256
	DefaultLargeFraction     = 0.2
	DefaultTPFraction        = 0.25
	DefaultCancelFraction    = 0.3
	DefaultDeadlineFraction  = 0.1
	DefaultDirectFraction    = 0.25
	DefaultSeed              = 1
	DefaultSlotBytes         = 64<<10 + 64
	DefaultMaxConcurrent     = 64
	DefaultTransferTimeout   = 3 * time.Second
	DefaultQueueTimeout      = 3 * time.Second
	DefaultProgressDeadline  = 2 * time.Second
	DefaultQuarantineTimeout = 4 * time.Second
	DefaultFreezeFor         = 4 * time.Second
	DefaultGrace             = 2 * time.Second
	DefaultRecoveryBound     = 10 * time.Second
	DefaultMaxHeapBytes      = 2 << 30
	DefaultDrainFor          = time.Second
	DefaultDeadPeerBound     = time.Second
	DefaultFrozenSeenSlack   = time.Second
	DefaultLossPercent       = 3
)

func (c Config) withDefaults() Config {
	dur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	frac := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	dur(&c.Duration, DefaultDuration)
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	frac(&c.LargeFraction, DefaultLargeFraction)
	frac(&c.TPFraction, DefaultTPFraction)
	frac(&c.CancelFraction, DefaultCancelFraction)
	frac(&c.DeadlineFraction, DefaultDeadlineFraction)
	frac(&c.DirectFraction, DefaultDirectFraction)
	if c.NoDirect {
		c.DirectFraction = 0
	}
	switch {
	case c.NoFaults:
		c.Faults = nil
	case c.Faults == nil:
		c.Faults = slices.Clone(AllFaults)
	}
	if c.Seed == 0 {
		c.Seed = DefaultSeed
	}
	if c.SlotBytes == 0 {
		c.SlotBytes = DefaultSlotBytes
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	dur(&c.TransferTimeout, DefaultTransferTimeout)
	dur(&c.QueueTimeout, DefaultQueueTimeout)
	dur(&c.ProgressDeadline, DefaultProgressDeadline)
	dur(&c.QuarantineTimeout, DefaultQuarantineTimeout)
	dur(&c.FreezeFor, DefaultFreezeFor)
	dur(&c.Grace, DefaultGrace)
	dur(&c.RecoveryBound, DefaultRecoveryBound)
	if c.MaxHeapBytes == 0 {
		c.MaxHeapBytes = DefaultMaxHeapBytes
	}
	if c.Routes == nil {
		c.Routes = slices.Clone(AllRoutes)
	}
	dur(&c.DrainFor, DefaultDrainFor)
	dur(&c.DeadPeerBound, DefaultDeadPeerBound)
	dur(&c.FrozenSeenSlack, DefaultFrozenSeenSlack)
	if c.LossPercent == 0 {
		c.LossPercent = DefaultLossPercent
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.EngineLogger == nil {
		c.EngineLogger = zap.NewNop()
	}
	return c
}

func (c Config) validate() error {
	bad := func(field string, v any, reason string) error {
		return &ConfigError{Field: field, Value: v, Reason: reason}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"LargeFraction", c.LargeFraction}, {"TPFraction", c.TPFraction}, {"CancelFraction", c.CancelFraction}, {"DeadlineFraction", c.DeadlineFraction},
		{"DirectFraction", c.DirectFraction}} {
		if f.v < 0 || f.v > 1 {
			return bad(f.name, f.v, "must be between 0 and 1")
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Duration", c.Duration}, {"TransferTimeout", c.TransferTimeout}, {"QueueTimeout", c.QueueTimeout},
		{"ProgressDeadline", c.ProgressDeadline}, {"QuarantineTimeout", c.QuarantineTimeout}, {"FreezeFor", c.FreezeFor},
		{"Grace", c.Grace}, {"RecoveryBound", c.RecoveryBound}, {"DrainFor", c.DrainFor}, {"DeadPeerBound", c.DeadPeerBound},
		{"FrozenSeenSlack", c.FrozenSeenSlack}} {
		if d.v < 0 {
			return bad(d.name, d.v, "must be positive")
		}
	}
	switch {
	case c.Concurrency < 1 || c.Concurrency > 1<<16:
		return bad("Concurrency", c.Concurrency, "must be between 1 and 65536")
	case c.SlotBytes < 4<<10+64:
		return bad("SlotBytes", c.SlotBytes, "must hold at least 4 KiB of KV plus the chunk header")
	case c.MaxConcurrent < 1:
		return bad("MaxConcurrent", c.MaxConcurrent, "must be at least 1")
	case c.has(FaultFreeze) && c.FreezeFor <= c.ProgressDeadline:
		return bad("FreezeFor", c.FreezeFor, fmt.Sprintf("must exceed ProgressDeadline (%v), or health has no stall to report", c.ProgressDeadline))
	case c.Duration < 2*time.Second:
		return bad("Duration", c.Duration, "must be at least 2s")
	case c.LossPercent < 0 || c.LossPercent > 50:
		return bad("LossPercent", c.LossPercent, "must be between 1 and 50")
	case c.HungPeerFirst < 0 || c.HungPeerFirst > 1:
		return bad("HungPeerFirst", c.HungPeerFirst, "must be 0 or 1 (a prefill process)")
	case len(c.Routes) == 0:
		return bad("Routes", c.Routes, "needs at least one route")
	case c.has(FaultDeadPeer) && !c.has(FaultLostPeer):
		return bad("Faults", c.Faults, "dead-peer needs lost-peer (it times requests to the peer lost-peer kills)")
	case c.has(FaultFreezePaths) && !c.has(FaultFreeze):
		return bad("Faults", c.Faults, "freeze-paths needs freeze (it pins a path for each freeze)")
	}
	return nil
}

func (c Config) has(f Fault) bool { return slices.Contains(c.Faults, f) }
