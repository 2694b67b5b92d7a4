// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

// quiet is the synchronisation point for checks that something did not happen. It returns
// once the network has handed every queued callback and control message to its engine and
// every goroutine of this package is parked at one of its waits (a transfer's loop or queue,
// the network's dispatch, the progress loop, a slot lease, a Drain). A transfer parked in its
// loop or queue has an empty mailbox: a push wakes it. A transfer parked at a slot lease reads
// its mailbox only once it has a slot.
// From then on nothing in the engines changes until a timer fires or the test acts, so the
// check that follows does not race a sleep's length. It fails the test after 10 s.
func quiet(t testing.TB, n *mem.Network) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	settled := 0
	var last string
	for settled < 3 { // three looks in a row, so a goroutine between two waits is not missed
		if time.Now().After(deadline) {
			t.Fatalf("the engines did not settle within 10s: %s", last)

		}
		last = busy(n)
		if last == "" {
			settled++
		} else {
			settled = 0
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// busy says what is still moving, or "" when nothing is.
func busy(n *mem.Network) string {
	if why := queued(n); why != "" {
		return why
	}
	buf := make([]byte, 1<<20)
	for {
		k := runtime.Stack(buf, true)
		if k < len(buf) {
			buf = buf[:k]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n")[1:] { // the first is this goroutine
		if why := engineBusy(g); why != "" {
			return why
		}
	}
	// Something may have been queued while the stacks were read.
	return queued(n)
}

// idleWaits are the functions where this package's goroutines wait for work.
var idleWaits = []string{
	"transfer.(*xfer).loop(",
	"transfer.(*xfer).runSend(",
	"transport/mem.(*Transport).dispatch(",
	"buffer.(*Pool).Lease(",
	"transfer.(*xfer).admit(",         // waiting for one of MaxConcurrent
	"transfer.(*Engine).waitDrivers(", // a Drain
}

// engineBusy says why one goroutine's stack shows engine or network work under way, or "".
// A goroutine whose innermost frame is the engine's or the network's must be parked at one of
// idleWaits; any other goroutine running or waiting for a lock with them down its stack is at
// work too (a timer callback, a transfer inside the runtime or a logger). Test code's own
// goroutines do not count.
func engineBusy(g string) string {
	lines := strings.SplitN(g, "\n", 4)
	if len(lines) < 3 {
		return ""
	}
	head, top, file := lines[0], lines[1], strings.TrimSpace(lines[2])
	ours := func(s string) bool {
		return strings.Contains(s, "kvxfer/kvxfer/transfer.") || strings.Contains(s, "kvxfer/kvxfer/transfer/transport/mem.") || strings.Contains(s, "kvxfer/kvxfer/buffer.")
	}
	if !ours(g) {
		return ""
	}
	parked := strings.Contains(head, "[select") || strings.Contains(head, "[chan receive")
	if ours(top) && !strings.Contains(file, "_test.go:") {
		for _, w := range idleWaits {
			if parked && strings.Contains(top, w) {
				return ""
			}
		}
		return head + " " + top
	}
	for _, s := range []string{"[running", "[runnable", "[sync.Mutex.Lock", "[sync.RWMutex", "[semacquire"} {
		if strings.Contains(head, s) && !strings.Contains(g, "_test.go:") {
			return head + " " + top
		}
	}
	return ""
}

// queued says what waits in a delivery queue, or "".
func queued(n *mem.Network) string {
	if ep := n.Queued(); ep != "" {
		return "delivery queued at " + string(ep)
	}
	return ""
}
