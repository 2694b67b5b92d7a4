// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A standing receive takes every message of its tag, in order, and its loop posts the next
// receive itself when one completes: the transport's control receive, re-posted by the
// transport's goroutine after each message, woke the worker for that post whenever a burst had
// left messages held (the prefill of 16 concurrent 32-token reads, twice a request:
// docs/benchmarks.md, "Receives that wait for their message"). A burst of 64 messages sent to
// a worker asleep armed (every armed sleep 20 s long) is received whole and in order through
// Next, and the worker is never woken for a post (the waker's wakes stay 0); over shm and TCP.
func TestWorker_AStandingReceiveTakesEveryMessageInOrderWithoutAWake(t *testing.T) {
	const bound, burst = 5 * time.Second, 64
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPairWith(t, ContextConfig{TLS: tr.tls}, ContextConfig{TLS: tr.tls}, WorkerConfig{fixedSleep: 20 * time.Second})
			require.True(t, p.b.wakeable)
			src := alloc(t, p.ctxA, burst)
			dst := alloc(t, p.ctxB, 64)
			// A first message connects the endpoint (over TCP a wireup of several messages).
			waitAll(t, bound, p.ba.TagRecv(dst, 0, 64, 1, ^uint64(0)), p.ab.TagSend(src, 0, 64, 1))
			r := p.b.TagRecvBytesStanding(8, 0x700, 0xf00)
			asleepArmed(t, p.b)
			before := p.b.wake.wakes.Load()
			sends := make([]*Request, burst)
			for i := range sends {
				src.Bytes()[i] = byte(i)
				sends[i] = p.ab.TagSend(src, int64(i), 1, 0x700|uint64(i%256))
			}
			waitAll(t, bound, sends...)
			for i := range burst {
				waitAll(t, bound, r)
				require.Equal(t, []byte{byte(i)}, r.Data(), "message %d", i)
				r = r.Next()
				require.NotNil(t, r, "no receive after message %d", i)
			}
			require.Zero(t, p.b.wake.wakes.Load()-before, "the worker was woken for a post")
			require.False(t, r.Completed())
			require.True(t, r.Cancel())
			waitClosed(t, bound, r)
			require.Nil(t, r.Next(), "a cancelled standing receive posted another")
		})
	}
}

// A standing receive ends with its worker: one pending when Close begins completes with an
// error and no successor, and every request the loop posted completed exactly once (the
// worker's counters balance, L6).
func TestWorker_AStandingReceiveEndsAtClose(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			a := newArmedIdle(t, tr.name, tr.tls, WorkerConfig{})
			r := a.w.TagRecvBytesStanding(8, 0x700, 0xf00)
			require.NoError(t, a.w.Close())
			require.True(t, r.Completed())
			require.Error(t, r.Err())
			require.Nil(t, r.Next())
			s := a.w.Stats()
			require.Equal(t, s.Requests, s.Callbacks+s.Dropped, "requests %+v", s)
			a.closed(t)
		})
	}
}

// A standing receive takes at most standingAhead messages more than its consumer has taken
// (called Next on): a peer that sends faster than this process reads must not grow it past
// what it holds for messages nobody received (WorkerConfig.UnexpectedBytes, docs/ucx.md,
// "Unexpected messages"). 3*standingAhead messages to a consumer that takes none: at most
// standingAhead+1 receives complete and the rest stay held, counted; then the consumer walks the
// chain and gets every message, in order; over shm and TCP.
func TestWorker_AStandingReceiveTakesABoundedLeadOverItsConsumer(t *testing.T) {
	const bound, n = 10 * time.Second, 3 * standingAhead
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPairWith(t, ContextConfig{TLS: tr.tls}, ContextConfig{TLS: tr.tls}, WorkerConfig{})
			src := alloc(t, p.ctxA, n)
			dst := alloc(t, p.ctxB, 64)
			waitAll(t, bound, p.ba.TagRecv(dst, 0, 64, 1, ^uint64(0)), p.ab.TagSend(src, 0, 64, 1))
			first := p.b.TagRecvBytesStanding(8, 0x700, 0xf00)
			sends := make([]*Request, n)
			for i := range sends {
				src.Bytes()[i] = byte(i)
				sends[i] = p.ab.TagSend(src, int64(i), 1, 0x700|uint64(i%256))
			}
			waitAll(t, bound, sends...)
			require.Eventually(t, func() bool { return p.b.Stats().UnexpectedHeld >= n-standingAhead-1 }, bound, time.Millisecond,
				"messages past the lead held: %+v", p.b.Stats())
			r := first
			for i := range n {
				waitAll(t, bound, r)
				require.Equal(t, []byte{byte(i)}, r.Data(), "message %d", i)
				r = r.Next()
				require.NotNil(t, r, "no receive after message %d", i)
			}
			require.Eventually(t, func() bool { return p.b.Stats().UnexpectedHeld == 0 }, bound, time.Millisecond,
				"messages still held: %+v", p.b.Stats()) // the counts are published as the worker sleeps
			require.True(t, r.Cancel())
			waitClosed(t, bound, r)
		})
	}
}

// waitClosed waits up to d for r's Done, which an error may close.
func waitClosed(t *testing.T, d time.Duration, r *Request) {
	t.Helper()
	select {
	case <-r.Done():
	case <-time.After(d):
		t.Fatal("the request never completed")
	}
}
