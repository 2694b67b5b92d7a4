// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package stress

// Fault hung-peer: a prefill process hangs past decode's deadline and is then killed, as a
// supervisor kills a hung pod (docs/deploy.md, "A frozen peer, restarted by these probes").
// Decode's transfers with it pass their deadline while it is stopped, and those whose
// operations it holds (an exposure it reads, a message it had begun) quarantine; its death
// ends those operations, so the loss must end the transfers, with nothing poisoned.

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/transferdefaults"
	"github.com/kvxfer/kvxfer/transfer"
)

// hungPeerLossBound is how long after the kill decode has to hear that the hung peer is lost
// and to end every handle with it: the bound the dead-peer fault gives decode to hear of a
// killed peer (docs/ucx.md, "A killed peer: how soon it is lost", measures about one
// keepalive interval, 200 ms here).
const hungPeerLossBound = 5 * time.Second

// hungPoisonSlack is how long after decode's observer heard of the loss a poison of a handle
// with the lost peer may still be its quarantine's own: the engine tells the observer first
// and then hands the loss to each transfer, and a quarantine whose clock ran out in between
// poisons by design (L9). Later than that (plus what this process stalled meanwhile), the
// loss should have ended the transfer.
const hungPoisonSlack = 250 * time.Millisecond

// hungFor is how long the hung-peer fault keeps its peer stopped: past decode's deadline and
// cancel grace, so that even a transfer started as the peer stopped has aborted and
// quarantined by the kill, and a quarter of QuarantineTimeout more, so that the kill (and the
// loss, which decode hears within tens of milliseconds here) comes well before that
// transfer's quarantine runs out.
func (c Config) hungFor() time.Duration {
	return c.TransferTimeout + transferdefaults.CancelGrace + c.QuarantineTimeout/4
}

// hungEndSlack is how long after decode heard the hung peer was lost every handle with it must
// have quiesced: the loss ends them at once, but for a transfer not yet aborting an abort's
// cancel grace and the transport's reports of its operations' ends (0.22 s at most after the
// kill on this 2-core VM, under -race). A quarter of QuarantineTimeout: a transfer
// quarantined while the peer hung and left to its quarantine's clock (the defect this fault
// was made for) ends only QuarantineTimeout after its quarantine began, later than that for
// every transfer quarantined in the last three quarters of it before the loss.
func (c Config) hungEndSlack() time.Duration { return c.QuarantineTimeout / 4 }

// hungWatch follows decode's handles for the hung-peer fault: those in flight and their peers,
// those a hung peer had (by its fault), and decode's poisons of them.
type hungWatch struct {
	on bool // fault hung-peer enabled; nothing is tracked otherwise

	mu       sync.Mutex
	inflight map[transfer.RequestID]hungTracked
	now      *hungEvent                        // the fault in progress, or nil
	of       map[transfer.RequestID]*hungEvent // every handle a hung peer had
	poisons  map[transfer.RequestID]hungPoison // the latest poison of each of those
	events   []*hungEvent

	longest atomic.Int64 // nanoseconds: the longest from a kill to decode's last handle with the peer quiescent
}

// hungTracked is one of decode's handles, with its route and peers.
type hungTracked struct {
	h     *transfer.Handle
	route Route
	peers []transfer.Peer
}

// hungEvent is one hung peer: who, decode's handles with it, when it was killed and when
// decode heard it was lost (zero if it never did).
type hungEvent struct {
	peer        transfer.Peer
	what        string
	handles     map[transfer.RequestID]hungTracked
	killedAt    time.Time
	lossAt      time.Time
	quarantined int // of the handles, those in quarantine at the kill
}

// hungPoison is a poison decode's observer heard, and what this process stalled between the
// kill and it.
type hungPoison struct {
	at      time.Time
	slot    int // -1: the caller's blocks of a one-copy transfer
	reason  string
	stalled time.Duration
}

func newHungWatch(on bool) *hungWatch {
	return &hungWatch{on: on, inflight: map[transfer.RequestID]hungTracked{}, of: map[transfer.RequestID]*hungEvent{},
		poisons: map[transfer.RequestID]hungPoison{}}
}

// track notes a handle decode just started with the given peers; untrack (after its
// release) forgets it. A handle with the peer hung now joins that peer's fault.
func (w *hungWatch) track(id transfer.RequestID, h *transfer.Handle, route Route, peers ...*procPeer) {
	if !w.on {
		return
	}
	t := hungTracked{h: h, route: route}
	for _, p := range peers {
		t.peers = append(t.peers, p.name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inflight[id] = t
	if w.now != nil && t.has(w.now.peer) {
		w.now.handles[id] = t
		w.of[id] = w.now
	}
}

func (w *hungWatch) untrack(id transfer.RequestID) {
	if !w.on {
		return
	}
	w.mu.Lock()
	delete(w.inflight, id)
	w.mu.Unlock()
}

func (t hungTracked) has(peer transfer.Peer) bool { return slices.Contains(t.peers, peer) }

// begin starts following p's handles on decode: those in flight now, and those started until
// end.
func (w *hungWatch) begin(p *procPeer) *hungEvent {
	ev := &hungEvent{peer: p.name, what: fmt.Sprintf("peer %d.gen%d", p.idx, p.gen), handles: map[transfer.RequestID]hungTracked{}}
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, t := range w.inflight {
		if t.has(p.name) {
			ev.handles[id] = t
			w.of[id] = ev
		}
	}
	w.now = ev
	w.events = append(w.events, ev)
	return ev
}

func (w *hungWatch) end() {
	w.mu.Lock()
	w.now = nil
	w.mu.Unlock()
}

// killed records the kill; it returns how many handles decode had with the peer, and how
// many of them were in quarantine then.
func (w *hungWatch) killed(ev *hungEvent, at time.Time) (handles, quarantined int) {
	hs := w.handles(ev)
	for _, t := range hs {
		if t.h.Status().State == transfer.Quarantined {
			quarantined++
		}
	}
	w.mu.Lock()
	ev.killedAt, ev.quarantined = at, quarantined
	w.mu.Unlock()
	return len(hs), quarantined
}

func (w *hungWatch) heardLoss(ev *hungEvent, at time.Time) {
	w.mu.Lock()
	ev.lossAt = at
	w.mu.Unlock()
}

// handles is a copy of the peer's handles so far.
func (w *hungWatch) handles(ev *hungEvent) map[transfer.RequestID]hungTracked {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(ev.handles)
}

// poisoned is decode's node's poison hook: it keeps the poisons of handles a hung peer had.
func (w *hungWatch) poisoned(id transfer.RequestID, slot int, reason string) {
	if !w.on {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	ev, ok := w.of[id]
	if !ok {
		return
	}
	po := hungPoison{at: now, slot: slot, reason: reason}
	if !ev.killedAt.IsZero() {
		po.stalled = processStalls().since(ev.killedAt)
	}
	w.poisons[id] = po
}

// hangPeer (fault hung-peer) stops prefill process i with SIGSTOP for hungFor, so decode's
// transfers with it pass their deadline and those whose operations it holds quarantine; then
// kills it with SIGKILL, before their quarantine can run out, and starts it again, as a
// supervisor restarts a hung pod. Decode must end every handle it had with the peer within
// hungPeerLossBound of the kill (awaitHungHandles) and poison nothing of theirs once it heard
// of the loss (checkHungPoisons).
func (ps *procSoak) hangPeer(i int) {
	ps.peerMu.Lock()
	p := ps.peers[i]
	ps.peerMu.Unlock()
	if p == nil {
		return
	}
	ev := ps.hung.begin(p)
	defer ps.hung.end()
	hold := ps.cfg.hungFor()
	t0 := time.Now()
	if err := p.child.Signal(syscall.SIGSTOP); err != nil {
		ps.addBreach(fmt.Sprintf("hung-peer: SIGSTOP to %s: %v", ev.what, err))
		return
	}
	ps.injected[FaultHungPeer].Add(1)
	ps.log.Info("peer hung (SIGSTOP)", zap.Int("peer", i), zap.Int("gen", p.gen), zap.Duration("for", hold))
	time.Sleep(time.Until(t0.Add(hold)))
	ps.peerMu.Lock()
	ps.peers[i] = nil // requests started from now on are refused until the restart
	ps.peerMu.Unlock()
	dec := ps.decodeNode()
	// SIGKILL alone: Child.Kill sends SIGCONT first, which could let the hung process run, and
	// answer, for a moment before it dies.
	killedAt := time.Now()
	_ = p.child.Signal(syscall.SIGKILL)
	handles, quarantined := ps.hung.killed(ev, killedAt)
	ps.log.Info("hung peer killed (SIGKILL)", zap.Int("peer", i), zap.Int("handles", handles), zap.Int("quarantined", quarantined))
	if !p.child.Reap(peerReapBound) {
		ps.addBreach(fmt.Sprintf("hung-peer: %s still running %v after SIGKILL", ev.what, peerReapBound))
	}
	checked := make(chan struct{})
	go func() { defer close(checked); ps.awaitHungHandles(ev, dec) }()
	ps.replacePeer(i, p.gen+1, "hung-peer: restarting peer")
	<-checked
	ps.awaitRecovery(fmt.Sprintf("the restart of hung peer %d", i), time.Now())
}

// awaitHungHandles waits, bounded, for decode to hear the killed peer is lost, and then for
// every handle decode had with it to quiesce within hungEndSlack of that: the loss ends them
// (an abort's grace, the ends the transport reports), where a quarantine's own clock would
// take up to three quarters of QuarantineTimeout more. A handle whose blocks were poisoned
// never quiesces, by design (L9); checkHungPoisons judges whether its poison came before the
// loss.
func (ps *procSoak) awaitHungHandles(ev *hungEvent, dec *node) {
	lossAt, by := ev.killedAt, ev.killedAt.Add(hungPeerLossBound) // decode never heard: the latest they may end
	if ok, credit := waitCredited(dec.peerLost(ev.peer), ev.killedAt, by); ok {
		lossAt, _ = dec.heardLostAt(ev.peer)
		by = lossAt.Add(ps.cfg.hungEndSlack())
		ps.hung.heardLoss(ev, lossAt)
	} else {
		ps.addBreach(fmt.Sprintf("hung-peer: decode did not hear within %v of its kill that %s, killed after it hung, was lost%s",
			hungPeerLossBound, ev.what, creditNote(credit)))
	}
	var last time.Duration // when the last of them quiesced: waited on in turn, each returns as it closes
	for id, t := range ps.hung.handles(ev) {
		if t.h.Status().BlocksPoisoned {
			continue
		}
		ok, credit := waitCredited(t.h.Quiesced(), lossAt, by)
		if !ok {
			st := t.h.Status()
			if st.BlocksPoisoned {
				continue // its quarantine ran out meanwhile: checkHungPoisons judges when
			}
			ps.addBreach(fmt.Sprintf("hung-peer: request %d (route %s, %d sender(s)) on decode not quiescent %v after decode heard that %s, hung past its deadline and killed, was lost: the loss ends it (state %v, path %v, %d of %d bytes, blocks poisoned %v, err %v)%s",
				id, t.route, len(t.peers), by.Add(credit).Sub(lossAt).Round(time.Millisecond), ev.what, st.State, t.h.Path(), st.Bytes, st.Total,
				st.BlocksPoisoned, st.Err, creditNote(credit)))
			continue
		}
		last = max(last, time.Since(ev.killedAt))
	}
	storeMax(&ps.hung.longest, last)
	ps.log.Info("hung peer's handles on decode quiescent", zap.String("peer", ev.what), zap.Duration("lost_after", lossAt.Sub(ev.killedAt)),
		zap.Duration("last_quiescent_after", last))
}

// checkHungPoisons, once every handle ended, judges decode's poisons of the handles a hung
// peer had: one that came after decode heard the peer was lost (beyond hungPoisonSlack and
// what this process stalled) is a breach: the loss ended every operation with the peer, so
// nothing of that transfer was unknown any more. One that came before (a quarantine that ran
// out while the peer was stopped) is L9's, counted.
func (ps *procSoak) checkHungPoisons() (beforeLoss int64) {
	w := ps.hung
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, po := range w.poisons {
		ev := w.of[id]
		if ev.killedAt.IsZero() {
			continue // the fault ended before its kill (its SIGSTOP failed), breached already
		}
		loss := ev.lossAt
		if loss.IsZero() {
			loss = ev.killedAt // decode never heard (a breach already): the kill is the latest it may count from
		}
		if late := po.at.Sub(loss); late > hungPoisonSlack+po.stalled {
			what := fmt.Sprintf("staging slot %d", po.slot)
			if po.slot < 0 {
				what = "the caller's blocks"
			}
			t := ev.handles[id]
			ps.addBreach(fmt.Sprintf("hung-peer: decode poisoned %s of request %d (route %s, %d sender(s)) %v after it heard that %s, killed after it hung, was lost: the loss ends every operation with it%s (%s)",
				what, id, t.route, len(t.peers), late.Round(time.Millisecond), ev.what, creditNote(po.stalled), po.reason))
			continue
		}
		beforeLoss++
	}
	return beforeLoss
}

// fillHung adds the hung-peer fault's figures to the report.
func (ps *procSoak) fillHung(r *Report, poisonedBeforeLoss int64) {
	w := ps.hung
	if !w.on {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	r.HungPeerHandles = map[string]int64{}
	for _, ev := range w.events {
		for _, t := range ev.handles {
			r.HungPeerHandles[string(t.route)]++
		}
		r.HungPeerQuarantined += int64(ev.quarantined)
	}
	r.HungPeerPoisonedBeforeLoss = poisonedBeforeLoss
	r.LongestHungPeerQuiesceSeconds = time.Duration(w.longest.Load()).Seconds()
}
