// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer/health"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// ErrStaleRead: a receiver's RMA gets may have read blocks the sender had already let go
// (its exposure's generation changed before the receiver checked it): the transfer fails,
// and the bytes it wrote must not be used. The error names the offered
// and the read generation words.
var ErrStaleRead = errors.New("kvxfer: rma read of blocks the sender no longer exposed")

// staleReadError says which generation the offer named and which the receiver read. It
// matches ErrStaleRead.
type staleReadError struct {
	Offered, Read uint64
}

// Error implements error.
func (e *staleReadError) Error() string {
	return fmt.Sprintf("%v: the offer named generation %d, the sender's word held %d after the gets", ErrStaleRead, e.Offered, e.Read)
}

// Is matches ErrStaleRead.
func (e *staleReadError) Is(target error) bool { return target == ErrStaleRead }

// rmaGenerations returns the engine's transport as an transport.RMAGenerations, when it is one.
func (x *xfer) rmaGenerations() transport.RMAGenerations {
	if x.eng.gets() == nil { // a word is read with a get: none on a transport without them
		return nil
	}
	g, _ := x.eng.tr.(transport.RMAGenerations)
	return g
}

// exposeGeneration (the sender, before it offers) names a generation word in o. Without one
// the offer goes unvalidated.
func (s *rmaSend) exposeGeneration(o *wire.RMAOffer) error {
	g := s.x.rmaGenerations()
	if g == nil {
		return nil
	}
	addr, key, value, end, err := g.ExposeGeneration()
	if err != nil {
		s.x.noGenerationWord(err)
		return fmt.Errorf("kvxfer: a generation word for the exposure: %w", err)
	}
	o.Flags |= wire.RMAValidated
	o.GenAddr, o.GenKey, o.Generation = addr, key, value
	s.endGen = end
	return nil
}

// noGenerationWord counts and logs an offer about to be declined because every generation word
// of the transport is held: the transfer falls back to messages, which Health and the log
// must not keep quiet about.
func (x *xfer) noGenerationWord(err error) {
	if !errors.Is(err, transport.ErrNoGenerationWord) {
		return
	}
	x.eng.genDeclines.Add(1)
	x.log().Warn("offer declined: every generation word of the transport is held; the transfer falls back to messages", zap.Error(err))
}

// generationHealth fills s's generation word counts and returns why they make the engine
// unhealthy, or "": every word held, so each rma or pull offer is declined until one comes
// back (the words of exposures that end, or that were poisoned for good, do).
func (e *Engine) generationHealth(s *health.Numbers) string {
	s.GenerationDeclines = e.genDeclines.Load()
	gw, ok := e.tr.(transport.GenerationWords)
	if !ok {
		return ""
	}
	s.GenerationWordsHeld, s.GenerationWords = gw.GenerationWords()
	if s.GenerationWords == 0 || s.GenerationWordsHeld < s.GenerationWords {
		return ""
	}
	return fmt.Sprintf("all %d generation words held: rma and pull offers are declined and fall back to messages (%d declined so far)",
		s.GenerationWords, s.GenerationDeclines)
}

// endExposure (the sender) ends the pool's exposure: no read of the receiver's may complete
// after this, so the generation ends before the transfer can resolve and its blocks be reused.
func (s *rmaSend) endExposure() {
	s.exposure.final = true
	s.x.outstanding--
	s.endGeneration()
}

// endGeneration ends the exposure's generation, once: when the exposure ends, or when the
// transfer has ended without that (its exposure poisoned for good: the blocks are never
// reused, so the word may change now, and a late read of it fails the receiver). An
// exposure that kept its word for good would leak it, and with every word held each later
// offer is declined.
func (s *rmaSend) endGeneration() {
	if s.endGen != nil {
		s.endGen()
		s.endGen = nil
	}
}

// genCheck is a receiver's check of a validated offer's generation word, on the RMA path and
// the pull wire alike: the word's address, key and offered value, and the read once posted.
// genKey nil: nothing (more) to check.
type genCheck struct {
	gen, genAddr uint64
	genKey       []byte
	genRec       *opRec
}

// readGeneration (the receiver, after its last read) reads the sender's generation word, fenced
// behind every get to the sender. Where the transport maps the word here (as it maps pools read
// in place), the loop reads it at once and judges it: no operation, no report through the
// transport's goroutine and back. It reports false when the check was posted, found the word
// changed (the transfer aborts) or the transfer is aborting; true when there is nothing (more)
// to check and the transfer may complete now.
func (g *genCheck) readGeneration(x *xfer) bool {
	if g.genKey == nil || x.aborting {
		return !x.aborting
	}
	if v, ok := g.readMapped(x); ok {
		return g.judge(x, v)
	}
	rec := &opRec{seq: -1}
	g.genRec = rec
	id, err := x.rmaGenerations().PostReadGeneration(x.peer, transport.Tag{Request: x.h.id, Sub: x.wireSub, Seq: uint32(x.nChunks)},
		g.genKey, g.genAddr, func(c transport.Completion, value uint64) {
			rec.gen = value
			x.box.Push(event{op: rec, c: c})
		})
	if err != nil {
		x.abort(transportErr(err), wire.AbortInternal, x.eng.cfg.Tuning.CancelGrace)
		return false
	}
	rec.id = id
	x.ops = append(x.ops, rec)
	x.outstanding++
	return false
}

// gotGeneration handles rec if it is the read of the word: the transfer completes when the
// word still holds the offered value and fails with an ErrStaleRead otherwise. It reports
// whether rec was that read.
func (g *genCheck) gotGeneration(x *xfer, rec *opRec) bool {
	if rec != g.genRec {
		return false
	}
	if g.judge(x, rec.gen) {
		x.receivedAll()
	}
	return true
}

// judge checks the word's value read after the last read: the offered one, and the transfer
// may complete (true); another, and it fails with an ErrStaleRead.
func (g *genCheck) judge(x *xfer, read uint64) bool {
	if read != g.gen {
		x.abort(&requestError{ID: x.h.id, Err: &staleReadError{Offered: g.gen, Read: read}}, wire.AbortProtocol, x.eng.cfg.Tuning.CancelGrace)
		return false
	}
	g.genKey = nil // checked
	return true
}

// readMapped reads the generation word where the transport maps the sender's word into this
// process (transport.RMAMapper: UCX over shared memory, which reads a mapped word so inside
// PostReadGeneration too), unless in-place reads are off or the pool is a device's: ok false
// and the word is read with a get. Every read of the transfer has completed before (its gets'
// final reports, its copies' events came back through the mailbox, whose lock orders them
// before this load), so no fence is needed.
func (g *genCheck) readMapped(x *xfer) (value uint64, ok bool) {
	mp, isMapper := x.eng.tr.(transport.RMAMapper)
	if !isMapper || x.eng.cfg.Tuning.DisableInPlaceReads || x.dev.set() || g.genAddr%8 != 0 {
		return 0, false
	}
	view, release, err := mp.MapRemote(x.peer, g.genKey, g.genAddr, 8)
	if err != nil || len(view) < 8 {
		if release != nil {
			release()
		}
		return 0, false // the get says what is wrong with the word, if anything
	}
	value = atomic.LoadUint64((*uint64)(unsafe.Pointer(unsafe.SliceData(view))))
	release()
	return value, true
}
