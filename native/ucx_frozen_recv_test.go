// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/peerproc"
)

// A sender frozen with SIGSTOP in the middle of a message this side's receive had matched, the
// endpoint force-closed, then the sender killed, as a supervisor ends a hung process. The
// forced close fails the receive while the peer lives, and a live peer may still write into it
// (Request.suspend), so its memory stays pinned; once the process is gone nothing it sent can
// still arrive, and the worker lets go of the receive's memory with the worker open, as it
// lets go of the sends of TestUCX_PeerFrozenThenKilledLetsGoOfItsSends. Over shared memory
// without cma, so the sender's progress pushes the message's fragments (the receiver cannot
// pull them itself from a stopped process), over posix and sysv.
func TestUCX_PeerFrozenThenKilledLetsGoOfItsReceives(t *testing.T) {
	const chunk, count = 64 << 20, 4 // one message in flight: 64 MiB takes the sender tens of ms to push
	bin := peerproc.Build(t)
	for _, tls := range []string{"posix,self", "sysv,self"} {
		t.Run(strings.SplitN(tls, ",", 2)[0], func(t *testing.T) {
			var l *localEngine
			var peer *peerproc.Proc
			var mem *Memory
			var reqs []*Request
			// A try whose second message moved before the freeze (a stall of the test's goroutine
			// on a loaded host) proves nothing: another, three at most.
			for try := 1; ; try++ {
				peer = peerproc.Start(t, bin, peerArgsFor(tls, "-mode", "source", "-total", strconv.Itoa(chunk*count),
					"-chunk", strconv.Itoa(chunk), "-window", "1", "-check=false")...)
				l = newLocal(t, tls, peer)
				var err error
				mem, err = l.ctx.Allocate(chunk * 2)
				require.NoError(t, err)
				const sentinel = 0xee
				for i := range mem.Bytes() {
					mem.Bytes()[i] = sentinel
				}
				reqs = nil
				for i := range count {
					reqs = append(reqs, l.ep.TagRecv(mem, int64(i%2)*chunk, chunk, peerTagBase|uint64(i), ^uint64(0)))
				}
				peer.WaitGot(t, 0, 20*time.Second) // the first message arrived; the second goes next
				second := mem.Bytes()[chunk : 2*chunk]
				arrived := func() bool { return slices.IndexFunc(second, func(b byte) bool { return b != sentinel }) >= 0 }
				// Stopped at its first fragments (they come in order, from the message's start).
				for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
					if slices.IndexFunc(second[:4096], func(b byte) bool { return b != sentinel }) >= 0 {
						break
					}
				}
				peer.Signal(t, syscall.SIGSTOP)
				procState(t, peer.Cmd.Process.Pid, 'T')
				time.Sleep(100 * time.Millisecond) // the fragments the sender pushed before it stopped arrive
				if arrived() && !reqs[1].Completed() {
					break // the receive matched the message, and part of it came
				}
				require.Less(t, try, 3, "the second message was not caught part-way at the freeze in any try")
				t.Logf("try %d: the second message not part-way at the freeze (some of it arrived: %v; its receive completed: %v)",
					try, arrived(), reqs[1].Completed())
				peer.Signal(t, syscall.SIGKILL)
				require.NoError(t, l.w.Close()) // lets go of this try's receives
				require.NoError(t, mem.Close())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			require.NoError(t, l.ep.ForceClose(ctx))
			ok, failed, abandoned := requireAllTerminal(t, reqs, start, 5*time.Second)
			t.Logf("frozen peer, force close: %d completed, %d failed (%d abandoned or suspended); %d pinned: %v",
				ok, failed, abandoned, mem.InUse(), reqs[1].Err())
			require.True(t, reqs[1].Abandoned(), "the receive that matched the frozen sender's message stays pinned while it may resume: %v", reqs[1].Err())
			require.Positive(t, mem.InUse())

			peer.Signal(t, syscall.SIGKILL)
			killed := time.Now()
			require.Eventually(t, func() bool { return mem.InUse() == 0 }, 10*time.Second, 10*time.Millisecond,
				"memory still pinned by receives from a dead peer: %d", mem.InUse())
			t.Logf("every receive let go of %v after the kill", time.Since(killed).Round(time.Millisecond))
			for i, r := range reqs {
				require.True(t, r.Settled(), "request %d not settled", i)
			}
			requireReleasedAfterClose(t, l, mem, 0)
		})
	}
}
