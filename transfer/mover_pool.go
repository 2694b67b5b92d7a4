// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"runtime"
	"sync"
)

// moverPool runs the staging path's gathers and scatters off the transfers' loops, on at most
// GOMAXPROCS goroutines per engine: while a transfer's loop posts chunk i and handles the
// wire's completions, its chunks i+1 (gather) or i-1 (scatter) are being copied. A worker
// starts when a copy is queued, none is idle and fewer than the limit run; it then waits for
// the next copy until the engine closes (close), so a steady stream of chunks starts no
// goroutine per chunk. After close a worker ends once the queue is empty (a transfer that
// outlived Close still gets its copies). Each finished copy goes back to its transfer as a
// mailbox event (event.moved), which the loop settles: the slot is the transfer's again.
type moverPool struct {
	mu      sync.Mutex
	wake    sync.Cond
	jobs    []moveJob // FIFO: head at jobs[head]
	head    int
	running int
	idle    int
	limit   int
	closed  bool
}

// moveJob is one copy: a gather of rec's chunk into its slot (sender) or a scatter of its
// payload out of it (receiver).
type moveJob struct {
	x   *xfer
	rec *opRec
}

func newMoverPool() *moverPool {
	p := &moverPool{limit: max(1, runtime.GOMAXPROCS(0))}
	p.wake.L = &p.mu
	return p
}

// submit queues a copy; it never blocks.
func (p *moverPool) submit(x *xfer, rec *opRec) {
	p.mu.Lock()
	if p.head > 0 && p.head*2 >= len(p.jobs) { // half spent: move the rest to the front
		k := copy(p.jobs, p.jobs[p.head:])
		clear(p.jobs[k:])
		p.jobs, p.head = p.jobs[:k], 0
	}
	p.jobs = append(p.jobs, moveJob{x: x, rec: rec})
	start := false
	switch {
	case p.idle > 0: // one waiting worker per queued copy: idle counts those not yet woken
		p.idle--
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
			p.mu.Unlock()
			j.x.move(j.rec)
			p.mu.Lock()
			continue
		}
		if p.closed {
			p.running--
			p.mu.Unlock()
			return
		}
		p.idle++
		p.wake.Wait() // whoever wakes it took it off idle
	}
}

// close lets the workers end once the queue is empty.
func (p *moverPool) close() {
	p.mu.Lock()
	p.closed = true
	p.idle = 0
	p.wake.Broadcast()
	p.mu.Unlock()
}
