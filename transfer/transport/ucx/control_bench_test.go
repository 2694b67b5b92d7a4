// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// chanInbound hands each control message's arrival time to a channel.
type chanInbound chan time.Time

func (c chanInbound) OnControl(transport.Peer, []byte) { c <- time.Now() }
func (chanInbound) OnPeerLost(transport.Peer, error)   {}

// BenchmarkUCXControlReply: a's control message (700 bytes, an offer's size) goes to b over
// shared memory, b answers after a pause, as a receiver's RequestInfo and the sender's offer
// go (the sender works out its offer in between), and the reply's trip is timed: a's worker
// has been idle since its own send for the pause. "idle=5ms" times a's first message to a b
// that sat idle (a request that arrives while nothing moves). Reports the median and the 90th
// percentile one-way time in microseconds.
func BenchmarkUCXControlReply(b *testing.B) {
	for _, c := range []struct {
		name        string
		idle, pause time.Duration
	}{
		{"pause=0", 0, 0}, {"pause=300us", 0, 300 * time.Microsecond}, {"pause=1ms", 0, time.Millisecond},
		{"idle=5ms", 5 * time.Millisecond, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := Config{TLS: "posix,cma,self", StagingBytes: 1 << 20, CloseTimeout: 2 * time.Second}
			a, err := newTransport(cfg)
			require.NoError(b, err)
			bb, err := newTransport(cfg)
			require.NoError(b, err)
			ia, ib := make(chanInbound, 1), make(chanInbound, 1)
			require.NoError(b, a.Bind(ia))
			require.NoError(b, bb.Bind(ib))
			defer func() { require.NoError(b, a.Close(true)); require.NoError(b, bb.Close(true)) }()
			msg := make([]byte, 700)
			var ways []time.Duration
			cpu0 := processCPU()
			for b.Loop() {
				time.Sleep(c.idle)
				t0 := time.Now()
				require.NoError(b, a.SendControl(bb.Self(), msg))
				t1 := <-ib
				for time.Since(t1) < c.pause { // spin: a sleep would add a millisecond of its own
				}
				t2 := time.Now()
				require.NoError(b, bb.SendControl(a.Self(), msg))
				t3 := <-ia
				if c.idle > 0 {
					ways = append(ways, t1.Sub(t0))
				} else {
					ways = append(ways, t3.Sub(t2))
				}
			}
			// The process's CPU per round trip: both transports' workers and the bench's goroutines.
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(len(ways)), "cpu_us/op")
			slices.Sort(ways)
			b.ReportMetric(float64(ways[len(ways)/2].Nanoseconds())/1e3, "us_p50")
			b.ReportMetric(float64(ways[len(ways)*9/10].Nanoseconds())/1e3, "us_p90")
		})
	}
}

// processCPU is the user and system time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
