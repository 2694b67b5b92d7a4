// SPDX-License-Identifier: Apache-2.0

package stress

import "github.com/kvxfer/kvxfer/transfer/transport"

// windows cuts a registered KV pool into equal windows, one per request in flight, so that
// requests sharing the pool never share blocks. A window is taken before the request starts
// and given back once its handle is quiescent; a handle that never quiesces (its blocks
// poisoned, L9) keeps its window out for good, as a serving process must never reuse them.
type windows struct {
	mem  []byte
	size int64
	free chan int
}

// newWindows cuts mem into n windows of size bytes (mem must hold them).
func newWindows(mem []byte, size int64, n int) *windows {
	w := &windows{mem: mem, size: size, free: make(chan int, n)}
	for i := range n {
		w.free <- i
	}
	return w
}

// take returns a free window's index and memory, or false when every one is out.
func (w *windows) take() (int, []byte, bool) {
	select {
	case i := <-w.free:
		off := int64(i) * w.size
		return i, w.mem[off : off+w.size : off+w.size], true
	default:
		return 0, nil, false
	}
}

// put gives window i back.
func (w *windows) put(i int) { w.free <- i }

// windowBytes is the window a request of the soak needs at most: the largest request's
// blocks (drawRequest) and two spare, with every head, rounded up to whole pages so each
// window starts on a page as RegisterHost wants of a pool.
func (c Config) windowBytes() int64 {
	payload := c.SlotBytes - transport.DataHeaderBytes
	blockBytes := kvLayout(kvHeads, 1).BlockBytes()
	maxBlocks := payload/blockBytes + 6 + 2
	n := kvLayout(kvHeads, maxBlocks).SpanBytes()
	const page = 64 << 10 // a multiple of every page size this runs on
	return (n + page - 1) / page * page
}
