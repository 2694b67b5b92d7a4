// SPDX-License-Identifier: Apache-2.0

package transfer

// The RMA path's reads in place: where the transport maps the sender's offered pool into this
// process (transport.RMAMapper: UCX over shared memory, for memory UCX allocated), the receiver copies
// the ranges itself, on the engine's mover workers and its own loop, instead of posting gets. A get over UCX
// 1.13's shared memory is a glibc memmove on the transport's worker thread, one range at a
// time per lane, with a command and a completion around each; a copy on the movers runs at the
// host's memcpy rate, in batches, as many at once as the lanes allow. Nothing else changes:
// the ranges are the offer's, every copy ends before the loop posts the read of the
// generation word, and a copy, which cannot be cancelled, ends on its own in bounded time; the
// transfer resolves only once every copy has returned (x.moving), and only then does the view
// of the sender's pool go back.

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// inPlaceBatchBytes is about how many bytes one mover job copies: few enough jobs that their
// hand-offs cost little, enough that every lane has one while another is handed back.
const inPlaceBatchBytes = 8 << 20

// inPlaceLoopBytes is the largest request whose loop copies a share of its ranges read in
// place (copyInPlace): a short request's time is its fixed cost, which a worker's wake-up adds
// to; a large one's jobs keep to the workers, where its loop's copy gained nothing measurable
// on the 2-core host (docs/benchmarks.md, "Where a one-hop 32-token request's time goes").
const inPlaceLoopBytes = 16 << 20

// inPlacePieceBytes is the largest range of a short request read in place (copyShared): small
// enough that a mover that starts late finds most of the request still to share and the last
// range taken ends soon after the others, large enough that taking one is nothing beside
// copying it (a 256 KiB copy takes about 20 us on one core of the 2-core host).
const inPlacePieceBytes = 256 << 10

// inPlaceCrowdedPieceBytes is the range of a short request read in place while other
// transfers run on the engine (Engine.othersActive): their destinations together
// outgrow the cache, and at 1 MiB and more Go's copy on amd64 with AVX (not where it prefers
// REP MOVSB: Intel CPUs with ERMS and FSRM) stores past the cache (non-temporal stores)
// instead of reading each destination line in before writing it. Sixteen 32-token requests
// at once moved 1.5 to 1.9 times the bytes so on the 2-core AMD EPYC VM, where a lone
// request, whose destination the benchmark's rounds keep in the cache, copied faster in
// ranges of inPlacePieceBytes (docs/benchmarks.md, "Sixteen short reads in place at once").
const inPlaceCrowdedPieceBytes = 1 << 20

// inPlaceSplitMin is the smallest job splitForLanes makes outside a share (a request over
// inPlaceLoopBytes, or over one lane): below it a job's hand-off to a mover costs about what
// its copy takes.
const inPlaceSplitMin = 512 << 10

// rmaInPlace is a receiver's state for reading the offered pool in place.
type rmaInPlace struct {
	mapper  transport.RMAMapper
	limit   int    // jobs at once: the transport's lanes (transport.RMALanes), at least 1
	batch   int64  // about how many bytes one job copies (splitForLanes); 0: inPlaceBatchBytes
	view    []byte // the offered pool as mapped here, from the first job on
	release func()
}

// rmaInPlaceLikely (a receiver choosing its path, before any offer) reports whether an RMA
// offer from this peer would be read in place: the RMA mode runs, gets are not emulated, and
// the transport maps peers' memory (whether it maps this sender's pool shows only at the
// offer).
func (x *xfer) rmaInPlaceLikely() bool {
	rt := x.rmaTransport()
	if rt == nil || x.eng.cfg.Tuning.DisableInPlaceReads || !x.peerHas(wire.FeatureRMA) {
		return false
	}
	_, maps := rt.(transport.RMAMapper)
	return maps && !x.getsEmulated(rt)
}

// inPlaceSoon (a Receive, as it starts) reports whether its first copy in place is about
// 55-80 us away, worth a mover's standby (moverPool.standby): its params carry a one-hop
// exposure, so the offer is in hand; the transport maps peers' memory and has more than one
// lane; and the request is short (copyShared), so its loop copies too and would otherwise
// copy alone while a mover wakes, but larger than one range (inPlacePieceBytes): a 128 KiB
// block layer is one range, which its loop copies alone, and a worker readied for it only
// held a core through its window (the 128 KiB row's p99 313-316 us with it, 140-158 us
// without, docs/benchmarks.md, "The mover's standby after the copy").
func (x *xfer) inPlaceSoon() bool {
	if !x.receive || !x.hostPool || x.eng.cfg.Tuning.DisableInPlaceReads || x.plan.Bytes() > inPlaceLoopBytes || x.plan.Bytes() <= inPlacePieceBytes {
		return false
	}
	if _, maps := x.eng.tr.(transport.RMAMapper); !maps {
		return false
	}
	if l, ok := x.eng.tr.(transport.RMALanes); !ok || l.GetLanes() < 2 {
		return false
	}
	e, _, err := x.oneHopSection()
	return err == nil && e != nil
}

// rmaInPlace reports how this receiver may read the offer in place, or nil: gets.
func (x *xfer) rmaInPlace() *rmaInPlace {
	mp, ok := x.eng.tr.(transport.RMAMapper)
	if !ok || x.eng.cfg.Tuning.DisableInPlaceReads || x.dev.set() {
		return nil
	}
	limit := 1
	if l, ok := x.eng.tr.(transport.RMALanes); ok {
		limit = max(1, l.GetLanes())
	}
	return &rmaInPlace{mapper: mp, limit: limit}
}

// mapOffer maps the offered pool here, before the offer's ranges are judged (in place, small
// ones serve). Where it is not mapped (or not as offered) it leaves r.inPlace nil: gets, which
// checkOffer and the transport judge.
func (r *rmaReceive) mapOffer(m *wire.RMAOffer) {
	x := r.x
	if m.PoolBytes <= 0 { // checkOffer says what is wrong with it
		r.inPlace = nil
		return
	}
	view, release, err := r.inPlace.mapper.MapRemote(x.peer, m.Key, m.Addr, int(m.PoolBytes))
	if err != nil || view == nil {
		x.log().Debug("offered pool not mapped here: gets", zap.Error(err))
		r.inPlace = nil
		return
	}
	r.inPlace.view, r.inPlace.release = view, release
}

// othersActive reports whether sub-transfers other than the caller's run on the engine, queued
// or moving (each has its goroutine: liveDrivers): as a short read in place splits its ranges
// (splitForLanes), a sign that the destinations of several requests are being written. The
// admission tokens would not say it: sixteen Receives at once on two cores mostly run one
// after another, each admitted only when its goroutine gets a core.
func (e *Engine) othersActive() bool { return e.liveDrivers.Load() > 1 }

// copyInPlace copies the next ranges out of the sender's mapped pool. A short request's
// (inPlaceLoopBytes or less) all go to one share (copyShared). A large request's go to the
// movers, up to the job size each, unless the jobs in flight are at the limit: the next then
// waits for one to end (moved posts again).
func (r *rmaReceive) copyInPlace() {
	x := r.x
	if x.plan.Bytes() <= inPlaceLoopBytes {
		r.copyShared()
		return
	}
	if x.moving >= r.inPlace.limit {
		return
	}
	batch := r.inPlace.batch
	if batch <= 0 {
		batch = inPlaceBatchBytes
	}
	first, n := x.nextSeq, int64(0)
	for x.nextSeq < x.nChunks && (x.nextSeq == first || n+r.gets[x.nextSeq].n <= batch) {
		n += r.gets[x.nextSeq].n
		x.nextSeq++
	}
	x.toMover(&opRec{seq: first, buf: r.inPlace.view, batch: r.gets[first:x.nextSeq], vec: r.vecSrc})
}

// copyShared copies a short request's ranges on its loop and, where the transport has more
// lanes, on as many more movers at once: every one of them takes the next range nobody has
// taken from one cursor (inPlaceShare), so a mover that starts late copies what is left
// rather than a fixed half the loop would then wait for, and one that starts after the last
// range copies nothing. The loop copies until no range is left, then takes back the shares
// no worker has begun (help): the request waits only for the ranges movers are copying. A
// 128 KiB block layer is one range, and no mover is asked: its copy takes about 10 us on
// one core, less than a mover's wake-up and the event's way back on a busy host.
func (r *rmaReceive) copyShared() {
	x := r.x
	first := x.nextSeq
	s := &inPlaceShare{ranges: r.gets[first:x.nChunks], copyRange: r.copyRange()}
	x.nextSeq = x.nChunks
	for range min(r.inPlace.limit, len(s.ranges)) - 1 {
		x.toMover(&opRec{seq: first, share: s})
	}
	x.moving++ // as toMover counts it: the copy's event settles it (movedDone)
	x.movingPeer++
	if x.standbyFrom != 0 {
		x.eng.movers.standbyLead(time.Duration(time.Now().UnixNano() - x.standbyFrom))
		x.standbyFrom = 0
	}
	x.stamp("loop copy begins")
	x.eng.movers.runHere(x, &opRec{seq: first, share: s})
	x.eng.movers.help(x)
	x.eng.movers.endStandby(x.standbyUntil) // nothing left to take: a worker still waiting sleeps
	x.standbyUntil = 0
	x.stamp("loop copy ended")
}

// copyRange copies one range out of the sender's pool as mapped here into the pool: bytes as
// they are, or a stream chunk's pieces where the layouts differ (rma_vector.go).
func (r *rmaReceive) copyRange() func(rmaRegion) error {
	view, pool := r.inPlace.view, r.x.pool
	if src, dst := r.vecSrc, r.x.plan; src != nil {
		return func(g rmaRegion) error { return copyPieces(src, dst, view, pool, []rmaRegion{g}) }
	}
	e := r.x.eng
	return func(g rmaRegion) error {
		e.copyFromPeer(pool[g.dst:g.dst+g.n], view[g.src:g.src+g.n])
		return nil
	}
}

// copyFromPeer copies src, a range of the peer's memory as mapped here, into dst: every range
// read in place as bytes as they are (copyRange, and the movers' batches, xfer.move) goes
// through it; a vector's pieces (copyPieces) do not. Engine.peerCopy, where a test set it
// before the engine's first transfer, copies instead: the test holds a copy there, mid-read,
// to close an engine under it (TestL1_UCXCloseWaitsForACopyReadingThePeer).
func (e *Engine) copyFromPeer(dst, src []byte) {
	if f := e.peerCopy; f != nil {
		f(dst, src)
		return
	}
	copy(dst, src)
}

// inPlaceShare is a short request's ranges read in place (copyShared), which its loop and its
// movers copy together, each taking the next one from one cursor.
type inPlaceShare struct {
	ranges    []rmaRegion
	next      atomic.Int64 // the first range nobody has taken
	copyRange func(rmaRegion) error
}

// run (a participant: the loop or a mover) takes the next range and copies it until none is
// left or one fails; it returns the ranges it copied, for its event to count (moved), and
// the failure. Any goroutine, any number at once.
func (s *inPlaceShare) run() ([]rmaRegion, error) {
	var copied []rmaRegion
	for {
		i := s.next.Add(1) - 1
		if i >= int64(len(s.ranges)) {
			return copied, nil
		}
		g := s.ranges[i]
		if err := s.copyRange(g); err != nil {
			return copied, err
		}
		copied = append(copied, g)
	}
}

// splitForLanes cuts ranges read in place so that every lane copies a share: a short request's
// (inPlaceLoopBytes or less, over more than one lane) into ranges of at most inPlacePieceBytes,
// or inPlaceCrowdedPieceBytes when crowded (other transfers run: Engine.othersActive),
// which its loop and movers take from one cursor (inPlaceShare); a large request's so that its
// bytes make at least lanes jobs where each would still copy inPlaceSplitMin or more, and no
// job more than inPlaceBatchBytes. It returns the ranges (each inside one of gets, together
// exactly gets' bytes, in order) and the job size copyInPlace batches them by. Every piece
// keeps its range's source and destination offsets, so the checks the ranges passed (the
// offer's, a one-hop read's regions) hold for it.
func splitForLanes(gets []rmaRegion, lanes int, crowded bool) ([]rmaRegion, int64) {
	var total int64
	for _, g := range gets {
		total += g.n
	}
	var batch int64
	switch {
	case lanes > 1 && total <= inPlaceLoopBytes && crowded:
		batch = inPlaceCrowdedPieceBytes
	case lanes > 1 && total <= inPlaceLoopBytes:
		batch = inPlacePieceBytes
	default:
		batch = (total + int64(max(lanes, 1)) - 1) / int64(max(lanes, 1))
		batch = (batch + 4095) &^ 4095 // whole pages, where the ranges allow
		batch = min(max(batch, inPlaceSplitMin), inPlaceBatchBytes)
	}
	cut := false
	for _, g := range gets {
		cut = cut || g.n > batch
	}
	if !cut {
		return gets, batch
	}
	out := make([]rmaRegion, 0, len(gets)+int(total/batch))
	for _, g := range gets {
		for off := int64(0); off < g.n; off += batch {
			out = append(out, rmaRegion{src: g.src + off, dst: g.dst + off, n: min(batch, g.n-off)})
		}
	}
	return out, batch
}

// moved counts ranges copied in place, as completed does a get's.
func (r *rmaReceive) moved(rec *opRec) {
	x := r.x
	for _, g := range rec.batch {
		x.progress(g.n)
	}
	if !r.post(nil) {
		return
	}
	// The last copy back ends the reads: a share's mover that came after the last range
	// copied nothing, and its event may be the last.
	if x.moved < x.nChunks || x.moving > 0 || !r.readGeneration(x) {
		return
	}
	x.receivedAll()
}

// releaseView ends the view of the sender's pool once the transfer has ended (no copy runs).
func (r *rmaReceive) releaseView() {
	if ip := r.inPlace; ip != nil && ip.release != nil {
		ip.release()
		ip.release = nil
	}
}

var _ stagedPath = (*rmaReceive)(nil)
