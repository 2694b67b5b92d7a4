// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/stretchr/testify/require"
)

// newBoundUCXTransport is a transport over tls bound to nothing; it keeps RMA over TCP too
// (ServeEmulatedRMA), as newUCXPair's do.
func newBoundUCXTransport(t *testing.T, tls, dev string, cfg Config) *ucxTransport {
	t.Helper()
	cfg.TLS, cfg.NetDevices, cfg.ServeEmulatedRMA = tls, dev, true
	if cfg.KeepaliveInterval == 0 {
		cfg.KeepaliveInterval = 200 * time.Millisecond
	}
	if cfg.StagingBytes == 0 {
		cfg.StagingBytes = 4 << 20
	}
	cfg.CloseTimeout = 2 * time.Second
	tr, err := newTransport(cfg)
	require.NoError(t, err)
	require.NoError(t, tr.Bind(nopInbound{}))
	t.Cleanup(func() { _ = tr.Close(true) })
	return tr
}

// completionChan returns a done callback and the channel it reports on.
func completionChan() (func(transport.Completion), chan transport.Completion) {
	ch := make(chan transport.Completion, 4)
	return func(c transport.Completion) { ch <- c }, ch
}

// awaitFinal waits (bounded) for an operation's final completion: transport.MemoryBusy reports come
// first and are skipped.
func awaitFinal(t *testing.T, ch chan transport.Completion, d time.Duration, what string) transport.Completion {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case c := <-ch:
			if c.Memory != transport.MemoryBusy {
				return c
			}
		case <-deadline:
			require.FailNowf(t, "no final completion", "%s: none within %v", what, d)
		}
	}
}

// The receiver cancels a receive before its message arrives; the sender posts the message
// afterwards (it had not heard of the abort yet, or it was frozen). Its send must still
// complete: before the drain, UCX kept such a rendezvous send forever (its RTS sat in the
// receiver's unexpected queue, matching nothing), so the sender quarantined and poisoned its
// slot, and a cancel storm or a SIGSTOP of the sender drained a prefill engine's whole pool.
// The receiver's released buffer must stay untouched: the drain receives into its own memory.
// A chunk past the cancelled one, whose receive was never posted (the sender ran ahead as the
// receiver aborted), is drained too.
func TestUCXTransport_CancelledReceiveDrainsLateSend(t *testing.T) {
	const size = 1 << 20 // well above UCX's rendezvous threshold on every transport
	for _, tc := range []struct {
		name, tls, dev string
		ahead          uint32 // the late chunk's seq past the cancelled receive's
		drainTimeout   time.Duration
		wantComplete   bool
	}{
		{"shm/drained", "posix,cma,self", "", 0, 0, true},
		{"tcp/drained", "tcp,self", "lo", 0, 0, true},
		{"shm/never-posted-drained", "posix,cma,self", "", 2, 0, true},
		{"shm/drain-expired", "posix,cma,self", "", 0, 100 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recv := newBoundUCXTransport(t, tc.tls, tc.dev, Config{drainTimeout: tc.drainTimeout})
			send := newBoundUCXTransport(t, tc.tls, tc.dev, Config{})
			tag := transport.Tag{Request: 42, Sub: 1, Seq: 3}

			rbuf := recv.StagingMemory()[:size]
			for i := range rbuf {
				rbuf[i] = 0xa5
			}
			done, rch := completionChan()
			id, err := recv.PostRecv(send.Self(), tag, rbuf, done)
			require.NoError(t, err)
			recv.Cancel(id)
			c := awaitFinal(t, rch, 5*time.Second, "cancelled receive")
			require.ErrorIs(t, c.Err, transport.ErrCancelled)
			require.Equal(t, transport.MemoryDone, c.Memory, "an unmatched receive is released at once")
			if tc.drainTimeout > 0 {
				time.Sleep(5 * tc.drainTimeout) // the drain has expired: the send is stranded again
			}

			sbuf := send.StagingMemory()[:size]
			for i := range sbuf {
				sbuf[i] = byte(i)
			}
			sdone, sch := completionChan()
			late := tag
			late.Seq += tc.ahead
			_, err = send.PostSend(recv.Self(), late, sbuf, sdone)
			require.NoError(t, err)
			if tc.wantComplete {
				sc := awaitFinal(t, sch, 5*time.Second, "send to a cancelled receive")
				require.Equal(t, transport.MemoryDone, sc.Memory, "the sender's slot is free again: %v", sc.Err)
				require.Eventually(t, func() bool { return recv.drainSnapshot().Drained == 1 }, 5*time.Second, time.Millisecond,
					"drain stats: %+v", recv.drainSnapshot())
			} else {
				select {
				case sc := <-sch:
					require.Equal(t, transport.MemoryBusy, sc.Memory, "UCX 1.13 cannot complete a send nobody receives: %+v", sc)
				case <-time.After(time.Second):
				}
				require.Eventually(t, func() bool {
					s := recv.drainSnapshot()
					return s.Started == 1+defaultDrainAhead && s.Expired == s.Started && s.Live == 0
				}, 5*time.Second, time.Millisecond, "drain stats: %+v", recv.drainSnapshot())
			}
			require.True(t, bytes.Equal(bytes.Repeat([]byte{0xa5}, size), rbuf), "the cancelled receive's buffer was written")
		})
	}
}

// A sender that has not heard of the receiver's abort keeps sending as the drains complete its
// sends (each frees its slot for the next chunk): the drains follow it, drainAhead chunks past
// the last one they took, so its every send completes, however far it runs before the abort
// reaches it. They used to stop drainAhead chunks past the cancelled receive: a staging sender
// on a loaded host ran past them and its next send stranded (TestL3_UCXReceiversCancelIsAClean
// CancelForTheSender/shm/staging: the sender quarantined, one slot poisoned).
func TestUCXTransport_DrainsFollowASenderThatKeepsSending(t *testing.T) {
	const size = 1 << 20 // well above UCX's rendezvous threshold on every transport
	for _, tc := range ucxTransports {
		t.Run(tc.name, func(t *testing.T) {
			recv := newBoundUCXTransport(t, tc.tls, tc.dev, Config{})
			send := newBoundUCXTransport(t, tc.tls, tc.dev, Config{})
			tag := transport.Tag{Request: 42, Sub: 1, Seq: 3}
			cancelledRecv(t, recv, send, tag, recv.StagingMemory()[:size], "cancelled receive")
			const chunks = 3 * defaultDrainAhead
			for k := range uint32(chunks) {
				late := tag
				late.Seq += k
				sendDone(t, send, recv, late, send.StagingMemory()[:size], "past the cancelled receive")
			}
			require.Eventually(t, func() bool { return recv.drainSnapshot().Drained == chunks }, 20*time.Second, time.Millisecond,
				"drain stats: %+v", recv.drainSnapshot())
		})
	}
}

// A receive posted past a cancelled one (an aborting staging receiver posts and cancels its
// next chunk's receive to drain what its sender sent past it) retires the drains at and past
// its chunk only: the drain of an earlier chunk the sender has not sent yet stays, and that
// send completes. Posting it used to retire the whole transfer's drains, and the earlier
// chunk's send stranded.
func TestUCXTransport_ReceivePastADrainKeepsIt(t *testing.T) {
	const size = 1 << 20
	for _, tc := range ucxTransports {
		t.Run(tc.name, func(t *testing.T) {
			recv := newBoundUCXTransport(t, tc.tls, tc.dev, Config{})
			send := newBoundUCXTransport(t, tc.tls, tc.dev, Config{})
			tag := transport.Tag{Request: 42, Sub: 1, Seq: 3}
			cancelledRecv(t, recv, send, tag, recv.StagingMemory()[:size], "cancelled receive")
			next := tag
			next.Seq += 2
			cancelledRecv(t, recv, send, next, recv.StagingMemory()[size:2*size], "the receive posted past it, cancelled")
			for _, seq := range []uint32{tag.Seq, tag.Seq + 1, next.Seq} {
				late := tag
				late.Seq = seq
				sendDone(t, send, recv, late, send.StagingMemory()[:size], "")
			}
		})
	}
}

// cancelledRecv posts a receive of tag from send into buf and cancels it at once: the
// cancelled receive the drains start from.
func cancelledRecv(t *testing.T, recv, send *ucxTransport, tag transport.Tag, buf []byte, what string) {
	t.Helper()
	done, rch := completionChan()
	id, err := recv.PostRecv(send.Self(), tag, buf, done)
	require.NoError(t, err)
	recv.Cancel(id)
	require.ErrorIs(t, awaitFinal(t, rch, 20*time.Second, what).Err, transport.ErrCancelled)
}

// sendDone sends buf as tag to recv and requires the send to complete with its memory done
// (a drain took it).
func sendDone(t *testing.T, send, recv *ucxTransport, tag transport.Tag, buf []byte, what string) {
	t.Helper()
	sdone, sch := completionChan()
	_, err := send.PostSend(recv.Self(), tag, buf, sdone)
	require.NoError(t, err)
	sc := awaitFinal(t, sch, 20*time.Second, fmt.Sprintf("send of chunk %d %s", tag.Seq, what))
	require.Equal(t, transport.MemoryDone, sc.Memory, "chunk %d: %v", tag.Seq, sc.Err)
}

// A request started again with the same id, sub-transfer and sender after its receives were
// cancelled gets its own chunks: posting its receive retires the drains left from the first
// attempt (including those ahead of the cancelled receive), so none of them steals a chunk.
func TestUCXTransport_NewReceiveRetiresDrains(t *testing.T) {
	const size = 1 << 20
	recv := newBoundUCXTransport(t, "posix,cma,self", "", Config{})
	send := newBoundUCXTransport(t, "posix,cma,self", "", Config{})
	tag := transport.Tag{Request: 7, Sub: 0, Seq: 0}
	done, rch := completionChan()
	id, err := recv.PostRecv(send.Self(), tag, recv.StagingMemory()[:size], done)
	require.NoError(t, err)
	recv.Cancel(id)
	require.ErrorIs(t, awaitFinal(t, rch, 5*time.Second, "cancelled receive").Err, transport.ErrCancelled)
	require.Equal(t, uint64(1+defaultDrainAhead), recv.drainSnapshot().Started)

	// The second attempt posts its first receive; its sender runs ahead to chunk 2 before
	// the receiver posts that receive (one of the first attempt's drains ahead).
	first, _ := completionChan()
	_, err = recv.PostRecv(send.Self(), tag, recv.StagingMemory()[2*size:3*size], first)
	require.NoError(t, err)
	again := tag
	again.Seq = 2
	sbuf := send.StagingMemory()[:size]
	for i := range sbuf {
		sbuf[i] = byte(i * 7)
	}
	sdone, sch := completionChan()
	_, err = send.PostSend(recv.Self(), again, sbuf, sdone)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // chunk 2 is waiting at the receiver, unexpected
	rbuf := recv.StagingMemory()[size : 2*size]
	done, rch = completionChan()
	_, err = recv.PostRecv(send.Self(), again, rbuf, done)
	require.NoError(t, err)
	c := awaitFinal(t, rch, 5*time.Second, "the new receive")
	require.NoError(t, c.Err)
	require.Equal(t, size, c.Bytes)
	require.True(t, bytes.Equal(sbuf, rbuf), "the new receive got the chunk")
	require.NoError(t, awaitFinal(t, sch, 5*time.Second, "the send").Err)
	require.Eventually(t, func() bool {
		s := recv.drainSnapshot()
		return s.Live == 0 && s.Drained == 0 && s.Expired == s.Started
	}, 5*time.Second, time.Millisecond, "every drain retired unused: %+v", recv.drainSnapshot())
}
