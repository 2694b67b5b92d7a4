// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import "sync/atomic"

// Standing receives: a receive of every message of a tag, posted again by the loop itself
// each time it completes, so that a burst of messages is taken in one wake of the worker.

// recvSpec is what a TagRecvBytes receive was posted for; a standing receive's successor is
// posted for the same.
type recvSpec struct {
	maxLen    int
	tag, mask uint64
}

// TagRecvBytesStanding posts an unbound TagRecvBytes receive that stands for every message of
// its tag: each time it completes with a message, its loop posts the next one before it
// reports this one, and Next returns it. A message that came while the receive was being
// re-posted is taken at once, in the same wake of the worker: a receive re-posted by another
// goroutine after each message cost the worker a wake per message where messages came in
// bursts (docs/ucx.md, "Standing receives"). Messages are taken in the order UCX matches them.
// The loop runs at most standingAhead receives ahead of the consumer's Next calls; past that the
// next is posted by Next, and messages wait as unexpected ones, within
// WorkerConfig.UnexpectedBytes. The chain ends at the first receive that fails or is cancelled
// (Close cancels the pending one): its Next is nil.
func (w *Worker) TagRecvBytesStanding(maxLen int, tag, mask uint64) *Request {
	if maxLen < 0 {
		return w.TagRecvBytes(nil, maxLen, tag, mask)
	}
	r := w.newRecvBytes(nil, maxLen, tag, mask)
	r.standing = &standingChain{}
	return r.post(r.recvBytes)
}

// standingAhead bounds how many receives of a standing chain may complete before its consumer
// took them (Next): a peer that sends faster than the consumer reads fills the chain's lead,
// and then what native holds for unreceived messages (WorkerConfig.UnexpectedBytes), which is
// bounded, instead of the consumer's queue, which is not.
const standingAhead = 64

// standingChain is what the receives of one standing chain share.
type standingChain struct {
	ahead atomic.Int64 // receives that completed with a message and whose Next was not called
}

// Next is the receive that follows this standing receive (TagRecvBytesStanding) once Done is
// closed: the one its loop posted as it completed, or, where the chain had run standingAhead
// receives ahead of its consumer, one Next posts now. Each receive's first Next counts it as
// taken. It is nil for any other request, for one that failed or was cancelled, and before
// Done closes.
func (r *Request) Next() *Request {
	if !r.Completed() || r.standing == nil {
		return nil
	}
	r.nextOnce.Do(func() {
		if r.err != nil {
			return
		}
		r.standing.ahead.Add(-1)
		if r.late {
			next := r.w.newRecvBytes(nil, r.recv.maxLen, r.recv.tag, r.recv.mask)
			next.standing = r.standing
			r.next = next.post(next.recvBytes)
		}
	})
	return r.next
}

// standAgain (the loop, as standing receive r completes with a message) makes r's successor and
// queues it for the end of the loop's round (postStanding); none once the worker is stopping,
// and none, late, where the chain is standingAhead receives ahead of its consumer.
func (w *Worker) standAgain(r *Request) (next *Request, late bool) {
	if r.standing.ahead.Add(1) > standingAhead {
		return nil, true
	}
	if w.stopping || w.dead {
		return nil, false
	}
	next = w.newRecvBytes(nil, r.recv.maxLen, r.recv.tag, r.recv.mask)
	next.standing = r.standing
	w.restand = append(w.restand, next)
	return next, false
}

// postStanding (the loop, after each round of progress) posts the successors of the standing
// receives that completed, and theirs if they complete at once (a held message); it reports
// whether it posted any. Every successor is posted in the round that made it, so none waits
// unposted where a Cancel, which reaches only a posted receive, would miss it. The loop is
// bounded without a count: a chain makes at most standingAhead successors before its consumer
// takes them, and only messages already held complete a post at once.
func (w *Worker) postStanding() bool {
	posted := len(w.restand) > 0
	for len(w.restand) > 0 {
		r := w.restand[0]
		w.restand[0] = nil
		w.restand = w.restand[1:]
		w.posting(func() {
			st, creq, got := r.recvBytes()
			w.track(r, st, creq, got)
		})
	}
	w.restand = nil
	return posted
}

// endStanding (the loop, as it stops) completes the successors not yet posted with ErrClosed:
// each request completes once.
func (w *Worker) endStanding() {
	w.stopping = true
	for _, r := range w.restand {
		r.finish(ErrClosed, 0)
	}
	w.restand = nil
}
