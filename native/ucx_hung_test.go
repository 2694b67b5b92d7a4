// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
)

// A sender stopped (SIGSTOP) once its rendezvous requests had reached this worker, where
// receives posted then match them and ask it for the data (the direct path's IOV
// receives: no get reads an IOV, so each waits for the sender's fragments); this worker's own
// messages to the stopped peer fill its shared-memory receive FIFO, as a receiver's requests,
// answers and control messages to a hung sender do; then the sender is killed, as a supervisor
// ends a hung process. UCX fails such a receive only when it purges the endpoint's requests,
// after every lane of the failed endpoint is discarded, and a shared-memory lane's discard
// waits for room in the dead peer's FIFO. Every receive and send must end with an error, none
// abandoned, no memory pinned, with the worker open. Over both shared-memory transports UCX may
// give the endpoint's active messages: posix, and sysv, which UCX picks over posix where
// UCX_TLS leaves it in (the engine's default): the soak's hung peer (docs/stress.md, "The hung
// peer") left such receives with UCX over sysv until its quarantine poisoned their blocks.
func TestUCX_HungSenderKilledEndsTheReceivesThatMatched(t *testing.T) {
	const chunk, window = 128 << 10, 8
	const bound = 5 * time.Second
	bin := peerproc.Build(t)
	for _, tc := range []struct{ name, tls, lane string }{
		{"posix", "posix,cma,self", "posix/"},
		{"sysv", "sysv,cma,self", "sysv/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The sender keeps window sends in flight: chunks 0 to window-1 at once.
			peer := peerproc.Start(t, bin, peerArgsFor(tc.tls, "-mode", "source", "-total", strconv.Itoa(chunk*1024),
				"-chunk", strconv.Itoa(chunk), "-window", strconv.Itoa(window), "-check=false")...)
			l := newLocal(t, tc.tls, peer)
			mem, err := l.ctx.Allocate(chunk * window)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			halves := func(i int) []Segment { // two pieces, as the direct path posts a chunk
				return []Segment{{int64(i) * chunk, chunk / 2}, {int64(i)*chunk + chunk/2, chunk / 2}}
			}
			// The sender's window of rendezvous requests waits at this worker, no receive posted.
			require.Eventually(t, func() bool { return l.w.Stats().UnexpectedHeld >= window }, bound, time.Millisecond,
				"the sender's %d rendezvous requests never all arrived: %d held", window, l.w.Stats().UnexpectedHeld)
			info, err := l.ep.Info(ctx)
			require.NoError(t, err)
			require.Contains(t, info, tc.lane, "the endpoint's lanes")

			peer.Signal(t, syscall.SIGSTOP)
			procState(t, peer.Cmd.Process.Pid, 'T')
			var recvs []*Request
			for i := range window {
				recvs = append(recvs, l.ep.TagRecvIOV(mem, halves(i), peerTagBase|uint64(i), ^uint64(0)))
			}
			// The receiver gives up (its deadline): a receive that matched stays with UCX.
			for _, r := range recvs {
				require.True(t, r.Cancel())
			}
			_, err = l.ep.Info(ctx) // a command behind the cancels: they have run
			require.NoError(t, err)
			matched := 0
			for _, r := range recvs {
				if !r.Completed() {
					matched++
				}
			}
			t.Logf("%d of %d receives matched a rendezvous request of the stopped sender", matched, len(recvs))
			require.Positive(t, matched, "no receive matched a rendezvous request of the stopped sender")
			// Messages to the stopped peer: more than its FIFO holds (the last ones wait).
			var sends []*Request
			for range fifoSizeOnce() + window {
				sends = append(sends, l.ep.TagSendBytes(make([]byte, 64), peerTagBase|1<<32))
			}

			peer.Signal(t, syscall.SIGKILL)
			start := time.Now()
			reqs := append(recvs, sends...)
			ok, failed, abandoned := requireAllTerminal(t, reqs, start, bound)
			t.Logf("after SIGKILL: %d requests completed, %d failed (%d abandoned by UCX), all within %v",
				ok, failed, abandoned, time.Since(start))
			select {
			case <-l.ep.Failed():
			case <-time.After(bound):
				t.Fatal("endpoint not failed after its peer was killed")
			}
			require.Zero(t, abandoned, "a dead peer holds nothing: UCX ends every request on its endpoint")
			require.Eventually(t, func() bool { return mem.InUse() == 0 }, bound, time.Millisecond,
				"memory still pinned with every request ended: %d", mem.InUse())
			requireReleasedAfterClose(t, l, mem, 0)
		})
	}
}
