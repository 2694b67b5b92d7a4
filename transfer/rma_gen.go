// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
)

// RMAGenerations is an optional extension of RMATransport that makes the RMA mode's reads
// validated. The rule, which both engines keep:
//
//  1. The sender gives each exposure a generation word (ExposeGeneration) and names it in its
//     offer, with the value it holds.
//  2. Before the exposed blocks may be reused or released (the exposure ends, for whatever
//     reason: the receiver's Done or release, its decline, or a report that it is lost) the
//     sender ends the generation: the word changes, for good, to a value no exposure has.
//  3. The receiver, after every data get has completed, reads the word with a fence in
//     between (PostReadGeneration) and completes only if it still holds the offered value.
//     Otherwise the transfer fails with a *StaleReadError and nothing completes.
//
// A get that read a block after the sender let it go therefore always precedes a read of the
// changed word: a receiver the sender believed gone (a keepalive false alarm, a worker that
// was replaced) can no longer complete with bytes that changed under it. UCXTransport and
// MemTransport implement it. A sender whose transport does not offers unvalidated reads; a
// receiver whose transport does not declines a validated offer, and the transfer runs on IOV
// messages instead.
type RMAGenerations interface {
	// ExposeGeneration gives one exposure a generation word that peers can read: its
	// address, the packed remote key of the region holding it, and its value, which no other
	// exposure of this transport ever had. end changes the word to a value no exposure has
	// and frees it for another exposure; it must run before the exposed blocks are reused or
	// released, and runs once.
	ExposeGeneration() (addr uint64, key []byte, value uint64, end func(), err error)
	// PrepareReadGeneration readies a later PostReadGeneration from peer from with key (UCX
	// unpacks the key now, while the peer is known to answer, as it does the pool's key at the
	// first get). The receiver calls it when it accepts a validated offer.
	PrepareReadGeneration(from Peer, key []byte) error
	// PostReadGeneration reads the 8-byte generation word at addr of peer from (key as the
	// peer's ExposeGeneration gave it) after every get this transport posted to from before
	// it, with a fence in between, and reports the word's value with the operation's final
	// completion. The callback rules of Transport hold.
	PostReadGeneration(from Peer, tag Tag, key []byte, addr uint64, done func(c Completion, value uint64)) (OpID, error)
}

// ErrStaleRead: a receiver's RMA gets may have read blocks the sender had already let go
// (its exposure's generation changed before the receiver checked it): the transfer fails,
// and the bytes it wrote must not be used. The error is a *StaleReadError.
var ErrStaleRead = errors.New("kvxfer: rma read of blocks the sender no longer exposed")

// StaleReadError says which generation the offer named and which the receiver read. It
// matches ErrStaleRead.
type StaleReadError struct {
	Offered, Read uint64
}

// Error implements error.
func (e *StaleReadError) Error() string {
	return fmt.Sprintf("%v: the offer named generation %d, the sender's word held %d after the gets", ErrStaleRead, e.Offered, e.Read)
}

// Is matches ErrStaleRead.
func (e *StaleReadError) Is(target error) bool { return target == ErrStaleRead }

// rmaGenerations returns the engine's transport as an RMAGenerations, when it is one.
func (x *xfer) rmaGenerations() RMAGenerations {
	g, _ := x.eng.tr.(RMAGenerations)
	return g
}

// exposeGeneration (the sender, before it offers) names a generation word in o. Without one
// the offer goes unvalidated.
func (x *xfer) exposeGeneration(o *RMAOffer) error {
	g := x.rmaGenerations()
	if g == nil {
		return nil
	}
	addr, key, value, end, err := g.ExposeGeneration()
	if err != nil {
		return fmt.Errorf("kvxfer: a generation word for the exposure: %w", err)
	}
	o.Flags |= RMAValidated
	o.GenAddr, o.GenKey, o.Generation = addr, key, value
	x.rma.endGen = end
	return nil
}

// endExposure (the sender) ends the pool's exposure: no read of the receiver's may complete
// after this, so the generation ends before the transfer can resolve and its blocks be reused.
func (x *xfer) endExposure() {
	x.rma.exposure.final = true
	x.outstanding--
	if x.rma.endGen != nil {
		x.rma.endGen()
		x.rma.endGen = nil
	}
}

// readGeneration (the receiver, after its last get) reads the sender's generation word. It
// reports false when the check was posted (or the transfer is aborting), true when the offer
// was not validated and the transfer may complete now.
func (x *xfer) readGeneration() bool {
	if x.rma.genKey == nil || x.aborting {
		return !x.aborting
	}
	rec := &opRec{seq: -1}
	x.rma.genRec = rec
	id, err := x.rmaGenerations().PostReadGeneration(x.peer, Tag{Request: x.h.id, Sub: x.wireSub, Seq: uint32(x.nChunks)},
		x.rma.genKey, x.rma.genAddr, func(c Completion, value uint64) {
			rec.gen = value
			x.box.push(event{op: rec, c: c})
		})
	if err != nil {
		x.abort(transportErr(err), AbortInternal, x.eng.cfg.CancelGrace)
		return false
	}
	rec.id = id
	x.ops = append(x.ops, rec)
	x.outstanding++
	return false
}

// gotGeneration compares the word the receiver read with the offer's generation.
func (x *xfer) gotGeneration(value uint64) {
	if value != x.rma.gen {
		x.abort(&RequestError{ID: x.h.id, Err: &StaleReadError{Offered: x.rma.gen, Read: value}}, AbortProtocol, x.eng.cfg.CancelGrace)
		return
	}
	x.rma.genKey = nil // checked
	x.receivedAll()
}
