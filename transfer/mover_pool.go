// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// moverPool runs the staging path's gathers and scatters off the transfers' loops, on at most
// GOMAXPROCS goroutines per engine: while a transfer's loop posts chunk i and handles the
// wire's completions, its chunks i+1 (gather) or i-1 (scatter) are being copied. A worker
// starts when a copy is queued, none is idle and fewer than the limit run; it then waits for
// the next copy until the engine closes (close), so a steady stream of chunks starts no
// goroutine per chunk. After close a worker ends once the queue is empty. Each finished copy
// goes back to its transfer as a mailbox event (event.moved), which the loop settles: the slot
// is the transfer's again.
//
// Engine.Close fences the pool before it closes the transport, which may unmap the memory the
// copies touch (its staging slots, pools it allocated, peers' slots mapped here): from then on
// a copy not yet begun is refused (it comes back failed, having touched nothing), and fence
// waits, bounded, for the copies still running.
type moverPool struct {
	mu      sync.Mutex
	wake    sync.Cond
	jobs    []moveJob // FIFO: head at jobs[head]
	head    int
	running int // workers
	idle    int
	limit   int
	closed  bool
	// busy counts copies running now; fenced refuses new ones; quiet, made by a fence that
	// found copies running, closes when busy drops to zero.
	busy   int
	fenced bool
	quiet  chan struct{}
	// standbyUntil (Unix ns): until then a worker that finds no copy waits for one awake,
	// yielding its P, instead of asleep (standby, for standbyFor: standbySpin); spinning
	// counts the workers that do, which a queued copy needs no wake for. wakes counts the
	// wakes of sleeping workers, standbys the standby windows opened or extended.
	standbyFor   time.Duration
	lead         time.Duration // the moving average of standbyLead's leads; 0: none yet
	standbyUntil int64
	spinning     int
	wakes        int
	standbys     int
}

// standbySpin is the longest a worker readied by standby waits awake for its copy, and the
// window before any copy came after a standby: the time from a one-hop Receive's start to its
// first copy was 55-80 us at the median on the 2-core Xeon VM when quiet, 25-35 us on the
// AMD EPYC one (docs/benchmarks.md). After the first, the window is twice the leads' moving
// average (standbyLead), at least standbyMin: a window much longer than the lead kept a core
// from the request's own threads, and its p99 (the 32-token row's 2.25-2.59 times its p50
// with 250 us on the AMD VM, 1.79-2.17 with 60, docs/benchmarks.md, "The mover's standby").
const standbySpin = 250 * time.Microsecond

// standbyMin is the shortest standby window: a lead measured short once is not a promise.
const standbyMin = 20 * time.Microsecond

// moveJob is one copy: a gather of rec's chunk into its slot (sender) or a scatter of its
// payload out of it (receiver).
type moveJob struct {
	x   *xfer
	rec *opRec
}

func newMoverPool() *moverPool {
	p := &moverPool{limit: max(1, runtime.GOMAXPROCS(0)), standbyFor: standbySpin}
	p.wake.L = &p.mu
	return p
}

// submit queues a copy; it never blocks. After fence the copy is refused at once.
func (p *moverPool) submit(x *xfer, rec *opRec) {
	p.mu.Lock()
	if p.fenced {
		p.mu.Unlock()
		refuse(moveJob{x: x, rec: rec})
		return
	}
	if p.head > 0 && p.head*2 >= len(p.jobs) { // half spent: move the rest to the front
		k := copy(p.jobs, p.jobs[p.head:])
		clear(p.jobs[k:])
		p.jobs, p.head = p.jobs[:k], 0
	}
	p.jobs = append(p.jobs, moveJob{x: x, rec: rec})
	start := false
	switch {
	case p.spinning > 0: // a worker on standby looks at the queue before it stops waiting
	case p.idle > 0: // one waiting worker per queued copy: idle counts those not yet woken
		p.idle--
		p.wakes++
		p.wake.Signal()
	case p.running < p.limit:
		p.running++
		start = true
	}
	p.mu.Unlock()
	if start {
		go p.work()
	}
}

func (p *moverPool) work() {
	p.mu.Lock()
	for {
		if p.head < len(p.jobs) {
			j := p.jobs[p.head]
			p.jobs[p.head] = moveJob{}
			p.head++
			p.busy++
			p.standbyUntil = 0 // the copy a standby waited for has come
			p.mu.Unlock()
			j.x.move(j.rec)
			p.mu.Lock()
			p.busy--
			if p.busy == 0 && p.quiet != nil {
				close(p.quiet)
				p.quiet = nil
			}
			continue
		}
		if p.closed {
			p.running--
			p.mu.Unlock()
			return
		}
		if p.standbyUntil != 0 && time.Now().UnixNano() < p.standbyUntil { // standby: the copy is on its way
			p.spinning++
			p.mu.Unlock()
			runtime.Gosched() // a goroutine of this process that wants the P gets it
			p.mu.Lock()
			p.spinning--
			continue
		}
		p.idle++
		p.wake.Wait() // whoever wakes it took it off idle
	}
}

// standby readies a worker for a copy about to be queued (a one-hop read in place, whose copy
// begins 55-80 us after its Receive starts): it wakes a sleeping worker, or starts one,
// that waits for the copy awake until standbyFor has passed. On the 2-core host a sleeping
// worker woken for a copy began it 160 us later at the median, most often after the loop had
// copied the whole request itself (docs/benchmarks.md). One standby at a time: a later one
// only extends the window, and the first copy a worker takes ends it. The wait yields the P
// (runtime.Gosched): a wait that kept it delayed the request's own loop by 150 us at the
// median, the other P being busy with the UCX workers' goroutines. It does not yield the
// core: on the 2-core VM the kernel often puts the woken worker's thread on the waker's vCPU,
// where its wait holds the Receive's thread off for about 200 us while the other vCPU idles;
// a yielding wait, or a worker moved off that vCPU, only moved the time into the copy
// (docs/benchmarks.md, "A one-hop read's 200 us stall before its copy"). Nothing while copies
// are queued or running (the workers are awake), after fence or close.
//
// It returns when it opened the window and the window's end as set (Unix ns), for
// standbyLead and endStandby; zeros where it readied nothing.
func (p *moverPool) standby() (from, until int64) {
	p.mu.Lock()
	if p.fenced || p.closed || p.busy > 0 || p.head < len(p.jobs) {
		p.mu.Unlock()
		return 0, 0
	}
	now := time.Now().UnixNano()
	readied := p.standbyUntil > now
	p.standbyUntil = now + int64(p.standbyFor)
	until = p.standbyUntil
	p.standbys++
	start := false
	switch {
	case readied || p.spinning > 0:
	case p.idle > 0:
		p.idle--
		p.wakes++
		p.wake.Signal()
	case p.running < p.limit:
		p.running++
		start = true
	}
	p.mu.Unlock()
	if start {
		go p.work()
	}
	return now, until
}

// endStandby ends the standby window that standby opened with the end until, once the copy it
// readied a worker for has been copied (copyShared): a waiting worker then sleeps at once
// instead of holding a core for the rest of the window. A window another standby has extended
// since (another Receive's) stays open.
func (p *moverPool) endStandby(until int64) {
	if until == 0 {
		return
	}
	p.mu.Lock()
	if p.standbyUntil == until {
		p.standbyUntil = 0
	}
	p.mu.Unlock()
}

// standbyLead takes the time from a standby to the first copy of the Receive that opened it
// (copyShared): the window becomes twice the leads' moving average (each new lead an eighth of
// it), between standbyMin and standbySpin.
func (p *moverPool) standbyLead(lead time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lead == 0 {
		p.lead = lead
	} else {
		p.lead += (lead - p.lead) / 8
	}
	p.standbyFor = min(max(2*p.lead, standbyMin), standbySpin)
}

// runHere runs one copy on the calling goroutine (a transfer's loop), for a copy so short
// that a worker's hand-off and the event's way back would cost more than the copy itself. It
// is fenced as the workers' copies are: refused once fence began, and counted busy while it
// runs, so fence (and Engine.Close after it) waits for it. Its event comes back through the
// transfer's mailbox as a worker's does.
func (p *moverPool) runHere(x *xfer, rec *opRec) {
	p.mu.Lock()
	if p.fenced {
		p.mu.Unlock()
		refuse(moveJob{x: x, rec: rec})
		return
	}
	p.busy++
	p.mu.Unlock()
	x.move(rec)
	p.ran()
}

// help runs on the calling goroutine (x's loop) the copies of x that no worker has begun, the
// last queued first (a worker takes the first), until none of x's is queued: the loop would
// only wait for them, and on a busy host a worker's wake-up can take longer than the copy.
// Each is fenced and counted busy as runHere's is, and its event comes back as a worker's
// does; a worker woken for a copy taken back finds the queue without it and waits again.
func (p *moverPool) help(x *xfer) {
	for range maxHelp {
		p.mu.Lock()
		i := len(p.jobs) - 1
		for i >= p.head && p.jobs[i].x != x {
			i--
		}
		if p.fenced || i < p.head { // fence refused every queued copy already
			p.mu.Unlock()
			return
		}
		rec := p.jobs[i].rec
		copy(p.jobs[i:], p.jobs[i+1:])
		p.jobs[len(p.jobs)-1] = moveJob{}
		p.jobs = p.jobs[:len(p.jobs)-1]
		p.busy++
		p.mu.Unlock()
		x.move(rec)
		p.ran()
	}
}

// maxHelp bounds the copies one help runs: a transfer queues at most its lanes' worth at once
// (rma_inplace.go), far fewer.
const maxHelp = 64

// ran ends a copy run on a caller's goroutine (runHere, help).
func (p *moverPool) ran() {
	p.mu.Lock()
	p.busy--
	if p.busy == 0 && p.quiet != nil {
		close(p.quiet)
		p.quiet = nil
	}
	p.mu.Unlock()
}

// errCopyRefused is why a copy queued after fence never ran.
var errCopyRefused = fmt.Errorf("%w: the engine is closing; copy not started", ErrClosed)

// refuse hands a copy back without running it: its slot and blocks were never touched.
func refuse(j moveJob) {
	j.rec.moveErr = errCopyRefused
	j.x.box.Push(event{op: j.rec, moved: true})
}

// fence refuses every copy not yet begun, now and later, and waits until the copies running
// have returned, or ctx ends; it reports how many still run then. A host copy always returns;
// a device copy past its timeout may not (ErrQuiescenceUnknown).
func (p *moverPool) fence(ctx context.Context) int {
	p.mu.Lock()
	p.fenced = true
	queued := p.jobs[p.head:]
	p.jobs, p.head = nil, 0
	busy := p.busy
	var quiet chan struct{}
	if busy > 0 {
		if p.quiet == nil {
			p.quiet = make(chan struct{})
		}
		quiet = p.quiet
	}
	p.mu.Unlock()
	for _, j := range queued {
		refuse(j)
	}
	if quiet == nil {
		return 0
	}
	select {
	case <-quiet:
		return 0
	case <-ctx.Done():
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.busy
	}
}

// quietCh closes once no copy runs (closed already if none does).
func (p *moverPool) quietCh() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busy == 0 {
		done := make(chan struct{})
		close(done)
		return done
	}
	if p.quiet == nil {
		p.quiet = make(chan struct{})
	}
	return p.quiet
}

// close lets the workers end once the queue is empty.
func (p *moverPool) close() {
	p.mu.Lock()
	p.closed = true
	p.idle = 0
	p.wake.Broadcast()
	p.mu.Unlock()
}
