// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Spec describes one side of a transfer.
type Spec struct {
	// ID is the request id both sides use.
	ID RequestID
	// Secret is the request's per-request secret (16 random bytes from NewClaimSecret,
	// or nil). A Send with one draws it into the request's ContextParams (see
	// NewClaimSecret) and, with cluster keys or Config.RequireClaimProof, takes only a request
	// whose claim proves it: a refused claim fails that receiver with ErrUnauthenticated and
	// the Send keeps waiting for the real one. A Receive passes the secret its ContextParams
	// carry; it sends the proof, never the secret, and only to a sender that speaks claims.
	Secret []byte
	// Params (a Receive) are the request's decoded params (*ucx.ContextParams), or nil. Where
	// they carry an Exposure section and this engine can read it, the Receive reads the
	// sender's pool at once, with no request/offer round trip (docs/protocol.md, "One-hop
	// reads"); otherwise they change nothing. A Send ignores them.
	Params transport.Params
	// Peer is the other engine, as the transport names it. Leave empty when Subs is set.
	Peer Peer
	// Plan names this side's blocks in this side's pool: the sender gathers it, the receiver
	// scatters into it. Leave nil when Subs is set.
	Plan *layout.Plan
	// Pool is the caller's KV pool in host memory. The engine reads (Send) or writes
	// (Receive) it only through the plans, and never frees it: the caller frees its blocks
	// when the handle's Quiesced channel closes (or at once after a Cancel outcome that says
	// so). Ignored when Mover is set.
	Pool []byte
	// Mover, if set, replaces the host mover over Pool (device memory, say). With Device it
	// is the staging route a device pool takes when the RMA route cannot run (device.go).
	Mover Mover
	// Device is a KV pool in device memory that the caller registered with the transport
	// (ucx.Transport.RegisterDevice), in place of Pool: the receiver's RMA gets then move it
	// GPU to GPU, with no staging and no kernel (docs/kvcache.md, "GPU memory"). Leave Pool
	// empty when it is set. Its blocks are held as a host pool's are while an earlier
	// transfer over them is not quiescent: a new one over them is refused with ErrBlocksBusy
	// (the pool named by Addr).
	Device DevicePool
	// Timeout is the transfer's deadline, counted from its first staging slot lease.
	// Default Config.TransferTimeout. It does not bound the queued phase before that (a
	// slot, admission, and on a Send the receiver's request): that wait ends at
	// Config.QueueTimeout or the Send/Receive context's deadline, whichever comes first,
	// with ErrQueueTimeout. A Send whose receiver never asks so ends at QueueTimeout, whatever
	// Timeout says; to bound that wait by Timeout too, pass a context with that deadline.
	Timeout time.Duration
	// Subs, for a Receive only, splits the request over several peers (heterogeneous TP or
	// PP: a TP=1 rank receiving from two TP=2 ranks names each with the plan of its share of
	// heads). The handle is terminal only when every sub-transfer is. Peers must differ, and
	// no two plans may name the same bytes of the pool (refused like a block listed twice,
	// with layout.ErrDuplicateBlock).
	Subs []SubSpec

	// Stream, on a Send, opens the transfer before its KV is complete: the engine sends only
	// the layers the caller has declared ready (Handle.MarkLayersReady, or the Ready signals)
	// and cuts chunks at layer boundaries, so a ready layer never waits on an unready one.
	// The deadline still counts from the first slot lease, so Timeout must cover the rest of
	// prefill as well as the wire. On a Receive, Stream asks the sender for layer-aligned
	// chunks and keeps Handle.LayersReady current; set it when the sender streams (it works
	// without, chunks that straddle two layers then wait for both).
	Stream bool
	// Ready, on a streaming Send, lists non-blocking signals (a CUDA event recorded after
	// each layer range's compute, say) that the engine polls every Config.Tuning.ReadyPollInterval:
	// when Ready[i].Signal reports done, layers [0, Ready[i].End) are ready. Ends must rise.
	// The engine never blocks on a signal and never waits for one past the deadline.
	Ready []LayerSignal
	// Held, on a Receive, lists the positions in Plan's block list that the receiver already
	// holds (a prefix-cache hit): only the other blocks move, and the request-info message
	// carries the positions so the sender trims its own plan the same way. Positions must
	// be distinct and in range, and leave at least one block (else ErrNothingToMove).
	// Only with Plan, not Subs.
	Held []int
}

// ReadySignal says, without blocking, whether something the transfer depends on has
// happened. *cuda.Event satisfies it (Query is cudaEventQuery); a host producer can use
// Handle.MarkLayersReady instead.
type ReadySignal interface {
	// Query reports whether the signal has fired. It must not block. An error means it
	// never will: the transfer fails, its error wrapping Query's.
	Query() (done bool, err error)
}

// LayerSignal declares layers [0, End) of the plan's selection ready once Signal fires.
type LayerSignal struct {
	End    int
	Signal ReadySignal
}

// SubSpec is one peer's share of a multi-peer Receive.
type SubSpec struct {
	Peer Peer
	Plan *layout.Plan
}

// resolve checks the spec and returns its sub-transfers (with Held applied), mover and
// timeout.
func (s Spec) resolve(receive bool, cfg Config) ([]SubSpec, Mover, time.Duration, error) {
	subs, mover, timeout, err := s.resolveBase(receive, cfg)
	if err != nil {
		return nil, nil, 0, err
	}
	bad := func(field, reason string, err error) error {
		return &specError{ID: s.ID, Field: field, Reason: reason, Err: err}
	}
	if receive && len(s.Ready) > 0 {
		return nil, nil, 0, bad("Ready", "only a Send has readiness signals", nil)
	}
	if len(s.Ready) > 0 && !s.Stream {
		return nil, nil, 0, bad("Ready", "readiness signals need Stream", nil)
	}
	if len(s.Ready) > 0 {
		layers := int(subs[0].Plan.Selection().Layers())
		prev := 0
		for i, r := range s.Ready {
			field := fmt.Sprintf("Ready[%d]", i)
			if r.Signal == nil {
				return nil, nil, 0, bad(field+".Signal", "nil signal", nil)
			}
			if r.End <= prev || r.End > layers {
				return nil, nil, 0, bad(field+".End", fmt.Sprintf("%d: ends must rise and lie in [1, %d]", r.End, layers), layout.ErrOutOfRange)
			}
			prev = r.End
		}
	}
	if len(s.Held) > 0 {
		switch {
		case !receive:
			return nil, nil, 0, bad("Held", "only a Receive names the blocks it holds", nil)
		case len(s.Subs) > 0:
			return nil, nil, 0, bad("Held", "a partial transfer takes Plan, not Subs", nil)
		case len(s.Plan.Blocks()) > wire.MaxBlocks:
			return nil, nil, 0, bad("Held", fmt.Sprintf("a partial transfer of %d blocks, at most %d", len(s.Plan.Blocks()), wire.MaxBlocks), layout.ErrOutOfRange)
		case len(s.Held) == len(s.Plan.Blocks()) && len(s.Held) > 0:
			if _, err := kvplan.WithoutPositions(s.Plan, s.Held); errors.Is(err, layout.ErrOutOfRange) && !hasBadPosition(s.Held, len(s.Plan.Blocks())) {
				return nil, nil, 0, bad("Held", fmt.Sprintf("all %d blocks held", len(s.Held)), ErrNothingToMove)
			}
		}
		trimmed, err := kvplan.WithoutPositions(s.Plan, s.Held)
		if err != nil {
			return nil, nil, 0, bad("Held", err.Error(), err)
		}
		subs[0].Plan = trimmed
	}
	return subs, mover, timeout, nil
}

// hasBadPosition reports whether a position is out of range or repeated, so that "all held"
// is told apart from bad input.
func hasBadPosition(pos []int, n int) bool {
	seen := make(map[int]bool, len(pos))
	for _, p := range pos {
		if p < 0 || p >= n || seen[p] {
			return true
		}
		seen[p] = true
	}
	return false
}

func (s Spec) resolveBase(receive bool, cfg Config) ([]SubSpec, Mover, time.Duration, error) {
	bad := func(field, reason string, err error) error {
		return &specError{ID: s.ID, Field: field, Reason: reason, Err: err}
	}
	subs := s.Subs
	switch {
	case len(subs) > 0 && !receive:
		return nil, nil, 0, bad("Subs", "only a Receive may span several peers", nil)
	case len(subs) > 0 && (s.Peer != "" || s.Plan != nil):
		return nil, nil, 0, bad("Subs", "set either Peer and Plan, or Subs", nil)
	case len(subs) == 0:
		subs = []SubSpec{{Peer: s.Peer, Plan: s.Plan}}
	}
	if len(subs) > 1<<16 {
		return nil, nil, 0, bad("Subs", fmt.Sprintf("%d sub-transfers, at most %d", len(subs), 1<<16), nil)
	}
	if s.Timeout < 0 {
		return nil, nil, 0, bad("Timeout", "must not be negative", nil)
	}
	if s.Secret != nil && len(s.Secret) != claimSecretBytes {
		return nil, nil, 0, bad("Secret", fmt.Sprintf("%d bytes, want %d or none", len(s.Secret), claimSecretBytes), nil)
	}
	timeout := s.Timeout
	if timeout == 0 {
		timeout = cfg.TransferTimeout
	}
	if err := s.checkDevice(); err != nil {
		return nil, nil, 0, err
	}
	mover := s.Mover
	seen := make(map[Peer]int, len(subs))
	for i, sub := range subs {
		field := "Plan"
		if len(s.Subs) > 0 {
			field = fmt.Sprintf("Subs[%d]", i)
		}
		if sub.Peer == "" {
			return nil, nil, 0, bad(field+".Peer", "empty peer", nil)
		}
		if j, dup := seen[sub.Peer]; dup {
			return nil, nil, 0, bad(field+".Peer", fmt.Sprintf("peer %q already named by Subs[%d]", sub.Peer, j), nil)
		}
		seen[sub.Peer] = i
		if sub.Plan == nil {
			return nil, nil, 0, bad(field, "nil plan", nil)
		}
		if s.Device.set() {
			if span := kvplan.PoolSpan(sub.Plan); s.Device.Len < span {
				return nil, nil, 0, bad("Device.Len", fmt.Sprintf("%d bytes, the plan's layout spans %d: blocks lie past the region", s.Device.Len, span), layout.ErrBufferTooSmall)
			}
		} else if mover == nil {
			if span := kvplan.PoolSpan(sub.Plan); int64(len(s.Pool)) < span {
				return nil, nil, 0, bad("Pool", fmt.Sprintf("%d bytes, the plan's layout spans %d", len(s.Pool), span), layout.ErrBufferTooSmall)
			}
		}
	}
	if len(subs) > 1 {
		if i, j, ok := overlappingSubs(subs); ok {
			return nil, nil, 0, bad(fmt.Sprintf("Subs[%d].Plan", j),
				fmt.Sprintf("writes bytes of the pool that Subs[%d] writes too", i), layout.ErrDuplicateBlock)
		}
	}
	if mover == nil && s.Device.set() {
		mover = noDeviceMover{}
	}
	if mover == nil {
		mover = newHostMover(s.Pool)
	}
	return subs, mover, timeout, nil
}

// overlappingSubs finds two sub-transfers whose plans name the same bytes of the pool (the
// same blocks, layers and heads), which would make the result whichever sender landed last.
// It compares the plans' pool runs, so it holds whatever layouts the plans use; it returns the
// lower index i and the later one j.
func overlappingSubs(subs []SubSpec) (i, j int, found bool) {
	if i, j, found, ok := overlappingSelections(subs); ok {
		return i, j, found
	}
	type run struct {
		off, end int64
		sub      int
	}
	var runs []run
	for k, s := range subs {
		_ = kvplan.Runs(s.Plan, 0, s.Plan.Bytes(), func(poolOff, _, n int64) {
			runs = append(runs, run{poolOff, poolOff + n, k})
		})

	}
	slices.SortFunc(runs, func(a, b run) int { return cmp.Compare(a.off, b.off) })
	// A plan's own runs never overlap (NewPlan refuses a repeated block and a layout whose
	// strides overlap), so any overlap of sorted neighbours-or-earlier is between two subs.
	reach := -1 // index of the run reaching furthest so far
	for k, r := range runs {
		if reach >= 0 && r.off < runs[reach].end && runs[reach].sub != r.sub {
			return min(r.sub, runs[reach].sub), max(r.sub, runs[reach].sub), true
		}
		if reach < 0 || r.end > runs[reach].end {
			reach = k
		}
	}
	return 0, 0, false
}

// overlappingSelections is overlappingSubs where every plan has the same layout (a TP split's
// subs into one pool): the layout names each (block, layer, head) row once (NewPlan refuses
// strides that overlap), so two subs share bytes exactly when their layers, their heads and
// their blocks all meet, which takes no walk of the plans' runs (a 4k-token TP=2->1 request
// into layer-major-nhd has a million, and sorting them took longer than moving the bytes).
// ok is false where the layouts differ: the caller walks the runs.
func overlappingSelections(subs []SubSpec) (i, j int, found, ok bool) {
	for _, s := range subs[1:] {
		if s.Plan.Layout() != subs[0].Plan.Layout() {
			return 0, 0, false, false
		}
	}
	meet := func(a0, a1, b0, b1 int64) bool { return a0 < b1 && b0 < a1 }
	for j := 1; j < len(subs); j++ {
		b := subs[j].Plan.Selection()
		for i := range j {
			a := subs[i].Plan.Selection()
			if !meet(a.LayerBegin, a.LayerEnd, b.LayerBegin, b.LayerEnd) || !meet(a.HeadBegin, a.HeadEnd, b.HeadBegin, b.HeadEnd) {
				continue
			}
			ids := make(map[int32]struct{}, len(subs[i].Plan.Blocks()))
			for _, id := range subs[i].Plan.Blocks() {
				ids[id] = struct{}{}
			}
			for _, id := range subs[j].Plan.Blocks() {
				if _, dup := ids[id]; dup {
					return i, j, true, true
				}
			}
		}
	}
	return 0, 0, false, true
}
