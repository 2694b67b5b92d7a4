// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// A transfer's goroutine reaches 4-8 KiB of stack on the one-hop path, and a new goroutine
// starts with 2 KiB: it grew twice a request, in both processes, each growth a copy of every
// frame it held (docs/benchmarks.md, "Receives that wait for their message": morestack 5 % of
// the prefill's CPU). goGrown's function starts on a stack that holds that depth: a local's
// address, taken as it starts, is the same after 5 KiB of frames below it (a stack that grew
// in between was copied, and the local with it; a plain goroutine's moves from 1 KiB). 5 KiB,
// not the 7 an 8 KiB stack holds: the race detector doubles the stack guard and widens frames.
// Table: past the 4 KiB a transfer's goroutine grew through, and none.
func TestGoGrown_AStackThatHoldsATransfersDepthFromTheStart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		depth int // frames of about 512 bytes below the first
	}{
		{"no frames below", 0},
		{"5 KiB of frames below (past a one-hop transfer's 4 KiB)", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			moved := make(chan bool, 1)
			goGrown(func() {
				var local int
				at := uintptr(unsafe.Pointer(&local))
				descend(tc.depth)
				moved <- uintptr(unsafe.Pointer(&local)) != at
			})
			require.False(t, <-moved, "the goroutine's stack grew, and was copied, after it started")
		})
	}
}

// descend calls itself n times, each frame about 512 bytes.
//
//go:noinline
func descend(n int) byte {
	var frame [480]byte
	frame[n%len(frame)] = byte(n)
	if n == 0 {
		return frame[0]
	}
	return descend(n-1) + frame[(n*7)%len(frame)]
}
