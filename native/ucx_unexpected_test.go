// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"bufio"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// No peer can make this process hold unbounded data it never asked for: 512 MiB sent to a tag
// nobody receives grows the receiving process by a bounded amount, whatever the sender does.
// A sender whose large messages are rendezvous (kvxfer's default on either version: get_zcopy
// under UCX 1.13, "am" under 1.22; "am" named under either) keeps the data until a receive
// matches: nothing is discarded and every message is received later, intact. A sender that
// sends eagerly (UCX 1.22 with the get_zcopy scheme does, and any peer can, with
// UCX_RNDV_THRESH=inf, here "eager") completes its sends at once, and the receiver's worker holds at most
// WorkerConfig.UnexpectedBytes of them, discarding the oldest (before the bound, 1.22's UCX
// held all 512 MiB: RSS grew 842 MiB). The messages it still holds are received intact. Both
// ends are in this process, so its RSS counts what the receiving side holds.
func TestUCX_UnreceivedSendsAreBounded(t *testing.T) {
	const msg, count = 8 << 20, 64 // 512 MiB
	const bound = 32 << 20         // the receiver's WorkerConfig.UnexpectedBytes
	const slack = 64 << 20         // what else the process may grow by (UCX's pools, Go)
	senders := []struct {
		name       string
		cfg        ContextConfig
		rendezvous bool
	}{
		{"default", ContextConfig{}, true},
		{"get_zcopy", ContextConfig{RendezvousScheme: "get_zcopy"}, !protocolsV2()},
		{"am", ContextConfig{RendezvousScheme: "am"}, true},
		{"eager", ContextConfig{rndvThresh: "inf"}, false},
	}
	for _, tr := range transports {
		for _, snd := range senders {
			t.Run(tr.name+"/"+snd.name, func(t *testing.T) {
				cfgA := snd.cfg
				cfgA.TLS = tr.tls
				p := newPairWith(t, cfgA, ContextConfig{TLS: tr.tls}, WorkerConfig{UnexpectedBytes: bound})
				src := alloc(t, p.ctxA, msg)
				dst := alloc(t, p.ctxB, msg)
				// Both ways wired up and src's and dst's pages touched before the first measure.
				require.NoError(t, src.FillPattern(0, msg, 0, 3))
				clear(dst.Bytes())
				waitAll(t, 5*time.Second, p.ab.TagSendBytes([]byte("x"), 1), p.b.TagRecvBytes(nil, 8, 1, ^uint64(0)))
				waitAll(t, 5*time.Second, p.ba.TagSendBytes([]byte("x"), 1), p.a.TagRecvBytes(nil, 8, 1, ^uint64(0)))
				debug.FreeOSMemory()
				before := rssBytes(t)
				sends := make([]*Request, count)
				for i := range sends {
					sends[i] = p.ab.TagSend(src, 0, msg, 77) // nobody receives tag 77, yet
				}
				// A marker behind them on the same endpoint: once it is received, every send
				// before it has reached the receiver (its data, or its rendezvous request).
				waitAll(t, 2*time.Minute, p.ab.TagSendBytes([]byte("m"), 2), p.b.TagRecvBytes(nil, 8, 2, ^uint64(0)))
				grew := rssBytes(t) - before
				completed := 0
				for _, s := range sends {
					if s.Completed() {
						completed++
					}
				}
				t.Logf("%d MiB sent to no receive: RSS grew %d MiB, %d of %d sends completed (UCX %s, sender's scheme %s)",
					count*msg>>20, grew>>20, completed, count, UCXVersion(), p.ctxA.cfg.RendezvousScheme)
				require.Less(t, grew, int64(bound+slack), "the receiving side holds what nobody received")
				// The counters are published when the worker idles.
				var st WorkerStats
				require.Eventually(t, func() bool {
					st = p.b.Stats()
					return st.UnexpectedHeld+st.UnexpectedDropped == count
				}, time.Minute, 10*time.Millisecond, "every message held or discarded: %+v", p.b.Stats())
				t.Logf("%d held (%d MiB charged), %d discarded", st.UnexpectedHeld, st.UnexpectedBytes>>20, st.UnexpectedDropped)
				require.LessOrEqual(t, st.UnexpectedBytes, uint64(bound))
				if snd.rendezvous {
					require.Zero(t, st.UnexpectedDropped, "a rendezvous request costs the receiver no data")
				} else {
					require.NotZero(t, st.UnexpectedDropped, "eager: more than the bound arrived")
					waitAll(t, time.Minute, sends...)
				}
				// Then received, one after the other, every byte checked: what is held (all of
				// it, for rendezvous) is delivered as it would have been.
				for i := range st.UnexpectedHeld {
					waitAll(t, time.Minute, p.b.TagRecv(dst, 0, msg, 77, ^uint64(0)))
					bad, _ := dst.CheckPattern(0, msg, 0, 3)
					require.Equal(t, int64(-1), bad, "message %d", i)
				}
				waitAll(t, time.Minute, sends...)
			})
		}
	}
}

// rssBytes is this process's resident set (VmRSS, shared memory it touched included).
func rssBytes(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	require.NoError(t, sc.Err())
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}
