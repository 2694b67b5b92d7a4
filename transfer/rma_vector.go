// SPDX-License-Identifier: Apache-2.0

package transfer

// The RMA path's vector gets: where a pool holds the stream in pieces too small for one get
// each (under Config.DirectMinRunBytes: a TP=2 rank's half of a token's heads in
// layer-major-nhd is 1 KiB) and the transport reads many ranges of the peer's memory in one
// operation (transport.RMAVectorGets: UCX from a process on this host, by process_vm_readv),
// the receiver takes the RMA mode anyway and reads each chunk of the stream as one vector get:
// the sender's plan's runs over the chunk as the remote list, its own plan's runs as the local
// one. The two lists need not pair up (the transport reads them as one stream each), so
// nothing pairs, sorts or merges a million pieces: each chunk's runs are walked when it is
// posted. Everything else is the RMA path's: the offer, the generation word read after the
// last get, the release, cancel and quarantine.

import (
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// vectorGets returns the engine's transport as a transport.RMAVectorGets where the RMA mode
// runs and this side's pool is host memory, or nil.
func (x *xfer) vectorGets() transport.RMAVectorGets {
	if x.dev.set() || !x.hostPool {
		return nil
	}
	vg, _ := x.rmaTransport().(transport.RMAVectorGets)
	return vg
}

// vectorGetsLikely (a receiver whose pool's pieces are small, choosing its path before any
// offer) reports whether an offer from this peer could be read by vector gets: the peer
// speaks the RMA mode, its gets are not emulated, and the transport says it might (UCX: the
// peer is a process on this host that process_vm_readv may read). The key decides at the
// offer; one that does not prove itself falls back to IOV messages.
func (x *xfer) vectorGetsLikely() bool {
	vg := x.vectorGets()
	if vg == nil || !x.peerHas(wire.FeatureRMA) || x.getsEmulated(vg) {
		return false
	}
	return vg.VectorGets(x.peer, nil)
}

// smallRuns reports whether p's contiguous pieces of the stream are under
// Config.DirectMinRunBytes: too small for a get (or an IOV entry) each.
func (x *xfer) smallRuns(p *layout.Plan) bool {
	return p.RunUnits()*p.Layout().RowBytes() < x.eng.cfg.DirectMinRunBytes
}

// vectorOffer decides whether offer m is read by vector gets: either side's pieces are small
// and the transport reads the offered key that way (transport.RMAVectorGets.VectorGets, which may
// wait for the peer's proof). It returns the offer's plan and the gets, one per chunk of the
// stream (rmaRegion.src and dst are stream offsets then), or a nil plan: gets as usual. A bad
// offer is an *RMAOfferError.
func (x *xfer) vectorOffer(m *wire.RMAOffer) (*layout.Plan, []rmaRegion, error) {
	vg := x.vectorGets()
	if vg == nil {
		return nil, nil, nil
	}
	src, err := x.offerPlan(m)
	if err != nil {
		return nil, nil, err
	}
	if !x.smallRuns(src) && !x.smallRuns(x.plan) {
		return nil, nil, nil
	}
	if !vg.VectorGets(x.peer, m.Key) {
		x.log().Debug("small pieces, but the offered pool cannot be read by vector gets")
		return nil, nil, nil
	}
	total, step := x.plan.Bytes(), x.getBytes()
	gets := make([]rmaRegion, 0, (total+step-1)/step)
	for off := int64(0); off < total; off += step {
		gets = append(gets, rmaRegion{src: off, dst: off, n: min(step, total-off)})
	}
	x.log().Debug("rma offer read by vector gets", zap.Int("gets", len(gets)))
	return src, gets, nil
}

// postVector posts vector get g (stream bytes [g.src, g.src+g.n)): the offered pool's runs
// over them, at the offered address, into this pool's runs over them.
func (r *rmaReceive) postVector(g rmaRegion, tag transport.Tag, done func(transport.Completion)) (transport.OpID, error) {
	x := r.x
	var src []transport.Range
	err := r.vecSrc.Runs(g.src, g.n, func(poolOff, _, n int64) {
		src = append(src, transport.Range{Addr: r.addr + uint64(poolOff), Len: int(n)})
	})
	if err != nil {
		return 0, err
	}
	var dst [][]byte
	err = x.plan.Runs(g.dst, g.n, func(poolOff, _, n int64) {
		dst = append(dst, x.pool[poolOff:poolOff+n:poolOff+n])
	})
	if err != nil {
		return 0, err
	}
	return x.vectorGets().PostGetVector(x.peer, tag, r.key, src, dst, done)
}
