// SPDX-License-Identifier: Apache-2.0

package transfer

// goGrown runs f on a new goroutine whose stack holds stackReserve bytes of frames from the
// start. A new goroutine gets 2 KiB (the runtime's adaptive start follows the average of every
// goroutine's stack, and most are small), and a transfer's driver reaches 4-8 KiB on the
// one-hop path: it grew twice a request, each growth a copy of every frame it held so far
// (morestack and copystack, about 5 % of the prefill's CPU per request at 16 concurrent
// 32-token reads: docs/benchmarks.md, "Receives that wait for their message"). One frame of
// stackReserve, called first, grows the stack once, while it holds almost nothing to copy.
func goGrown(f func()) {
	go func() {
		reserveStack()
		f()
	}()
}

// stackReserve is the frame reserveStack takes: the runtime grows a stack to the first power
// of two it fits in with its guard, 8 KiB.
const stackReserve = 6 << 10

// stackProbe indexes reserveStack's frame: a variable, so the frame is kept.
var stackProbe = 0

// reserveStack takes a frame of stackReserve bytes and returns.
//
//go:noinline
func reserveStack() byte {
	var frame [stackReserve]byte
	frame[stackProbe] = 1
	return frame[stackProbe]
}
