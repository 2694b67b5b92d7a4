// SPDX-License-Identifier: Apache-2.0

// Package queue is the one queue of package transfer and its transports: an unbounded FIFO
// that producers push to without ever blocking (transport callbacks, the inbound handler, the
// engine reporting to its observer), drained by one consumer at a time in batches. A
// transfer's mailbox, the observer's delivery queue, the in-memory transport's callbacks and
// the UCX transport's reports are each a Queue.
//
// A consumer is either long-lived, waiting on Ready, or started on demand: Push reports when
// no consumer runs, and a consumer that takes an empty batch has stopped, so a queue holds no
// goroutine while it is empty.
package queue

import "sync"

// Queue is an unbounded FIFO. Its zero value is empty and ready to use; it must not be copied
// after first use. Push and Ready may be called from any goroutine; Take from one consumer at
// a time.
type Queue[T any] struct {
	mu       sync.Mutex
	items    []T
	consumer bool          // a consumer runs: Push reported start and Take has not come back empty since
	closed   bool          // Close ran: pushes are dropped
	ready    chan struct{} // capacity 1; made on first use
}

// Push appends v. It never blocks. It reports true when no consumer was running: the caller
// starts one, which then counts as running until its Take returns an empty batch. After Close
// it drops v and reports false.
func (q *Queue[T]) Push(v T) (start bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	q.items = append(q.items, v)
	start = !q.consumer
	q.consumer = true
	ready := q.readyLocked()
	q.mu.Unlock()
	select {
	case ready <- struct{}{}:
	default: // a wake-up is already pending; the consumer takes everything at once
	}
	return start
}

// Ready returns a channel that holds a value after any Push since the consumer last received
// from it. Pushes in between leave one value: the consumer Takes them all at once.
func (q *Queue[T]) Ready() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.readyLocked()
}

func (q *Queue[T]) readyLocked() chan struct{} {
	if q.ready == nil {
		q.ready = make(chan struct{}, 1)
	}
	return q.ready
}

// Take moves everything queued, in push order, into dst[:0] (reusing its array) and returns
// it. The queue keeps its own array for the next pushes and drops its references to what it
// handed out, so a busy queue stops allocating once both arrays have grown. An empty batch
// means the consumer has stopped: the next Push reports start.
func (q *Queue[T]) Take(dst []T) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	dst = append(dst[:0], q.items...)
	clear(q.items)
	q.items = q.items[:0]
	if len(dst) == 0 {
		q.consumer = false
	}
	return dst
}

// Len is how many values wait for Take.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// Close makes every later Push drop its value; what is queued stays for Take. A consumer that
// saw Closed report true before a Take that came back empty has taken everything it ever
// will, so it may stop for good.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}

// Closed reports whether Close has run.
func (q *Queue[T]) Closed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}
