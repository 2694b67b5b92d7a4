// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

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
// The chain ends at the first receive that fails or is cancelled (Close cancels the pending
// one): its Next is nil.
func (w *Worker) TagRecvBytesStanding(maxLen int, tag, mask uint64) *Request {
	if maxLen < 0 {
		return w.TagRecvBytes(nil, maxLen, tag, mask)
	}
	r := w.newRecvBytes(nil, maxLen, tag, mask)
	r.standing = true
	return r.post(r.recvBytes)
}

// Next is the receive the loop posted when this standing receive (TagRecvBytesStanding)
// completed with a message, once Done is closed; nil for any other request, for one that
// failed or was cancelled, and before Done closes.
func (r *Request) Next() *Request {
	if !r.Completed() {
		return nil
	}
	return r.next
}

// standAgain (the loop, as standing receive r completes with a message) makes r's successor and
// queues it for the end of the loop's round (postStanding); none once the worker is stopping.
func (w *Worker) standAgain(r *Request) *Request {
	if w.stopping || w.dead {
		return nil
	}
	next := w.newRecvBytes(nil, r.recv.maxLen, r.recv.tag, r.recv.mask)
	next.standing = true
	w.restand = append(w.restand, next)
	return next
}

// postStanding (the loop, after each round of progress) posts the successors of the standing
// receives that completed, and theirs if they complete at once (a held message), a bounded
// number per round; it reports whether it posted any.
func (w *Worker) postStanding() bool {
	n := 0
	for ; len(w.restand) > 0 && n < 256; n++ {
		r := w.restand[0]
		w.restand[0] = nil
		w.restand = w.restand[1:]
		w.posting(func() {
			st, creq, got := r.recvBytes()
			w.track(r, st, creq, got)
		})
	}
	if len(w.restand) == 0 {
		w.restand = nil
	}
	return n > 0
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
