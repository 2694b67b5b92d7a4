// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRowGroupRunsItsWidthOfRowsAtOnce: a rowGroup of width 2 runs five rows as subtests of
// its test, two at once and never more, each row once, and wait returns once every row ended.
func TestRowGroupRunsItsWidthOfRowsAtOnce(t *testing.T) {
	const width, rows = 2, 5
	var started, running, most atomic.Int32
	release := make(chan struct{}, rows)
	var mu sync.Mutex
	var ran []string
	var group *rowGroup
	t.Run("rows", func(t *testing.T) {
		group = newRowGroup(t, width)
		loopDone := make(chan struct{})
		go func() {
			defer close(loopDone)
			for i := range rows {
				group.run(fmt.Sprintf("row %d", i), func(t *testing.T) {
					started.Add(1)
					n := running.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					<-release
					running.Add(-1)
					mu.Lock()
					ran = append(ran, t.Name())
					mu.Unlock()
				})
			}
		}()
		for i := range rows {
			// The rows that can start are running, held: width of them, and fewer at the end.
			eventually(t, func() bool { return started.Load() == int32(min(width+i, rows)) }, "rows started")
			require.LessOrEqual(t, most.Load(), int32(width), "more rows at once than the width")
			release <- struct{}{}
		}
		<-loopDone
		group.wait()
		require.Equal(t, int32(width), most.Load(), "the width was used")
		require.Zero(t, running.Load(), "wait returned with rows running")
	})
	require.Len(t, ran, rows)
	require.ElementsMatch(t, []string{"rows/row_0", "rows/row_1", "rows/row_2", "rows/row_3", "rows/row_4"},
		func() []string {
			out := make([]string, len(ran))
			for i, n := range ran {
				out[i] = n[len(t.Name())+1:]
			}
			return out
		}())
}

// TestFlipEveryByteInvertsEachByteOnce: flipEveryByte inverts every byte of a buffer that is
// not a whole number of its steps, as a byte loop does, and twice gives the buffer back.
func TestFlipEveryByteInvertsEachByteOnce(t *testing.T) {
	b := make([]byte, 3<<20+5)
	_, _ = rand.NewChaCha8([32]byte{7}).Read(b)
	want := make([]byte, len(b))
	for i := range b {
		want[i] = ^b[i]
	}
	orig := bytes.Clone(b)
	flipEveryByte(b)
	require.True(t, bytes.Equal(want, b), "every byte inverted")
	flipEveryByte(b)
	require.True(t, bytes.Equal(orig, b), "twice: the buffer back")
}
