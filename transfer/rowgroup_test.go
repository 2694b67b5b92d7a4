// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
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
