// SPDX-License-Identifier: Apache-2.0

package transfer

// The RMA path's vector gets: where a pool holds the stream in pieces too small for one get
// each (under Config.Tuning.DirectMinRunBytes: a TP=2 rank's half of a token's heads in
// layer-major-nhd is 1 KiB) and the transport reads many ranges of the peer's memory in one
// operation (vectorget.Hooks: UCX from a process on this host, by process_vm_readv),
// the receiver takes the RMA mode anyway and reads each chunk of the stream as one vector get:
// the sender's plan's runs over the chunk as the remote list, its own plan's runs as the local
// one. The two lists need not pair up (the transport reads them as one stream each), so
// nothing pairs, sorts or merges a million pieces: each chunk's runs are walked when it is
// posted. Everything else is the RMA path's: the offer, the generation word read after the
// last get, the release, cancel and quarantine.

import (
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/vectorget"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// vectorGets reports whether this side could post vector gets: the RMA mode runs, this
// side's pool is host memory, and a transport with vector gets is linked in (vectorget.Hooks;
// whether the engine's is that one, the hooks say).
func (x *xfer) vectorGets() bool {
	return !x.dev.set() && x.hostPool && x.rmaTransport() != nil && vectorget.Hooks.VectorGets != nil
}

// vectorGetsLikely (a receiver whose pool's pieces are small, choosing its path before any
// offer) reports whether an offer from this peer could be read by vector gets: the peer
// speaks the RMA mode, its gets are not emulated, and the transport says it might (UCX: the
// peer is a process on this host that process_vm_readv may read). The key decides at the
// offer; one that does not prove itself falls back to IOV messages.
func (x *xfer) vectorGetsLikely() bool {
	if !x.vectorGets() || !x.peerHas(wire.FeatureRMA) || x.getsEmulated(x.rmaTransport()) {
		return false
	}
	return vectorget.Hooks.VectorGets(x.eng.tr, x.peer, nil)
}

// smallRuns reports whether p's contiguous pieces of the stream are under
// Config.Tuning.DirectMinRunBytes: too small for a get (or an IOV entry) each.
func (x *xfer) smallRuns(p *layout.Plan) bool {
	return kvplan.RunUnits(p)*p.Layout().RowBytes() < x.eng.cfg.Tuning.DirectMinRunBytes
}

// vectorOffer decides whether offer m is read piece by piece: either side's pieces are small,
// and either the transport maps the offered pool here (rmaInPlace: the pieces are copied out of
// the mapping on the movers, as reads in place are, with no system call and nothing pinned per
// piece) or it reads the offered key by vector gets (vectorget.Hooks.VectorGets, which may wait
// for the peer's proof). It returns the offer's plan and the chunks of the stream to read, one
// get or copy each (rmaRegion.src and dst are stream offsets then), or a nil plan: ranges as
// usual. r.inPlace is set where the pieces are read in place. A bad offer is an
// errBadRMAOffer.
func (r *rmaReceive) vectorOffer(m *wire.RMAOffer) (*layout.Plan, []rmaRegion, error) {
	x := r.x
	if x.dev.set() || !x.hostPool {
		return nil, nil, nil
	}
	ip := x.rmaInPlace()
	if ip == nil && !x.vectorGets() {
		return nil, nil, nil
	}
	src, err := x.offerPlan(m)
	if err != nil {
		return nil, nil, err
	}
	if !x.smallRuns(src) && !x.smallRuns(x.plan) {
		return nil, nil, nil
	}
	if ip != nil && m.PoolBytes >= kvplan.PoolSpan(src) { // offerPlan checked it; every piece lies in the view
		r.inPlace = ip
		r.mapOffer(m) // rma_inplace.go: nil where the offered pool is not mapped here
	}
	if r.inPlace == nil && (!x.vectorGets() || !vectorget.Hooks.VectorGets(x.eng.tr, x.peer, m.Key)) {
		x.log().Debug("small pieces, but the offered pool is neither mapped here nor read by vector gets")
		return nil, nil, nil
	}
	total, step := x.plan.Bytes(), x.getBytes()
	if l := x.plan.Layout(); true { // whole groups of rows (vectorLists.walk), where one fits a get
		group := l.RowBytes() * l.TokensPerBlock * x.plan.Selection().Heads()
		step = max(group, step/group*group)
	}
	gets := make([]rmaRegion, 0, (total+step-1)/step)
	for off := int64(0); off < total; off += step {
		gets = append(gets, rmaRegion{src: off, dst: off, n: min(step, total-off)})
	}
	x.log().Debug("rma offer read piece by piece", zap.Int("chunks", len(gets)), zap.Bool("inPlace", r.inPlace != nil))
	return src, gets, nil
}

// copyPieces copies stream chunks (rmaRegion.src and dst stream offsets) of the offered pool,
// mapped here as view, piece by piece into pool, src's pieces into dst's (a mover's job on the
// route vectorOffer chose where the offered pool is mapped). A piece outside view or pool is
// refused before it is copied (ErrProtocol); the pieces before it have been copied.
func copyPieces(src, dst *layout.Plan, view, pool []byte, chunks []rmaRegion) error {
	l := vectorLists{view: view, pool: pool}
	for _, g := range chunks {
		if err := l.walk(src, dst, g.src, g.n); err != nil {
			return err
		}
		if l.flush(); l.err != nil {
			return l.err
		}
	}
	return nil
}

// postVector posts vector get g (stream bytes [g.src, g.src+g.n)): the offered pool's pieces
// of those bytes, at the offered address, into this pool's pieces of them, both lists in the
// offered pool's order (vectorLists).
func (r *rmaReceive) postVector(g rmaRegion, tag transport.Tag, done func(transport.Completion)) (transport.OpID, error) {
	x := r.x
	l := vectorLists{base: r.addr, pool: x.pool}
	if err := l.walk(r.vecSrc, x.plan, g.src, g.n); err != nil {
		return 0, err
	}
	return vectorget.Hooks.PostGetVector(x.eng.tr, x.peer, tag, r.key, l.src, l.dst, done)
}

// vectorLists builds a vector get's two lists, merging each piece into the last where it
// continues it: src at base in the peer's memory, dst in pool. With view set (the peer's pool
// mapped here) it copies each piece instead, out of view into pool, merging pieces that
// continue each other on both sides (flush copies the last); err is the first piece refused.
type vectorLists struct {
	base   uint64
	pool   []byte
	src    []vectorget.Range
	dst    [][]byte
	dstEnd int64

	view       []byte
	ps, pd, pn int64 // the piece not yet copied
	err        error
}

// add appends n bytes at src offset s of the peer's pool and offset d of this one.
func (l *vectorLists) add(s, d, n int64) {
	if l.view != nil {
		if l.pn > 0 && l.ps+l.pn == s && l.pd+l.pn == d {
			l.pn += n
			return
		}
		l.flush()
		l.ps, l.pd, l.pn = s, d, n
		return
	}
	a := l.base + uint64(s)
	if k := len(l.src) - 1; k >= 0 && l.src[k].Addr+uint64(l.src[k].Len) == a {
		l.src[k].Len += int(n)
	} else {
		l.src = append(l.src, vectorget.Range{Addr: a, Len: int(n)})
	}
	if k := len(l.dst) - 1; k >= 0 && l.dstEnd == d {
		start := d - int64(len(l.dst[k]))
		l.dst[k] = l.pool[start : d+n : d+n]
	} else {
		l.dst = append(l.dst, l.pool[d:d+n:d+n])
	}
	l.dstEnd = d + n
}

// flush copies the piece add holds back (view set), unless an earlier one was refused.
func (l *vectorLists) flush() {
	s, d, n := l.ps, l.pd, l.pn
	l.pn = 0
	if n == 0 || l.err != nil {
		return
	}
	if s < 0 || d < 0 || s > int64(len(l.view))-n || d > int64(len(l.pool))-n {
		l.err = fmt.Errorf("%w: a piece of %d bytes at %d of the offered pool (%d bytes), %d of this one (%d)",
			ErrProtocol, n, s, len(l.view), d, len(l.pool))
		return
	}
	copy(l.pool[d:d+n:d+n], l.view[s:s+n:s+n])
}

// walk lists stream bytes [off, off+n) of the two plans in the source pool's order. The kernel
// pins the remote memory of each remote iovec apart, so the remote list is what must merge:
// in layer-major-nhd the stream runs head by head, one 256-byte row of a token at a time,
// while a TP rank's pool holds a token's heads, then the next token's, back to back; in the
// source's order a block's rows merge into one range, where in stream order none would.
//
// The stream is groups (layer, K/V, block) of heads x tokens rows, token innermost (see
// kvplan.UnitOffset); within a range of whole groups each row's offset on either side is a
// group base plus head and token strides, so walk steps through them with no division and
// no sort, the source's smaller stride innermost. Other ranges (or plans whose groups differ)
// go through vectorPieces.
func (l *vectorLists) walk(src, dst *layout.Plan, off, n int64) error {
	ls, ld := src.Layout(), dst.Layout()
	ss, sd := src.Selection(), dst.Selection()
	row, tpb, heads := ls.RowBytes(), ls.TokensPerBlock, ss.Heads()
	group := row * tpb * heads
	nb := int64(len(src.Blocks()))
	if ld.RowBytes() != row || ld.TokensPerBlock != tpb || sd.Heads() != heads || int64(len(dst.Blocks())) != nb ||
		ls.KVFactor != ld.KVFactor || off%group != 0 || n%group != 0 {
		pieces, err := vectorPieces(src, dst, off, n)
		if err != nil {
			return err
		}
		for _, p := range pieces {
			l.add(p.src, p.dst, p.n)
		}
		return nil
	}
	if err := kvplan.CheckRange(src, off, n); err != nil {
		return err
	}
	if err := kvplan.CheckRange(dst, off, n); err != nil {
		return err
	}
	kv := max(ls.KVFactor, 1)
	sb, db := src.Blocks(), dst.Blocks()
	// The inner loop runs over the source's smaller stride; where both sides hold its rows
	// back to back (a token's heads in layer-major-nhd), they go as one piece.
	inner, outer := heads, tpb
	sIn, sOut, dIn, dOut := ls.StrideHead, ls.StrideToken, ld.StrideHead, ld.StrideToken
	if ls.StrideToken <= ls.StrideHead {
		inner, outer = tpb, heads
		sIn, sOut, dIn, dOut = ls.StrideToken, ls.StrideHead, ld.StrideToken, ld.StrideHead
	}
	groups := n / group
	if l.view == nil { // each list sized once: at most a piece per run of rows one side holds back to back
		l.src = slices.Grow(l.src, int(groups*maxPieces(row, inner, outer, sIn, sOut)))
		l.dst = slices.Grow(l.dst, int(groups*maxPieces(row, inner, outer, dIn, dOut)))
	}
	step, span := row, int64(1) // each add: one row, or the inner loop's rows at once
	if sIn == row && dIn == row {
		step, span = inner*row, inner
	}
	for gi := off / group; gi < (off+n)/group; gi++ {
		b, k, layer := gi%nb, (gi/nb)%kv, gi/nb/kv
		sBase := int64(sb[b])*ls.StrideBlock + (ss.LayerBegin+layer)*ls.StrideLayer + k*ls.StrideKV + ss.HeadBegin*ls.StrideHead
		dBase := int64(db[b])*ld.StrideBlock + (sd.LayerBegin+layer)*ld.StrideLayer + k*ld.StrideKV + sd.HeadBegin*ld.StrideHead
		for o := range outer {
			s, d := sBase+o*sOut, dBase+o*dOut
			for i := int64(0); i < inner; i += span {
				l.add(s, d, step)
				s, d = s+span*sIn, d+span*dIn
			}
		}
	}
	return nil
}

// maxPieces is the most pieces one group of rows makes on a side whose inner and outer
// strides are in and out (inner rows of each outer index, row bytes each): one where the
// group lies back to back, one per outer index where only the inner rows do, else one a row.
// Pieces that continue each other across groups merge, so a list needs no more.
func maxPieces(row, inner, outer, in, out int64) int64 {
	switch {
	case in == row && out == inner*row:
		return 1
	case in == row:
		return outer
	}
	return inner * outer
}

// vectorPieces pairs stream bytes [off, off+n) of the two plans piece by piece (pool offsets
// in src and in dst) and orders the pieces by their offset in src. The kernel pins the
// remote memory of each remote iovec apart, so the remote list is what must merge: in
// layer-major-nhd the stream runs head by head, one 256-byte row of a token at a time, but a
// TP rank's pool holds a token's heads, then the next token's, back to back; in the source's
// order a chunk's rows merge into a range per block, where in stream order none would.
func vectorPieces(src, dst *layout.Plan, off, n int64) ([]rmaRegion, error) {
	var a, b []planRun
	if err := kvplan.Runs(src, off, n, func(pool, stream, k int64) { a = append(a, planRun{pool, stream, k}) }); err != nil {
		return nil, err
	}
	if err := kvplan.Runs(dst, off, n, func(pool, stream, k int64) { b = append(b, planRun{pool, stream, k}) }); err != nil {
		return nil, err
	}
	// sortByDst orders by the dst field: the source's offset goes there until sorted.
	pieces := sortByDst(pairRuns(b, a, off))
	for i := range pieces {
		pieces[i].src, pieces[i].dst = pieces[i].dst, pieces[i].src
	}
	return pieces, nil
}
