// SPDX-License-Identifier: Apache-2.0

package queue

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestQueueTakeKeepsPushOrder(t *testing.T) {
	tests := []struct {
		desc    string
		batches [][]int
	}{
		{desc: "one batch", batches: [][]int{{1, 2, 3}}},
		{desc: "batches taken in turn", batches: [][]int{{1}, {2, 3}, {4, 5, 6}}},
		{desc: "an empty batch between", batches: [][]int{{1, 2}, {}, {3}}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			var q Queue[int]
			var batch []int
			for _, want := range tc.batches {
				for _, v := range want {
					q.Push(v)
				}
				batch = q.Take(batch)
				require.Equal(t, len(want), len(batch))
				for i := range want {
					require.Equal(t, want[i], batch[i])
				}
			}
		})
	}
}

func TestQueuePushReportsStartOnlyWhileNoConsumerRuns(t *testing.T) {
	var q Queue[string]
	require.True(t, q.Push("a"), "the first push finds no consumer")
	require.False(t, q.Push("b"), "a consumer was started for the first push")
	batch := q.Take(nil)
	require.Equal(t, []string{"a", "b"}, batch)
	require.False(t, q.Push("c"), "the consumer runs until it takes an empty batch")
	require.Equal(t, []string{"c"}, q.Take(batch))
	require.Empty(t, q.Take(batch), "nothing left: the consumer stops")
	require.True(t, q.Push("d"), "after an empty take the next push starts a consumer again")
}

func TestQueueReadyCoalescesPushes(t *testing.T) {
	var q Queue[int]
	ready := q.Ready()
	select {
	case <-ready:
		t.Fatal("ready before any push")
	default:
	}
	q.Push(1)
	q.Push(2)
	<-ready // one value for both pushes
	select {
	case <-ready:
		t.Fatal("two pushes left two wake-ups; a consumer takes both at once")
	default:
	}
	require.Equal(t, []int{1, 2}, q.Take(nil))
	q.Push(3)
	<-ready
}

func TestQueueTakeDropsReferences(t *testing.T) {
	var q Queue[*int]
	v := new(int)
	q.Push(v)
	batch := q.Take(nil)
	require.Same(t, v, batch[0])
	// The queue's own array must not keep what it handed out alive.
	q.mu.Lock()
	defer q.mu.Unlock()
	require.Nil(t, q.items[:1][0])
}

func TestQueueSteadyStateDoesNotAllocate(t *testing.T) {
	var q Queue[int]
	batch := make([]int, 0, 8)
	for range 8 {
		q.Push(0)
	}
	batch = q.Take(batch)
	allocs := testing.AllocsPerRun(100, func() {
		for range 8 {
			q.Push(1)
		}
		batch = q.Take(batch)
	})
	require.Zero(t, allocs)
}

// One consumer draining many pushers sees every value once, and each pusher's values in order.
func TestQueueManyPushersOneConsumer(t *testing.T) {
	const pushers, each = 4, 500
	var q Queue[[2]int]
	var wg sync.WaitGroup
	for p := range pushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				q.Push([2]int{p, i})
			}
		}()
	}
	next := make([]int, pushers)
	var batch [][2]int
	for seen := 0; seen < pushers*each; {
		<-q.Ready()
		batch = q.Take(batch)
		for _, v := range batch {
			require.Equal(t, next[v[0]], v[1], "pusher %d out of order", v[0])
			next[v[0]]++
			seen++
		}
	}
	wg.Wait()
}

func TestQueueCloseDropsLaterPushesAndKeepsWhatIsQueued(t *testing.T) {
	var q Queue[int]
	q.Push(1)
	require.False(t, q.Closed())
	q.Close()
	require.True(t, q.Closed())
	require.False(t, q.Push(2), "a push after Close starts nothing")
	require.Equal(t, []int{1}, q.Take(nil), "what was queued before Close is still taken")
	require.Empty(t, q.Take(nil), "what was pushed after Close was dropped")
	q.Close() // twice is harmless
	require.True(t, q.Closed())
}

func TestQueueLenCountsWhatWaits(t *testing.T) {
	var q Queue[int]
	require.Zero(t, q.Len())
	q.Push(1)
	q.Push(2)
	require.Equal(t, 2, q.Len())
	q.Take(nil)
	require.Zero(t, q.Len())
}
