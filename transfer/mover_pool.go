// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"runtime"
	"sync"
)

// moverPool runs the staging path's gathers and scatters off the transfers' loops, on at most
// GOMAXPROCS goroutines per engine: while a transfer's loop posts chunk i and handles the
// wire's completions, its chunks i+1 (gather) or i-1 (scatter) are being copied. A worker
// starts when a copy is queued and fewer than the limit run, and ends when the queue is
// empty, so an idle engine holds none. Each finished copy goes back to its transfer as a
// mailbox event (event.moved), which the loop settles: the slot is the transfer's again.
type moverPool struct {
	mu      sync.Mutex
	jobs    []moveJob // FIFO: head at jobs[head]
	head    int
	running int
	limit   int
}

// moveJob is one copy: a gather of rec's chunk into its slot (sender) or a scatter of its
// payload out of it (receiver).
type moveJob struct {
	x   *xfer
	rec *opRec
}

func newMoverPool() *moverPool { return &moverPool{limit: max(1, runtime.GOMAXPROCS(0))} }

// submit queues a copy; it never blocks.
func (p *moverPool) submit(x *xfer, rec *opRec) {
	p.mu.Lock()
	if p.head > 0 && p.head*2 >= len(p.jobs) { // half spent: move the rest to the front
		k := copy(p.jobs, p.jobs[p.head:])
		clear(p.jobs[k:])
		p.jobs, p.head = p.jobs[:k], 0
	}
	p.jobs = append(p.jobs, moveJob{x: x, rec: rec})
	start := p.running < p.limit
	if start {
		p.running++
	}
	p.mu.Unlock()
	if start {
		go p.work()
	}
}

func (p *moverPool) work() {
	for {
		p.mu.Lock()
		if p.head == len(p.jobs) {
			p.running--
			p.mu.Unlock()
			return
		}
		j := p.jobs[p.head]
		p.jobs[p.head] = moveJob{}
		p.head++
		p.mu.Unlock()
		j.x.move(j.rec)
	}
}
