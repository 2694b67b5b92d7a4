// SPDX-License-Identifier: Apache-2.0

package streambench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/transferdefaults"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// Transports named by Config.Transport.
const (
	// TransportMem is the in-process transport: it measures the engine, not a wire.
	TransportMem = "mem"
	// TransportUCX is two UCX workers in this process, over Config.UCXTLS.
	TransportUCX = "ucx"
)

// Llama3_8B is the KV shape of Llama-3-8B (32 layers, 8 KV heads of 128 BF16 elements, K and
// V), in 16-token blocks; NumBlocks is set from Config.Tokens.
var Llama3_8B = layout.Dims{NumLayers: 32, KVFactor: 2, NumHeads: 8, HeadDim: 128, ElemSize: 2, TokensPerBlock: 16}

// Config describes one measurement. Zero values take the defaults given on each field.
type Config struct {
	// Dims is the model's KV shape; NumBlocks is ignored. Default Llama3_8B.
	Dims layout.Dims
	// Tokens is the request's length, rounded up to whole blocks. Default 4096.
	Tokens int
	// LayerCompute is the simulated compute time of one layer. Default: the plain transfer
	// time divided by the layer count, measured first in the same run, so compute and wire
	// are balanced (the case the issue sets).
	LayerCompute time.Duration
	// BusyCompute spins the CPU through each compute step instead of sleeping. A GPU's
	// prefill costs the host no CPU, so sleeping is the faithful default; spinning shows what
	// happens on a host that is busy too.
	BusyCompute bool
	// Runs is how many plain and streamed transfers are measured; the medians are reported.
	// Default 3.
	Runs int
	// Timeout bounds each transfer (and its wait). Default 60s.
	Timeout time.Duration
	// Transport is TransportMem (default) or TransportUCX.
	Transport string
	// UCXTLS is UCX_TLS for TransportUCX. Default "posix,cma,self" (shared memory).
	UCXTLS string
	// Engine configures both engines (SlotBytes, PipelineDepth, ...); Logger defaults to
	// zap.NewNop().
	Engine transfer.Config
}

// Result is one measurement; the JSON names are the ones `kvxbench run --stream --json`
// prints.
type Result struct {
	// ExposedUS is the median time from the last layer marked ready to the transfer
	// complete on the receiver, in microseconds.
	ExposedUS float64 `json:"exposed_us"`
	// PlainUS is the median time of the same request sent with every layer ready up front.
	PlainUS float64 `json:"plain_us"`
	// ExposedRatio is ExposedUS / PlainUS: the share of the transfer prefill did not hide.
	ExposedRatio float64 `json:"exposed_ratio"`
	// StreamUS is the median time from the streamed transfer's start to its completion,
	// compute included.
	StreamUS float64 `json:"stream_us"`
	// LayerComputeUS is the compute step per layer used.
	LayerComputeUS float64 `json:"layer_compute_us"`
	// Bytes is the request's KV bytes; Layers and Tokens its shape.
	Bytes     int64  `json:"bytes"`
	Layers    int64  `json:"layers"`
	Tokens    int    `json:"tokens"`
	Runs      int    `json:"runs"`
	Transport string `json:"transport"`
	Compute   string `json:"compute"`
}

func (c Config) withDefaults() Config {
	if c.Dims == (layout.Dims{}) {
		c.Dims = Llama3_8B
	}
	if c.Tokens == 0 {
		c.Tokens = 4096
	}
	if c.Runs == 0 {
		c.Runs = 3
	}
	if c.Timeout == 0 {
		c.Timeout = time.Minute
	}
	if c.Transport == "" {
		c.Transport = TransportMem
	}
	if c.UCXTLS == "" {
		c.UCXTLS = "posix,cma,self"
	}
	if c.Engine.Logger == nil {
		c.Engine.Logger = zap.NewNop()
	}
	if c.Engine.TransferTimeout == 0 {
		c.Engine.TransferTimeout = c.Timeout
	}
	return c
}

// Errors of Run.
var (
	// ErrInvalidConfig: a Config field cannot work; the message names it.
	ErrInvalidConfig = errors.New("streambench: invalid configuration")
	// ErrNoUCX: TransportUCX in a build without cgo, which has no UCX transport.
	ErrNoUCX = errors.New("streambench: the UCX transport needs a cgo build")
)

func (c Config) validate() error {
	bad := func(field string, v any, reason string) error {
		return fmt.Errorf("%w: %s = %v: %s", ErrInvalidConfig, field, v, reason)
	}
	switch {
	case c.Tokens < 0:
		return bad("Tokens", c.Tokens, "must be positive")
	case c.LayerCompute < 0:
		return bad("LayerCompute", c.LayerCompute, "must not be negative")
	case c.Runs < 1:
		return bad("Runs", c.Runs, "must be at least 1")
	case c.Timeout < 0:
		return bad("Timeout", c.Timeout, "must be positive")
	case c.Transport != TransportMem && c.Transport != TransportUCX:
		return bad("Transport", c.Transport, fmt.Sprintf("must be %q or %q", TransportMem, TransportUCX))
	case c.Dims.NumLayers < 1:
		return bad("Dims.NumLayers", c.Dims.NumLayers, "must be at least 1")
	}
	return nil
}

// bench is one run's engines and pools: the sender's pool filled with random bytes, the
// receiver's with the same layout, so a finished transfer makes the two pools equal.
type bench struct {
	cfg      Config
	src, dst *transfer.Engine
	dstPeer  transfer.Peer
	srcPeer  transfer.Peer
	plan     *layout.Plan
	srcPool  []byte
	dstPool  []byte
	nextID   transfer.RequestID
	closeAll func()
}

// Run measures cfg: a warm-up, the plain transfers, then the streamed ones. ctx bounds it as
// a whole; each transfer is bounded by Config.Timeout as well.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	b, err := newBench(cfg)
	if err != nil {
		return Result{}, err
	}
	defer b.closeAll()

	if _, err := b.plain(ctx); err != nil { // warm-up: faults in the receiver's pool and the slots
		return Result{}, fmt.Errorf("warm-up: %w", err)
	}
	if !bytes.Equal(b.srcPool, b.dstPool) {
		return Result{}, errors.New("streambench: plain transfer: the receiver's pool differs from the sender's")
	}
	var plains, exposed, streams []time.Duration
	for range cfg.Runs {
		d, err := b.plain(ctx)
		if err != nil {
			return Result{}, err
		}
		plains = append(plains, d)
	}
	plain := median(plains)
	compute := cfg.LayerCompute
	if compute == 0 {
		compute = plain / time.Duration(cfg.Dims.NumLayers)
	}
	for range cfg.Runs {
		clear(b.dstPool)
		e, total, err := b.streamed(ctx, compute)
		if err != nil {
			return Result{}, err
		}
		if !bytes.Equal(b.srcPool, b.dstPool) {
			return Result{}, errors.New("streambench: streamed transfer: the receiver's pool differs from the sender's")
		}
		exposed, streams = append(exposed, e), append(streams, total)
	}
	r := Result{
		ExposedUS: us(median(exposed)), PlainUS: us(plain), StreamUS: us(median(streams)), LayerComputeUS: us(compute),
		Bytes: b.plan.Bytes(), Layers: cfg.Dims.NumLayers, Tokens: cfg.Tokens, Runs: cfg.Runs, Transport: cfg.Transport,
		Compute: map[bool]string{false: "sleep", true: "busy"}[cfg.BusyCompute],
	}
	r.ExposedRatio = r.ExposedUS / r.PlainUS
	return r, nil
}

func newBench(cfg Config) (*bench, error) {
	d := cfg.Dims
	d.NumBlocks = (int64(cfg.Tokens) + d.TokensPerBlock - 1) / d.TokensPerBlock
	l := layout.Packed(d, layout.LayerMajor)
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%w: Dims: %w", ErrInvalidConfig, err)
	}
	ids := make([]int32, d.NumBlocks)
	for i := range ids {
		ids[i] = int32(i)
	}
	plan, err := layout.NewPlan(l, l.All(), ids)
	if err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, plan: plan, srcPool: make([]byte, l.SpanBytes()), dstPool: make([]byte, l.SpanBytes()), nextID: 1}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(b.srcPool); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b.srcPool[i+j] = byte(v >> (8 * j))
		}
	}
	var srcTr, dstTr transfer.Transport
	srcCfg, dstCfg := cfg.Engine, cfg.Engine
	switch cfg.Transport {
	case TransportMem:
		n := mem.NewNetwork()
		srcTr, dstTr, b.srcPeer, b.dstPeer = n.Transport("prefill"), n.Transport("decode"), "prefill", "decode"
	case TransportUCX:
		var err error
		if srcTr, dstTr, err = ucxPair(cfg, &srcCfg, &dstCfg, b); err != nil {
			return nil, err
		}
	}
	if b.src, err = transfer.New(srcTr, srcCfg); err != nil {
		_ = srcTr.Close(true)
		_ = dstTr.Close(true)
		return nil, err
	}
	if b.dst, err = transfer.New(dstTr, dstCfg); err != nil {
		_ = b.src.Close()
		_ = dstTr.Close(true)
		return nil, err
	}
	b.closeAll = func() {
		_ = b.src.Close()
		_ = b.dst.Close()
	}
	return b, nil
}

// engineSlots is the staging memory an engine with c needs.
func engineSlots(c transfer.Config) int64 {
	slot, conc, depth := c.SlotBytes, int64(c.MaxConcurrent), int64(c.Tuning.PipelineDepth)
	if slot == 0 {
		slot = transferdefaults.SlotBytes
	}
	if conc == 0 {
		conc = transferdefaults.MaxConcurrent
	}
	if depth == 0 {
		depth = transferdefaults.PipelineDepth
	}
	if c.Tuning.NumSlots > 0 {
		return int64(c.Tuning.NumSlots) * slot
	}
	return conc * depth * slot
}

// start opens both sides of the next request.
func (b *bench) start(ctx context.Context, stream bool) (hs, hr *transfer.Handle, err error) {
	id := b.nextID
	b.nextID++
	hs, err = b.src.Send(ctx, transfer.Spec{ID: id, Peer: b.dstPeer, Plan: b.plan, Pool: b.srcPool, Stream: stream, Timeout: b.cfg.Timeout})
	if err != nil {
		return nil, nil, err
	}
	hr, err = b.dst.Receive(ctx, transfer.Spec{ID: id, Peer: b.srcPeer, Plan: b.plan, Pool: b.dstPool, Stream: stream, Timeout: b.cfg.Timeout})
	if err != nil {
		b.src.Cancel(id)
		<-hs.Quiesced() // bounded: the send's deadline or queue timeout ends it
		_ = hs.Release()
		return nil, nil, err
	}
	return hs, hr, nil
}

// finish waits (bounded) for both sides and checks that they completed.
func (b *bench) finish(ctx context.Context, hs, hr *transfer.Handle) (time.Time, error) {
	defer func() { _ = hs.Release(); _ = hr.Release() }()
	timer := time.NewTimer(b.cfg.Timeout + 5*time.Second) // past the transfers' own deadline
	defer timer.Stop()
	var recvDone time.Time
	for _, h := range []*transfer.Handle{hr, hs} {
		select {
		case <-h.Quiesced():
		case <-ctx.Done():
			b.src.Cancel(hs.ID())
			b.dst.Cancel(hr.ID())
			return time.Time{}, ctx.Err()
		case <-timer.C:
			return time.Time{}, fmt.Errorf("streambench: request %d did not end within %v", h.ID(), b.cfg.Timeout)
		}
		if h == hr {
			recvDone = time.Now()
		}
		if st := h.Status(); st.State != transfer.Completed {
			return time.Time{}, fmt.Errorf("streambench: request %d: %v: %w", h.ID(), st.State, st.Err)
		}
	}
	return recvDone, nil
}

// plain times one request sent with every layer ready: start to the receiver complete.
func (b *bench) plain(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	hs, hr, err := b.start(ctx, false)
	if err != nil {
		return 0, err
	}
	end, err := b.finish(ctx, hs, hr)
	return end.Sub(start), err
}

// streamed runs simulated prefill beside a streaming send and returns the exposed time
// (last layer ready to the receiver complete) and the whole time.
func (b *bench) streamed(ctx context.Context, compute time.Duration) (exposed, total time.Duration, err error) {
	start := time.Now()
	hs, hr, err := b.start(ctx, true)
	if err != nil {
		return 0, 0, err
	}
	var lastReady time.Time
	for l := 1; l <= int(b.cfg.Dims.NumLayers); l++ {
		b.computeLayer(compute)
		if err := hs.MarkLayersReady(l); err != nil {
			b.src.Cancel(hs.ID())
			_, _ = b.finish(ctx, hs, hr)
			return 0, 0, err
		}
		lastReady = time.Now()
	}
	end, err := b.finish(ctx, hs, hr)
	return end.Sub(lastReady), end.Sub(start), err
}

// computeLayer stands in for one layer of prefill.
func (b *bench) computeLayer(d time.Duration) {
	if !b.cfg.BusyCompute {
		time.Sleep(d)
		return
	}
	for start := time.Now(); time.Since(start) < d; {
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
