// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// errBadRMAOffer: a sender's RMA offer does not describe memory the receiver may read: a
// layout, selection or block list that does not validate, a pool smaller than the plan it
// holds, or a stream unlike the request's. The error names the field and why (and matches
// ErrProtocol); the request fails before any get is posted, so a garbage offer never becomes
// an out-of-bounds read.
var errBadRMAOffer = errors.New("kvxfer: bad rma offer")

// rmaOfferError names the part of an offer that is wrong. It matches errBadRMAOffer and
// ErrProtocol.
type rmaOfferError struct {
	Field  string
	Reason string
	Err    error // the underlying cause, if any (a layout error, say)
}

// Error implements error.
func (e *rmaOfferError) Error() string {
	return fmt.Sprintf("%v: %s: %s", errBadRMAOffer, e.Field, e.Reason)
}

// Is matches errBadRMAOffer and ErrProtocol.
func (e *rmaOfferError) Is(target error) bool {
	return target == errBadRMAOffer || target == ErrProtocol
}

// Unwrap returns the underlying cause.
func (e *rmaOfferError) Unwrap() error { return e.Err }

const (
	// rmaGetsAhead is how many gets a receiver keeps posted: they hold no slot, and a few in
	// flight keep the copy going while the engine handles the last one's completion.
	rmaGetsAhead = 16
	// rmaMaxOfferBlocks bounds the block ids of one offer message; a larger request's offer
	// goes in parts of this many, or fewer where the transport's control messages have less
	// room (transport.ControlBound: UCX's default of 4 KiB holds this many with a shared-memory address).
	rmaMaxOfferBlocks = 768
	// rmaMaxPieces bounds the pool-to-pool pieces a receiver works out before coalescing
	// them; a plan with more runs has ranges far too small for gets anyway.
	rmaMaxPieces = 1 << 20
	// rmaMinStripe is the smallest get made to spread a request over lanes: smaller ones would
	// cost more per byte than the lanes win.
	rmaMinStripe = 1 << 20
)

// rmaRegion is a range of the sender's pool read into a range of the receiver's.
type rmaRegion struct {
	src, dst, n int64
}

// rmaTransport returns the engine's transport as an transport.RMATransport, when it is one and the
// engine allows the mode.
// getsEmulated reports whether gets from the peer would be emulated (transport.RMAEmulation: UCX 1.13
// over TCP) and the configuration does not keep the RMA mode there (RMAWhereEmulated): no
// one-copy read of the peer's memory is to be had then, by the RMA mode or the pull wire.
func (x *xfer) getsEmulated(rt transport.RMATransport) bool {
	em, ok := rt.(transport.RMAEmulation)
	return ok && !x.eng.cfg.Tuning.RMAWhereEmulated && em.GetsEmulated(x.peer)
}

func (x *xfer) rmaTransport() transport.RMATransport {
	if x.eng.cfg.Tuning.DisableRMA {
		return nil
	}
	return x.eng.gets()
}

// gets returns the engine's transport as a transport.RMATransport where it posts and serves
// gets, whatever the configuration says of the routes that use them; nil where it is no
// RMATransport or says it serves no RMA (transportimpl.RMAServing: the UCX transport over TCP
// only). Every route that reads a peer's memory with gets, or exposes this side's to a peer's
// gets, asks here first, so a transport without RMA gets no such call: the receiver asks for
// no offer, the sender declines one, and the data moves by messages.
func (e *Engine) gets() transport.RMATransport {
	rt, ok := e.tr.(transport.RMATransport)
	if !ok {
		return nil
	}
	if s, ok := rt.(transportimpl.RMAServing); ok && !s.ServesRMA() {
		return nil
	}
	return rt
}

// rmaParts assembles an offer sent in parts (RMAOfferPart). The first part to arrive fixes
// everything but the block ids; every other must agree with it, and a position may come
// again (a part sent again after a repeated request) only with the same id.
type rmaParts struct {
	whole wire.RMAOffer // the first part, Blocks growing into the sender's whole list
	have  []bool
	count int
}

func newRMAParts(first *wire.RMAOffer) *rmaParts {
	p := &rmaParts{whole: *first, have: make([]bool, first.Total)}
	p.whole.Flags &^= wire.RMAOfferPart
	p.whole.Blocks, p.whole.First, p.whole.Total = make([]int32, first.Total), 0, 0
	return p
}

// add takes one part. It returns the whole offer once every position has come, nil before,
// and an errBadRMAOffer when the part disagrees with the others.
func (p *rmaParts) add(m *wire.RMAOffer) (*wire.RMAOffer, error) {
	bad := func(field, format string, args ...any) error {
		return &rmaOfferError{Field: field, Reason: "offer parts disagree: " + fmt.Sprintf(format, args...)}
	}
	w := &p.whole
	switch {
	case m.Total != len(p.have):
		return nil, bad("Total", "%d blocks, then %d", len(p.have), m.Total)
	case m.Addr != w.Addr || m.PoolBytes != w.PoolBytes:
		return nil, bad("Addr", "pool [%#x, +%d), then [%#x, +%d)", w.Addr, w.PoolBytes, m.Addr, m.PoolBytes)
	case m.Layout != w.Layout || m.Selection != w.Selection:
		return nil, bad("Layout", "%+v %+v, then %+v %+v", w.Layout, w.Selection, m.Layout, m.Selection)
	case !bytes.Equal(m.Key, w.Key):
		return nil, bad("Key", "two different remote keys")
	case m.Flags&wire.RMAValidated != w.Flags&wire.RMAValidated || m.GenAddr != w.GenAddr || m.Generation != w.Generation || !bytes.Equal(m.GenKey, w.GenKey):
		return nil, bad("Generation", "generation %d at %#x, then %d at %#x", w.Generation, w.GenAddr, m.Generation, m.GenAddr)
	}
	for i, id := range m.Blocks {
		at := m.First + i
		if p.have[at] {
			if w.Blocks[at] != id {
				return nil, bad("Blocks", "position %d is block %d, then %d", at, w.Blocks[at], id)
			}
			continue
		}
		p.have[at], w.Blocks[at] = true, id
		p.count++
	}
	if p.count < len(p.have) {
		return nil, nil
	}
	return w, nil
}

// checkOffer validates the offer against the advertised pool and this side's plan, and
// returns the gets to make, or nil when the ranges are too small for the RMA mode: under
// RMAMinRegionBytes on average, or InPlaceMinRegionBytes when they are read in place (for a
// device pool, only where they also outnumber its blocks).
func (x *xfer) checkOffer(m *wire.RMAOffer, inPlace bool) ([]rmaRegion, error) {
	bad := func(field string, err error, format string, args ...any) error {
		return &rmaOfferError{Field: field, Reason: fmt.Sprintf(format, args...), Err: err}
	}
	src, err := x.offerPlan(m)
	if err != nil {
		return nil, err
	}
	regions, ok := rmaRegions(src, x.plan)
	least := x.eng.cfg.Tuning.RMAMinRegionBytes
	if inPlace {
		least = min(least, x.eng.cfg.Tuning.InPlaceMinRegionBytes)
	}
	// A device pool's rma route has no staging to fall back to once it began
	// (deviceNoFallback): ranges small because its blocks are (a small model, one layer of a
	// block) cost more gets, never a refused transfer. Small ranges and more of them than
	// blocks is a layout conversion, which a device pool stages (a Mover's kernels) or is refused.
	small := x.plan.Bytes()/int64(len(regions)) < least
	if x.dev.set() {
		small = small && len(regions) > len(x.plan.Blocks())
	}
	if !ok || small {
		x.log().Debug("rma offer declined: pool ranges too small", zap.Int("ranges", len(regions)), zap.Bool("too many pieces", !ok))
		return nil, nil
	}
	var gets []rmaRegion
	for _, r := range regions {
		if r.src < 0 || r.n > m.PoolBytes || r.src > m.PoolBytes-r.n || r.dst < 0 || r.dst > x.poolBytes()-r.n {
			return nil, bad("plan", nil, "range [%d, +%d) -> [%d, +%d) leaves a pool", r.src, r.n, r.dst, r.n)
		}
		step := x.getBytes()
		for off := int64(0); off < r.n; off += step {
			n := min(step, r.n-off)
			gets = append(gets, rmaRegion{src: r.src + off, dst: r.dst + off, n: n})
		}
	}
	return gets, nil
}

// offerPlan validates the offer's plan against the advertised pool and this side's plan and
// returns it: every range of it lies inside the offered pool, and it streams the requested
// bytes.
func (x *xfer) offerPlan(m *wire.RMAOffer) (*layout.Plan, error) {
	bad := func(field string, err error, format string, args ...any) error {
		return &rmaOfferError{Field: field, Reason: fmt.Sprintf(format, args...), Err: err}
	}
	src, err := layout.NewPlan(m.Layout, m.Selection, m.Blocks)
	if err != nil {
		return nil, bad("plan", err, "the offered layout, selection and blocks do not make a plan: %v", err)
	}
	if m.PoolBytes <= 0 || kvplan.PoolSpan(src) > m.PoolBytes {
		return nil, bad("PoolBytes", nil, "a %d-byte pool cannot hold the offered layout's %d bytes", m.PoolBytes, kvplan.PoolSpan(src))
	}
	if m.Addr+uint64(m.PoolBytes) < m.Addr {
		return nil, bad("Addr", nil, "[%#x, +%d) wraps around", m.Addr, m.PoolBytes)
	}
	if err := kvplan.CompatibleShapes(kvplan.ShapeOf(src), kvplan.ShapeOf(x.plan)); err != nil {
		return nil, bad("Blocks", err, "the offered stream is not the requested one: %v", err)
	}
	return src, nil
}

// getBytes is the largest get: DirectChunkBytes, or less where the transport stripes gets
// over lanes (transport.RMALanes) and the request is too small to give each lane two gets of that size,
// but never under rmaMinStripe.
func (x *xfer) getBytes() int64 {
	step := x.eng.cfg.Tuning.DirectChunkBytes
	if l, ok := x.eng.tr.(transport.RMALanes); ok {
		if n := int64(l.GetLanes()); n > 1 {
			per := (x.plan.Bytes() + 2*n - 1) / (2 * n)
			step = min(step, max(rmaMinStripe, per))
		}
	}
	return step
}

// planRun is one run of a plan (kvplan.Runs): n bytes at pool offset pool, stream
// offset stream.
type planRun struct{ pool, stream, n int64 }

// pairRuns pairs two plans' runs of the same stream bytes, from stream offset at, byte for
// byte: each piece's src in a's pool, its dst in b's, in stream order.
func pairRuns(a, b []planRun, at int64) []rmaRegion {
	pieces := make([]rmaRegion, 0, max(len(a), len(b)))
	for i, j := 0, 0; i < len(a) && j < len(b); {
		ra, rb := a[i], b[j]
		end := min(ra.stream+ra.n, rb.stream+rb.n)
		pieces = append(pieces, rmaRegion{src: ra.pool + at - ra.stream, dst: rb.pool + at - rb.stream, n: end - at})
		at = end
		if at == ra.stream+ra.n {
			i++
		}
		if at == rb.stream+rb.n {
			j++
		}
	}
	return pieces
}

// rmaRegions pairs the two plans' pool ranges byte for byte of the stream, then merges the
// pieces that are contiguous on both sides: for a block-major pool moving whole blocks, one
// range per block, or per run of blocks whose ids are consecutive on both sides. It reports
// false when the plans have more runs than rmaMaxPieces.
func rmaRegions(src, dst *layout.Plan) ([]rmaRegion, bool) {
	runs := func(p *layout.Plan) ([]planRun, bool) {
		most := p.Bytes() / (p.Layout().RowBytes() * kvplan.RunUnits(p))
		if most > rmaMaxPieces {
			return nil, false
		}
		rs := make([]planRun, 0, most)
		_ = kvplan.Runs(p, 0, p.Bytes(), func(poolOff, streamOff, n int64) { rs = append(rs, planRun{poolOff, streamOff, n}) })
		return rs, true
	}
	a, okA := runs(src)
	b, okB := runs(dst)
	if !okA || !okB {
		return nil, false
	}
	pieces := sortByDst(pairRuns(a, b, 0))
	out := pieces[:0]
	for _, p := range pieces {
		if k := len(out) - 1; k >= 0 && out[k].src+out[k].n == p.src && out[k].dst+out[k].n == p.dst {
			out[k].n += p.n
			continue
		}
		out = append(out, p)
	}
	return out, true
}

// offerBlocks is how many block ids one offer message carries: rmaMaxOfferBlocks, or fewer
// where the transport's control messages (transport.ControlBound) have less room for a part with a key
// of keyBytes. Below one it is an error.
func (x *xfer) offerBlocks(keyBytes int) int {
	n := rmaMaxOfferBlocks
	if cb, ok := x.eng.tr.(transport.ControlBound); ok {
		n = min(n, (cb.ControlRoom()-wire.OfferFixedBytes-wire.OfferBodyBytes-wire.OfferPartBytes-keyBytes)/4)
	}
	return n
}

// encodeOffer encodes o as one message, or, with more than per blocks, as parts of at most
// that many.
func encodeOffer(per int, o *wire.RMAOffer) ([][]byte, error) {
	if per < 1 {
		return nil, fmt.Errorf("%w: the transport's control messages have no room for an offer with a %d-byte key",
			ErrInvalidSpec, len(o.Key))
	}
	all := o.Blocks
	if len(all) <= per {
		b, err := o.AppendBinary(nil)
		return [][]byte{b}, err
	}
	var msgs [][]byte
	for first := 0; first < len(all); first += per {
		p := *o
		p.Flags |= wire.RMAOfferPart
		p.First, p.Total, p.Blocks = first, len(all), all[first:min(first+per, len(all))]
		b, err := p.AppendBinary(nil)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, b)
	}
	return msgs, nil
}

// sortByDst sorts pieces by their offset in the receiver's pool in O(n): a least-significant-
// digit radix sort on 11-bit digits, as many passes as the largest offset has digits. A
// 4096-token request has thousands of pieces (one per layer, K/V and block), and comparing
// them was most of the time between an offer's arrival and the first read (about a
// millisecond here; BenchmarkRMARegions).
func sortByDst(p []rmaRegion) []rmaRegion {
	if len(p) < 64 {
		slices.SortFunc(p, func(a, b rmaRegion) int { return cmp.Compare(a.dst, b.dst) })
		return p
	}
	return radixSortByDst(p)
}

// radixSortByDst is sortByDst's radix sort, stable. It sorts the offsets less their least
// one, less the low bits they all share (a run's size aligns them: 32 KiB for Llama-3-8B),
// on digits of about log2(len(p)) bits (4 to 11): a 32-token Llama-3-8B request's 64 pieces,
// which lie within its one 4 MiB block, take one pass over 128 counts, not three over 2048
// (BenchmarkSortByDst).
// The counts are on the heap: in its frame, 16 KiB of them grew every short request's
// transfer goroutine's stack (TestShortOfferPairsWithinASmallStack).
func radixSortByDst(p []rmaRegion) []rmaRegion {
	if len(p) == 0 {
		return p
	}
	lo, hi := p[0].dst, p[0].dst
	for _, r := range p {
		lo, hi = min(lo, r.dst), max(hi, r.dst)
	}
	var shared uint64
	for _, r := range p {
		shared |= uint64(r.dst - lo) // offsets in a pool are never negative: no overflow
	}
	if shared == 0 {
		return p // all at one offset: sorted, and stable
	}
	low := bits.TrailingZeros64(shared)
	span := uint64(hi-lo) >> low
	width := min(11, max(4, bits.Len(uint(len(p)))))
	mask := uint64(1)<<width - 1
	tmp := make([]rmaRegion, len(p))
	at := make([]int, 1<<width)
	for shift := low; shift < 64 && span>>(shift-low) > 0; shift += width {
		clear(at)
		for _, r := range p {
			at[(uint64(r.dst-lo)>>shift)&mask]++
		}
		sum := 0
		for d, c := range at {
			at[d], sum = sum, sum+c
		}
		for _, r := range p {
			d := (uint64(r.dst-lo) >> shift) & mask
			tmp[at[d]] = r
			at[d]++
		}
		p, tmp = tmp, p
	}
	return p
}
