// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An idle worker sleeps MaxSleep at a time between progress rounds; a command must end the
// sleep, not wait it out. With the longest MaxSleep allowed (100 ms) a command to a worker
// idle for long enough to sleep that long still runs in a fraction of it (the median of five
// tries under 50 ms: a missed wake would take the whole 100 ms).
func TestWorker_ACommandEndsTheIdleSleep(t *testing.T) {
	c, err := NewContext(ContextConfig{TLS: "posix,cma,self"})
	require.NoError(t, err)
	w, err := c.NewWorker(WorkerConfig{MaxSleep: 100 * time.Millisecond})
	require.NoError(t, err)
	var took []time.Duration
	for range 5 {
		time.Sleep(300 * time.Millisecond) // back off to MaxSleep
		start := time.Now()
		require.NoError(t, w.call(context.Background(), func() {}))
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	require.Less(t, took[2], 50*time.Millisecond, "a command waited out the idle sleep: %v", took)

	// Close ends the sleep too.
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	require.NoError(t, w.Close())
	require.Less(t, time.Since(start), 2*time.Second)
	require.NoError(t, c.Close())
}

// The sleep itself: a worker asked to sleep 20 us must not sleep a millisecond, which is what
// a Go timer gives when every P is idle. BenchmarkWorkerSleep reports the overshoot.
func BenchmarkWorkerSleep(b *testing.B) {
	k, err := newWaker()
	require.NoError(b, err)
	defer k.close()
	idle := func() bool { return true }
	var over time.Duration
	for b.Loop() {
		start := time.Now()
		k.sleep(20*time.Microsecond, idle)
		over += time.Since(start) - 20*time.Microsecond
	}
	b.ReportMetric(float64(over.Microseconds())/float64(b.N), "us_over")
	tm := time.NewTimer(time.Hour)
	over = 0
	const n = 200
	for range n {
		start := time.Now()
		tm.Reset(20 * time.Microsecond)
		<-tm.C
		over += time.Since(start) - 20*time.Microsecond
	}
	b.ReportMetric(float64(over.Microseconds())/n, "us_over_go_timer")
}
