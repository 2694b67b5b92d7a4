// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"context"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The KV geometry of every request: 2 layers, K and V, 4 KV heads of 32 fp16 values, 16
// tokens a block: 16 KiB a block with every head, 8 KiB with a TP=2 rank's half.
const (
	kvLayers   = 2
	kvHeads    = 4
	kvHeadDim  = 32
	kvElemSize = 2
	kvTokens   = 16
)

func kvLayout(heads, blocks int64) layout.Layout {
	return layout.Packed(layout.Dims{NumLayers: kvLayers, KVFactor: 2, NumHeads: heads, HeadDim: kvHeadDim,
		ElemSize: kvElemSize, TokensPerBlock: kvTokens, NumBlocks: blocks}, layout.BlockMajor)
}

// worker runs requests one after another until ctx ends.
func (s *soak) worker(ctx context.Context, w uint64) {
	r := rand.New(rand.NewPCG(s.cfg.Seed, w))
	fill := rand.NewChaCha8([32]byte{byte(w), byte(w >> 8), byte(s.cfg.Seed), byte(s.cfg.Seed >> 8)})
	for ctx.Err() == nil {
		s.request(r, fill)
	}
}

// side is one handle of a request, with the engine that made it.
type side struct {
	name    string
	eng     *transfer.Engine
	h       *transfer.Handle
	started time.Time
}

// senderShare is one prefill rank's part of a request: its pool, its plan, and the checksum
// of the stream it sends.
type senderShare struct {
	node *node
	plan *layout.Plan
	pool []byte
	sum  uint32
}

// drawRequest draws a request's shape, the same way in the in-process and peer-process soaks:
// its block count (LargeFraction of requests larger than one slot's payload, so they stream
// chunk by chunk), whether two TP=2 prefill ranks feed it, and its deadline (tight reports a
// 1-20 ms one, the deadline fault).
func (c Config) drawRequest(r *rand.Rand) (blocks int64, tp bool, timeout time.Duration, tight bool) {
	payload := c.SlotBytes - transport.DataHeaderBytes
	blockBytes := kvLayout(kvHeads, 1).BlockBytes()
	if r.Float64() < c.LargeFraction {
		blocks = payload/blockBytes + 1 + r.Int64N(6)
	} else {
		blocks = 1 + r.Int64N(max(1, payload/blockBytes-1))
	}
	tp = r.Float64() < c.TPFraction
	timeout = c.TransferTimeout
	if c.has(FaultDeadline) && r.Float64() < c.DeadlineFraction {
		timeout = time.Duration(1+r.IntN(20)) * time.Millisecond
		tight = true
	}
	return blocks, tp, timeout, tight
}

// request runs one request end to end and checks it.
func (s *soak) request(r *rand.Rand, fill *rand.ChaCha8) {
	cfg := s.cfg
	id := transfer.RequestID(s.lastRequest.Add(1))

	nb, tp, timeout, tight := cfg.drawRequest(r)
	if tight {
		s.injected[FaultDeadline].Add(1)
	}
	direct := r.Float64() < cfg.DirectFraction

	s.mu.Lock()
	decode, prefill := s.decode, s.prefill
	s.mu.Unlock()

	// The decode pool gets NumBlocks a little above what the request needs, and the blocks
	// are chosen at random, so plans are scattered.
	dstLayout := kvLayout(kvHeads, nb+2)
	dstPool := make([]byte, dstLayout.SpanBytes())
	dstBlocks := randomBlocks(r, nb, nb+2)
	if direct {
		// Named to the transports for this request only, as a serving process registers its
		// KV pools; forgotten after the request, so a later get with its key is refused.
		decode.mem.AllowDirect(dstPool)
		defer decode.mem.ForgetDirect(dstPool)
	}

	var shares []senderShare
	var subs []transfer.SubSpec
	var recvSpec transfer.Spec
	if tp {
		for i := range 2 {
			src := kvLayout(kvHeads/2, nb+2)
			plan, err := layout.NewPlan(src, src.All(), randomBlocks(r, nb, nb+2))
			must(err)
			dst, err := layout.NewPlan(dstLayout, layout.Selection{LayerEnd: kvLayers, HeadBegin: int64(i) * kvHeads / 2,
				HeadEnd: int64(i+1) * kvHeads / 2}, dstBlocks)
			must(err)
			shares = append(shares, s.share(prefill[i], plan, fill, direct))
			subs = append(subs, transfer.SubSpec{Peer: prefill[i].name, Plan: dst})
		}
		recvSpec = transfer.Spec{ID: id, Subs: subs, Pool: dstPool, Timeout: timeout}
	} else {
		src := kvLayout(kvHeads, nb+2)
		plan, err := layout.NewPlan(src, src.All(), randomBlocks(r, nb, nb+2))
		must(err)
		dst, err := layout.NewPlan(dstLayout, dstLayout.All(), dstBlocks)
		must(err)
		p := prefill[r.IntN(2)]
		shares = append(shares, s.share(p, plan, fill, direct))
		subs = append(subs, transfer.SubSpec{Peer: p.name, Plan: dst})
		recvSpec = transfer.Spec{ID: id, Peer: p.name, Plan: dst, Pool: dstPool, Timeout: timeout}
	}

	// Either side may come first; start them in a random order with a small gap.
	var sides []*side
	start := func(receive bool, sh senderShare) bool {
		var h *transfer.Handle
		var err error
		sd := &side{started: time.Now()}
		if receive {
			sd.name, sd.eng = "receive on "+string(decode.name), decode.eng
			h, err = decode.eng.Receive(context.Background(), recvSpec)
		} else {
			sd.name, sd.eng = "send on "+string(sh.node.name), sh.node.eng
			h, err = sh.node.eng.Send(context.Background(), transfer.Spec{ID: id, Peer: decode.name, Plan: sh.plan,
				Pool: sh.pool, Timeout: timeout})
		}
		switch {
		case err == nil:
			sd.h = h
			sides = append(sides, sd)
			return true
		case errorsIsClosed(err):
			return false // the peer is being restarted
		default:
			s.addBreach(fmt.Sprintf("request %d: %s refused: %v", id, sd.name, err))
			return false
		}
	}
	order := []int{-1}
	for i := range shares {
		order = append(order, i)
	}
	r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	refused := false
	for _, o := range order {
		var ok bool
		if o < 0 {
			ok = start(true, senderShare{})
		} else {
			ok = start(false, shares[o])
		}
		refused = refused || !ok
		if g := r.IntN(3); g > 0 {
			time.Sleep(time.Duration(g) * time.Millisecond)
		}
	}
	if refused {
		s.refused.Add(1)
	}
	if len(sides) == 0 {
		return
	}
	s.started.Add(1)

	// Cancel storm: a share of requests is cancelled at a random point on a random side.
	if cfg.has(FaultCancel) && r.Float64() < cfg.CancelFraction {
		sd := sides[r.IntN(len(sides))]
		time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
		s.recordCancel(sd.eng.Cancel(id).String())
		s.injected[FaultCancel].Add(1)
	}

	for _, sd := range sides {
		s.await(id, sd, timeout)
	}
	var recv *side
	for _, sd := range sides {
		if sd.h != nil && sd.eng == decode.eng {
			recv = sd
		}
	}
	if recv != nil && recv.h != nil {
		switch st := recv.h.Status(); st.State {
		case transfer.Completed:
			s.completed.Add(1)
			s.recordPath(recv.h.Path().String())
			for i, sh := range shares {
				if got := checksum(subs[i].Plan, dstPool); got != sh.sum {
					s.corrupt.Add(1)
					s.addBreach(fmt.Sprintf("request %d: completed, but the bytes from %s have checksum %08x, sent %08x",
						id, sh.node.name, got, sh.sum))
				}
			}
		case transfer.Failed:
			s.failed.Add(1)
		case transfer.Cancelled:
			s.cancelled.Add(1)
		}
	}
	if direct {
		for _, sh := range shares {
			sh.node.mem.ForgetDirect(sh.pool)
		}
	}
	for _, sd := range sides {
		if sd.h == nil {
			continue // wedged: never released, so the engine keeps its id
		}
		if errorsIsQuarantined(sd.h.Status().Err) {
			s.quarantined.Add(1)
		}
		if err := sd.h.Release(); err != nil {
			s.addBreach(fmt.Sprintf("request %d: %s: release: %v", id, sd.name, err))
		}
	}
}

// await waits, bounded, for one handle's outcome and quiescence; a handle that misses either
// bound is wedged, and a quiescent one must be terminal.
func (s *soak) await(id transfer.RequestID, sd *side, timeout time.Duration) {
	doneBy := sd.started.Add(s.doneBound(timeout))
	quietBy := sd.started.Add(s.quiesceBound(timeout))
	if ok, credit := waitCredited(sd.h.Done(), sd.started, doneBy); !ok {
		s.wedged.Add(1)
		st := sd.h.Status()
		path := sd.h.Path()
		s.addBreach(fmt.Sprintf("request %d: %s wedged: no outcome %v after its start (state %v, path %v, %d of %d bytes, err %v)%s%s",
			id, sd.name, s.doneBound(timeout)+credit, st.State, path, st.Bytes, st.Total, st.Err, creditNote(credit),
			lateNote(sd.h.Done(), doneBy.Add(credit), quietBy)))
	}
	if ok, _ := waitCredited(sd.h.Quiesced(), sd.started, quietBy); !ok {
		if sd.h.Status().BlocksPoisoned {
			// L9 on the one-copy path: an operation on the caller's own blocks never said
			// whether it let go, so they are poisoned and the handle never quiesces, by design.
			// It has its outcome; it is counted, and released, as a caller that moves on
			// would: the engine must not forget it (its blocks are never reused).
			s.blocksPoisoned.Add(1)
			s.log.Info("caller's blocks poisoned", zap.Uint64("request", uint64(id)), zap.String("side", sd.name))
			s.releaseUnquiesced(id, sd)
			sd.h = nil
			return
		}
		s.wedged.Add(1)
		s.addBreach(fmt.Sprintf("request %d: %s wedged: not quiescent %v after its start (state %v, path %v, blocks poisoned %v, err %v)",
			id, sd.name, s.quiesceBound(timeout), sd.h.Status().State, sd.h.Path(), sd.h.Status().BlocksPoisoned, sd.h.Status().Err))
		// Give it one more bound before giving up on it for good.
		if !waitUntil(sd.h.Quiesced(), quietBy.Add(s.quiesceBound(timeout))) {
			sd.h = nil
			return
		}
	}
	if st := sd.h.Status(); !st.State.Terminal() {
		s.addBreach(fmt.Sprintf("request %d: %s quiescent in state %v, not terminal", id, sd.name, st.State))
	}
}

// releaseUnquiesced drops the caller's reference to a handle that will never quiesce and checks
// that its engine remembers it: Cancel must still find it and must not say the blocks are free.
func (s *soak) releaseUnquiesced(id transfer.RequestID, sd *side) {
	if err := sd.h.Release(); err != nil {
		s.addBreach(fmt.Sprintf("request %d: %s: release: %v", id, sd.name, err))
		return
	}
	s.releasedUnquiesced.Add(1)
	if out := sd.eng.Cancel(id); out.FreeNow() {
		s.addBreach(fmt.Sprintf("request %d: %s forgotten while not quiescent: after its release Cancel answers %v",
			id, sd.name, out))
	}
}

// waitUntil waits for ch to close until t; it reports whether it closed.
func waitUntil(ch <-chan struct{}, t time.Time) bool {
	select {
	case <-ch:
		return true
	default:
	}
	tm := time.NewTimer(max(time.Until(t), 0))
	defer tm.Stop()
	select {
	case <-ch:
		return true
	case <-tm.C:
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}

// share fills a fresh prefill pool with random bytes and remembers the checksum of the
// stream the plan will send. A direct share's pool is named to its node's transport until
// the request ends.
func (s *soak) share(n *node, plan *layout.Plan, fill *rand.ChaCha8, direct bool) senderShare {
	pool := make([]byte, plan.Layout().SpanBytes())
	_, _ = fill.Read(pool) // ChaCha8.Read never fails
	if direct {
		n.mem.AllowDirect(pool)
	}
	return senderShare{node: n, plan: plan, pool: pool, sum: checksum(plan, pool)}
}

// checksumChunk is how much of a stream checksum gathers at a time: a whole request's stream
// per call was most of the soak's allocation (over 100 GB in a few minutes).
const checksumChunk = 1 << 20

var checksumBufs = sync.Pool{New: func() any { return new([checksumChunk]byte) }}

// checksum is the CRC-32 of the plan's stream gathered out of pool, a chunk at a time.
func checksum(p *layout.Plan, pool []byte) uint32 {
	buf := checksumBufs.Get().(*[checksumChunk]byte)
	defer checksumBufs.Put(buf)
	var sum uint32
	for off, total := int64(0), p.Bytes(); off < total; off += checksumChunk {
		chunk := buf[:min(checksumChunk, total-off)]
		must(native.HostGather(p, pool, off, chunk))
		sum = crc32.Update(sum, crc32.IEEETable, chunk)
	}
	return sum
}

// randomBlocks picks n distinct block ids out of total, in random order.
func randomBlocks(r *rand.Rand, n, total int64) []int32 {
	ids := make([]int32, n)
	for i, b := range r.Perm(int(total))[:n] {
		ids[i] = int32(b)
	}
	return ids
}

// must panics on an error that only a bug in this package can cause (a plan over a layout
// it built itself).
func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("stress: internal error: %v", err))
	}
}
