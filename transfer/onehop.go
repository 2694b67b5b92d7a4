// SPDX-License-Identifier: Apache-2.0

package transfer

// One-hop reads (docs/protocol.md, "One-hop reads"): the RMA path with the offer taken out of
// the round trip. An exposure (Expose) whose pool the transport can expose to gets puts what
// an offer would say in its params (the Exposure section) and holds the pool's generation
// word from then on (oneHopHold). A Receive given those params (Spec.Params) checks the
// section as it checks an offer, sends its request (the claim, FlagOneHop) and posts its gets
// at once; the claimed exposure becomes the claimer's rmaSend with the held word and sends no
// offer. Every end is the RMA path's or the exposure's: no state or event is added.

import (
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// oneHopHold is what an exposure handed out in its params' Exposure section: the pool's
// address and key and the generation word, held until the exposure's rmaSend takes it or the
// exposure ends.
type oneHopHold struct {
	addr uint64
	key  []byte
	gen  transport.Exposure // GenAddr, GenKey, Generation
	once sync.Once
	end  func()
}

// oneHopParams is the Spec.Params of a transport that can say what they expose
// (*ucx.ContextParams).
type oneHopParams interface {
	OneHop() (*transport.Exposure, *layout.Plan, error)
}

// prepareOneHop (Expose, before its params are made) takes the pool's key and a generation
// word for the params' Exposure section, and returns the section; nil where a one-hop read
// cannot be offered (no gets or no generation words on the transport, rma off, a device or
// Mover pool, a streaming send, every word held: counted as a generation decline).
func (x *xfer) prepareOneHop() *transport.Exposure {
	rt := x.rmaTransport()
	g := x.rmaGenerations()
	if rt == nil || g == nil || x.eng.cfg.noOneHop || !x.hostPool || x.stream || len(x.pool) == 0 {
		return nil
	}
	span := x.plan.Layout().SpanBytes()
	if span <= 0 || span > int64(len(x.pool)) {
		return nil
	}
	addr, key, err := rt.RMAKey(x.pool)
	if err != nil {
		return nil // a pool the transport did not register: the claim gets no offer either
	}
	gaddr, gkey, value, end, err := g.ExposeGeneration()
	if err != nil {
		x.noGenerationWord(err)
		return nil
	}
	x.oneHop = &oneHopHold{addr: addr, key: key, end: end,
		gen: transport.Exposure{GenAddr: gaddr, GenKey: gkey, Generation: value}}
	return &transport.Exposure{Addr: addr, Key: key, Regions: [][2]uint64{{addr, uint64(span)}},
		GenAddr: gaddr, GenKey: gkey, Generation: value}
}

// endOneHop ends the held generation word, once: before the exposure's blocks are reported
// quiescent when nobody claimed it, or when its claim took another path. A read that raced
// it reads the changed word after its last get and fails (ErrStaleRead). Any goroutine.
func (x *xfer) endOneHop() {
	if h := x.oneHop; h != nil {
		h.once.Do(h.end)
	}
}

// oneHopOffer (a Receive) is the offer its Spec.Params' Exposure section stands for, with
// the regions every get must lie in; nil where the params carry none.
func (x *xfer) oneHopOffer() (*wire.RMAOffer, [][2]uint64, error) {
	e, src, err := x.oneHopSection()
	if err != nil || e == nil {
		return nil, nil, err
	}
	return &wire.RMAOffer{Header: x.head(), Flags: wire.RMAValidated, Addr: e.Addr, PoolBytes: kvplan.PoolSpan(src),
		Layout: src.Layout(), Selection: src.Selection(), Blocks: src.Blocks(), Key: e.Key,
		GenAddr: e.GenAddr, GenKey: e.GenKey, Generation: e.Generation}, e.Regions, nil
}

// oneHopSection is the Exposure section of a Receive's Spec.Params and the sender's plan,
// parsed on the first ask (Engine.start's, inPlaceSoon) and kept for the loop's.
func (x *xfer) oneHopSection() (*transport.Exposure, *layout.Plan, error) {
	if x.section == nil {
		x.section = &parsedSection{}
		if p, ok := x.params.(oneHopParams); ok && !x.eng.cfg.noOneHop {
			x.section.e, x.section.src, x.section.err = p.OneHop()
		}
	}
	return x.section.e, x.section.src, x.section.err
}

// parsedSection is what oneHopSection parsed.
type parsedSection struct {
	e   *transport.Exposure
	src *layout.Plan
	err error
}

// checkRegions refuses gets from addr that leave every region of an exposure.
func checkRegions(addr uint64, gets []rmaRegion, regions [][2]uint64) error {
	for _, g := range gets {
		at, n := addr+uint64(g.src), uint64(g.n)
		inside := false
		for _, r := range regions {
			if at >= r[0] && at-r[0] <= r[1] && n <= r[1]-(at-r[0]) {
				inside = true
				break
			}
		}
		if !inside {
			return &rmaOfferError{Field: "Regions", Reason: fmt.Sprintf("a get of [%#x, +%d) lies in no exposed region", at, n)}
		}
	}
	return nil
}
