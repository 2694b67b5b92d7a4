// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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
	k, err := newWaker(false)
	require.NoError(b, err)
	defer k.close()
	idle := func() bool { return true }
	var over time.Duration
	for b.Loop() {
		start := time.Now()
		k.sleep(20*time.Microsecond, false, idle)
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

// asleep waits (generously: a loaded box) until w's loop has gone to sleep.
func asleep(t *testing.T, w *Worker) {
	t.Helper()
	require.Eventually(t, w.wake.sleeping.Load, 10*time.Second, 100*time.Microsecond,
		"the worker never went to sleep")
}

// asleepArmed waits until w's loop sleeps armed: in the sleep UCX ends for a message, not in
// the back-off that follows ucp_worker_arm's BUSY, which only its timer, a command or Close ends.
func asleepArmed(t *testing.T, w *Worker) {
	t.Helper()
	require.Eventually(t, func() bool { return w.wake.sleeping.Load() && w.wake.armed.Load() }, 10*time.Second, 100*time.Microsecond,
		"the worker never went to sleep armed")
}

// A worker UCX can wake (shared memory and TCP both can) sleeps until a message lands, not
// until a timer: with every armed sleep made 20 s long, a message to a worker that went to sleep
// waiting for it is still received at once (within 5 s on a loaded box; a worker that waited
// for its timer would take the whole 20 s). The same worker then ends its sleep for a
// command and for Close.
func TestWorker_UCXWakesTheSleepForAMessage(t *testing.T) {
	const sleep, bound = 20 * time.Second, 5 * time.Second
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPairWith(t, ContextConfig{TLS: tr.tls}, ContextConfig{TLS: tr.tls}, WorkerConfig{fixedSleep: sleep})
			require.True(t, p.b.wakeable, "UCX gave %s no wakeup", tr.name)
			src := alloc(t, p.ctxA, 4096)
			dst := alloc(t, p.ctxB, 4096)
			require.NoError(t, src.FillPattern(0, 4096, 0, 5))
			for i := range 3 {
				recv := p.ba.TagRecv(dst, 0, 4096, uint64(100+i), ^uint64(0))
				asleepArmed(t, p.b) // the receive posted, nothing to do until the message
				start := time.Now()
				send := p.ab.TagSend(src, 0, 4096, uint64(100+i))
				waitAll(t, bound, recv, send)
				require.Less(t, time.Since(start), bound)
				bad, err := dst.CheckPattern(0, 4096, 0, 5)
				require.NoError(t, err)
				require.Equal(t, int64(-1), bad)
			}
			// A command ends the armed sleep.
			asleepArmed(t, p.b)
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			require.NoError(t, p.b.call(ctx, func() {}))
		})
	}
}

// An idle worker UCX can wake sleeps up to armedSleepMax at a time, not MaxSleep (1 ms): its
// sleep ends for a message, a completion or a command, and a timer that ended it every
// millisecond woke the thread a thousand times a second for nothing, in each idle worker of
// each process (on the 2-core VM those wakes took the core a read in place was being copied
// on: docs/benchmarks.md, "The armed sleep's bound"). Over 300 ms a worker with a receive
// pending and nothing else to do may end at most 30 armed sleeps by its timer (300 at 1 ms).
func TestWorker_AnIdleArmedWorkerSleepsPastMaxSleep(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			a := newArmedIdle(t, tr.name, tr.tls, WorkerConfig{})
			require.Equal(t, time.Millisecond, a.w.cfg.MaxSleep)
			before := a.w.timerWakes.Load()
			time.Sleep(300 * time.Millisecond)
			n := a.w.timerWakes.Load() - before
			require.LessOrEqual(t, n, uint64(30), "armed sleeps ended by the timer in 300 ms")
			require.NoError(t, a.w.Close())
			a.closed(t)
		})
	}
}

// armedIdle is a worker UCX can wake, asleep armed with one receive pending and nothing else
// to do.
type armedIdle struct {
	c    *Context
	w    *Worker
	m    *Memory
	recv *Request
}

func newArmedIdle(t *testing.T, name, tls string, wcfg WorkerConfig) armedIdle {
	t.Helper()
	cfg := ContextConfig{TLS: tls}
	if name == "tcp" {
		cfg.NetDevices = "lo"
	}
	c, err := NewContext(cfg)
	require.NoError(t, err)
	w, err := c.NewWorker(wcfg)
	require.NoError(t, err)
	require.True(t, w.wakeable)
	m, err := c.Allocate(64)
	require.NoError(t, err)
	recv := w.TagRecv(m, 0, 64, 1, ^uint64(0))
	asleepArmed(t, w)
	return armedIdle{c: c, w: w, m: m, recv: recv}
}

// closed checks, after the worker's Close, that the pending receive completed cancelled, and
// frees the rest.
func (a armedIdle) closed(t *testing.T) {
	t.Helper()
	require.True(t, a.recv.Completed())
	require.Error(t, a.recv.Err(), "cancelled by Close")
	require.NoError(t, a.m.Close())
	require.NoError(t, a.c.Close())
}

// Close ends an armed sleep too, with a receive still pending (it completes cancelled).
func TestWorker_CloseEndsAnArmedSleep(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			a := newArmedIdle(t, tr.name, tr.tls, WorkerConfig{fixedSleep: 20 * time.Second})
			done := make(chan error, 1)
			go func() { done <- a.w.Close() }()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("Close waited out the armed sleep")
			}
			a.closed(t)
		})
	}
}

// After a message, a worker UCX can wake, with only receives pending (the transport's
// standing control receive always is), spins a bounded time (wakeSpin), not SpinRounds empty
// rounds: each message used to cost each process a core for about a millisecond
// (docs/benchmarks.md, "Where a one-hop 32-token request's time goes"). Counted in rounds,
// not timed: the fewest of five messages' rounds, between the message and the worker's sleep,
// under half of SpinRounds (20 us of rounds is a few hundred even on a fast core; a worker
// that spun SpinRounds would make at least that many after each). The fewest, not each: any
// other event in the window (over TCP the wireup of the endpoint's first message, a keepalive
// every 200 ms) starts a new 20 us spin, and on a loaded host (load ~25) a window that took
// several of them once counted more than half of SpinRounds.
func TestWorker_ReceivesAloneSpinBriefly(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPairWith(t, ContextConfig{TLS: tr.tls}, ContextConfig{TLS: tr.tls}, WorkerConfig{})
			require.True(t, p.b.wakeable)
			src := alloc(t, p.ctxA, 64)
			dst := alloc(t, p.ctxB, 64)
			standing := p.ba.TagRecv(dst, 0, 64, 7, ^uint64(0)) // never matched
			// A first message connects the endpoint (over TCP a wireup of several messages).
			waitAll(t, 10*time.Second, p.ba.TagRecv(dst, 0, 64, 9, ^uint64(0)), p.ab.TagSend(src, 0, 64, 9))
			var each []uint64
			for i := range 5 {
				recv := p.ba.TagRecv(dst, 0, 64, uint64(10+i), ^uint64(0))
				asleep(t, p.b)
				before := p.b.emptyRounds.Load()
				waitAll(t, 10*time.Second, recv, p.ab.TagSend(src, 0, 64, uint64(10+i)))
				asleep(t, p.b)
				rounds := p.b.emptyRounds.Load() - before
				each = append(each, rounds)
			}
			require.Less(t, slices.Min(each), uint64(p.b.cfg.SpinRounds/2), "empty rounds after each message: %v", each)
			require.True(t, standing.Cancel())
			select {
			case <-standing.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the cancelled receive never completed")
			}
		})
	}
}

// pendReceives posts receives on p.ba that nothing matches, so the worker has receives
// pending: the standing one's stand-in, and with awaiting an IOV receive awaiting its message.
// They are cancelled before their memory's Close (cleanups run last first).
func pendReceives(t *testing.T, p *ucxPair, awaiting bool) {
	t.Helper()
	dst := alloc(t, p.ctxB, 4096)
	pending := []*Request{p.ba.TagRecv(dst, 0, 64, 7, ^uint64(0))}
	if awaiting {
		pending = append(pending, p.ba.TagRecvIOV(dst, []Segment{{0, 1024}, {2048, 1024}}, 8, ^uint64(0)))
	}
	t.Cleanup(func() {
		for _, r := range pending {
			require.True(t, r.Cancel())
			select {
			case <-r.Done():
			case <-time.After(10 * time.Second):
				t.Error("a cancelled receive never completed")
			}
		}
	})
}

// roundsAfterCommands runs n empty commands on w, each from one sleep of its loop to the next,
// and returns the empty progress rounds the loop made after each: a spin after a command makes
// over a hundred, an arm at once a few.
func roundsAfterCommands(t *testing.T, w *Worker, n int) []uint64 {
	t.Helper()
	each := make([]uint64, 0, n)
	for range n {
		asleep(t, w)
		before := w.emptyRounds.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		require.NoError(t, w.call(ctx, func() {}))
		cancel()
		asleep(t, w)
		each = append(each, w.emptyRounds.Load()-before)
	}
	return each
}

// A worker UCX cannot wake (a context without UCP_FEATURE_WAKEUP) keeps the polling loop:
// messages and commands still reach it.
func TestWorker_WithoutWakeupPolls(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			cfg := ContextConfig{TLS: tr.tls, noWakeup: true}
			p := newPairWith(t, cfg, cfg, WorkerConfig{MaxSleep: 5 * time.Millisecond})
			require.False(t, p.b.wakeable)
			src := alloc(t, p.ctxA, 4096)
			dst := alloc(t, p.ctxB, 4096)
			for i := range 3 {
				recv := p.ba.TagRecv(dst, 0, 4096, uint64(i), ^uint64(0))
				asleep(t, p.b)
				waitAll(t, 10*time.Second, recv, p.ab.TagSend(src, 0, 4096, uint64(i)))
			}
		})
	}
}

// A worker UCX can wake spins 150 us after it ran a command (commandSpin) to save the wake
// of a command that follows, with its P. While other goroutines of the process wait for a P
// (16 concurrent reads copying on two cores, docs/benchmarks.md) that spin takes their core,
// so the worker arms at once instead. Counted in rounds, not timed, with the 20 us spin after
// activity shortened to nothing to see the command's alone: with more busy goroutines than
// Ps, a command is followed by a few empty rounds before the worker sleeps, the fewest of five
// commands under 32 (its 150 us spin was 122 to 273 rounds after each).
func TestWorker_NoSpinWhileGoroutinesWaitForAP(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := newPairWith(t, ContextConfig{TLS: tr.tls}, ContextConfig{TLS: tr.tls}, WorkerConfig{wakeSpin: time.Nanosecond})
			require.True(t, p.b.wakeable)
			dst := alloc(t, p.ctxB, 64)
			// Never matched: receives are pending. Cancelled before dst's Close (cleanups run last
			// first).
			standing := p.ba.TagRecv(dst, 0, 64, 7, ^uint64(0))
			t.Cleanup(func() {
				require.True(t, standing.Cancel())
				select {
				case <-standing.Done():
				case <-time.After(10 * time.Second):
					t.Error("the cancelled receive never completed")
				}
			})
			asleep(t, p.b)

			// More goroutines that never block than Ps: at any moment some wait for one.
			var stop atomic.Bool
			var wg sync.WaitGroup
			defer wg.Wait()
			defer stop.Store(true)
			deadline := time.Now().Add(2 * time.Minute) // bounds them if the test dies early
			for range runtime.GOMAXPROCS(0) + 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; !stop.Load(); n++ {
						if n%1024 == 0 && time.Now().After(deadline) {
							return
						}
					}
				}()
			}
			least := slices.Min(roundsAfterCommands(t, p.b, 5))
			// The fewest of five: a keepalive or an arm that says BUSY can add up to armBusyRounds
			// rounds to one command's count; the spin adds over a hundred to every one.
			require.Less(t, least, uint64(2*armBusyRounds), "empty rounds between a command and the sleep, with goroutines waiting for a P")
		})
	}
}

// A wake costs its caller a system call that, on a 2-core VM, held it 36-42 us at the median
// (docs/benchmarks.md, "Where a one-block request's time goes on this VM"): a command queued
// while the wake of an earlier one is still on its way must not pay for another. And none is
// lost: each new sleep is ended by the first wake after it began, whatever wakes came before.
func TestWaker_OneWakePerSleep(t *testing.T) {
	k, err := newWaker(false)
	require.NoError(t, err)
	defer k.close()

	cases := []struct {
		desc  string
		wakes int
	}{
		{"one command", 1},
		{"a burst of three (a claim, Done, a release)", 3},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			// A loop that went to sleep and has not yet seen the first wake.
			k.beginSleep(20*time.Second, false)
			before := k.wakes.Load()
			for range tc.wakes {
				k.wake()
			}
			require.Equal(t, uint64(1), k.wakes.Load()-before, "wakes that found one on its way woke the loop again")
			k.sleeping.Store(false)

			// The next sleep is ended by a wake, though one was on its way before it began.
			for range 2 {
				slept := make(chan struct{})
				go func() {
					defer close(slept)
					k.sleep(20*time.Second, false, func() bool { return true })
				}()
				require.Eventually(t, k.sleeping.Load, 10*time.Second, 50*time.Microsecond)
				k.wake()
				select {
				case <-slept:
				case <-time.After(10 * time.Second):
					t.Fatal("the wake was lost: the sleep ran on")
				}
			}
		})
	}
}

// wakerSleeps are the ways a worker's loop sleeps: on the timer alone (a worker UCX cannot
// wake), and on a waker with a set, both on the timer alone (the back-off after BUSYs) and
// armed (UCX's fds in the set). idle is the loop's look for work before it parks.
var wakerSleeps = []struct {
	name  string
	set   bool
	sleep func(k *waker, d time.Duration, idle func() bool) wakeReason
}{
	{"timer", false, func(k *waker, d time.Duration, idle func() bool) wakeReason { return k.sleep(d, false, idle) }},
	{"set-timer", true, func(k *waker, d time.Duration, idle func() bool) wakeReason { return k.sleep(d, false, idle) }},
	{"set-armed", true, func(k *waker, d time.Duration, idle func() bool) wakeReason { return k.sleepArmed(d, false, idle) }},
}

// wakeFor is a command for a sleeping waker, as Worker.submit makes one: the work is
// queued (queued, which the sleeper's idle reads) before the wake.
type wakeFor struct{ queued atomic.Bool }

func (c *wakeFor) send(k *waker) { c.queued.Store(true); k.wake() }
func (c *wakeFor) idle() bool    { return !c.queued.Load() }

// A wake ends the sleep it was for and no other: each of three 20 s sleeps ends within 5 s of
// its wake (a lost wake sleeps the 20 s), and a 50 ms sleep after them, with no wake, lasts
// its 50 ms (a wake left pending would end it at once, and every sleep after it).
func TestWaker_AWakeEndsOneSleep(t *testing.T) {
	for _, tc := range wakerSleeps {
		t.Run(tc.name, func(t *testing.T) {
			k, err := newWaker(tc.set)
			require.NoError(t, err)
			defer k.close()
			for range 3 {
				var c wakeFor
				done := make(chan struct{})
				go func() { tc.sleep(k, 20*time.Second, c.idle); close(done) }()
				require.Eventually(t, k.sleeping.Load, 10*time.Second, 100*time.Microsecond)
				c.send(k)
				k.wake() // a second wake for the same sleep is no second wake
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("the wake did not end the sleep")
				}
			}
			start := time.Now()
			tc.sleep(k, 50*time.Millisecond, func() bool { return true })
			require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond,
				"a sleep ended early: a wake was left pending")
		})
	}
}

// A sleep says what ended it, which the worker's hop stamps name (kvxbench --hops: what woke
// a worker in the middle of a request): a wake, the timer, one of UCX's fds (an armed sleep
// only: an fd of ours added to the set as UCX adds its own), or work queued before it parked.
func TestWaker_ASleepSaysWhatEndedIt(t *testing.T) {
	for _, tc := range wakerSleeps {
		t.Run(tc.name, func(t *testing.T) {
			k, err := newWaker(tc.set)
			require.NoError(t, err)
			defer k.close()

			// The command goes once the sleeper has looked for work and found none: sent
			// between its sleeping mark and that look, it is work queued, not a wake.
			var c wakeFor
			looked := make(chan struct{})
			var once sync.Once
			idle := func() bool { defer once.Do(func() { close(looked) }); return c.idle() }
			got := make(chan wakeReason, 1)
			go func() { got <- tc.sleep(k, 20*time.Second, idle) }()
			select {
			case <-looked:
			case <-time.After(10 * time.Second):
				t.Fatal("the sleeper never looked for work")
			}
			c.send(k)
			require.Equal(t, wokeCommand, waitReason(t, got))

			require.Equal(t, wokeTimer, tc.sleep(k, time.Millisecond, func() bool { return true }))
			require.Equal(t, wokeWork, tc.sleep(k, 20*time.Second, func() bool { return false }))

			if tc.name != "set-armed" {
				return
			}
			ucx, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC) // as UCX adds its fd to the set
			require.NoError(t, err)
			defer func() { _ = unix.Close(ucx) }()
			require.NoError(t, unix.EpollCtl(k.eventFD(), unix.EPOLL_CTL_ADD, ucx, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ucx)}))
			go func() { got <- tc.sleep(k, 20*time.Second, func() bool { return true }) }()
			require.Eventually(t, k.sleeping.Load, 10*time.Second, 100*time.Microsecond)
			one := [8]byte{1}
			_, err = unix.Write(ucx, one[:])
			require.NoError(t, err)
			require.Equal(t, wokeUCX, waitReason(t, got))
		})
	}
}

func waitReason(t *testing.T, got <-chan wakeReason) wakeReason {
	t.Helper()
	select {
	case r := <-got:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the sleep did not end")
		return 0
	}
}

// What a wake costs the goroutine that queues a command for a sleeping worker (each of a
// request's sends, receives and cancels is one): us_wake is the time inside wake, us_woken
// from the wake until the sleep returned. The timerfd re-armed to expire at once, as wakes
// were made before, took 32-53 us per wake on the 2-core Firecracker VM (likely its LAPIC
// deadline timer, which the hypervisor traps); the eventfd write about 1 us.
func BenchmarkWakerWake(b *testing.B) {
	for _, tc := range wakerSleeps {
		b.Run(tc.name, func(b *testing.B) {
			k, err := newWaker(tc.set)
			require.NoError(b, err)
			defer k.close()
			var in, woken time.Duration
			for b.Loop() {
				var c wakeFor
				done := make(chan struct{})
				go func() { tc.sleep(k, time.Second, c.idle); close(done) }()
				for !k.sleeping.Load() {
					runtime.Gosched()
				}
				start := time.Now()
				c.send(k)
				in += time.Since(start)
				<-done
				woken += time.Since(start)
			}
			b.ReportMetric(float64(in.Nanoseconds())/1e3/float64(b.N), "us_wake")
			b.ReportMetric(float64(woken.Nanoseconds())/1e3/float64(b.N), "us_woken")
		})
	}
}

// The command spin saves the wake of a command that follows within 150 us. A worker that
// awaits a message into an IOV receive (the direct path's, after its claim went out) is woken
// by that message, and its next command (the Done) comes only after it: over TCP its spin
// saved nothing and, on a host with few cores, delayed the peer that had to answer the claim
// (docs/benchmarks.md, "The TCP 32-token request hop by hop on this host"). So such a worker
// arms at once after a command, and one with only other receives pending still spins. Counted
// in rounds, with the 20 us spin after activity shortened to nothing: while an IOV receive is
// pending at most one of five commands is followed by 2*armBusyRounds empty rounds or more (a
// keepalive or an arm that says BUSY adds up to armBusyRounds to one), without one the most of
// five at least that (the spin made 122 to 273; under load the scheduler watch may skip some).
func TestWorker_NoCommandSpinWhileAMessageIsAwaited(t *testing.T) {
	for _, tr := range transports {
		for _, tc := range []struct {
			name     string
			awaiting bool // an IOV receive is pending besides the standing one
		}{
			{"an IOV receive pending: arms at once", true},
			{"other receives alone: spins", false},
		} {
			t.Run(tr.name+"/"+tc.name, func(t *testing.T) {
				// Ps enough that the scheduler watch never sees goroutines wait for one (the
				// two workers, this goroutine): the spin is then the command's alone to decide.
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
				p := newPairWith(t, ContextConfig{TLS: tr.tls}, ContextConfig{TLS: tr.tls}, WorkerConfig{wakeSpin: time.Nanosecond})
				require.True(t, p.b.wakeable)
				pendReceives(t, p, tc.awaiting)
				each := roundsAfterCommands(t, p.b, 5)
				t.Logf("empty rounds after each command: %v", each)
				if tc.awaiting {
					spun := 0
					for _, n := range each {
						if n >= 2*armBusyRounds {
							spun++
						}
					}
					require.Less(t, spun, 2, "commands followed by a spin: empty rounds between a command and the sleep %v", each)
				} else {
					require.GreaterOrEqual(t, slices.Max(each), uint64(2*armBusyRounds), "empty rounds between a command and the sleep: %v", each)
				}
			})
		}
	}
}

// A worker spinning with nothing to do gives its core away, each empty round past
// spinYieldRounds (sched_yield): on a host with fewer cores than busy threads the peer process
// or this one's own movers wait for the core it holds (Go's Gosched yields only the P). Counted
// after each of three commands, from one sleep of the loop to the next: a polling worker (no
// UCP_FEATURE_WAKEUP) with a receive pending spins SpinRounds empty rounds after a command and
// yields in every one past the threshold (a keepalive in the window starts another spin, and
// more); one whose spin ends by the threshold, or that arms at once (an IOV receive awaits its
// message, the spin after activity shortened to nothing), never yields. Every yield is an empty
// round's.
func TestWorker_ASpinPastYieldRoundsYieldsItsCore(t *testing.T) {
	for _, tr := range transports {
		for _, tc := range []struct {
			name     string
			polling  bool // a context without UCP_FEATURE_WAKEUP
			spin     int  // WorkerConfig.SpinRounds
			awaiting bool // an IOV receive is pending besides the standing one
			least    uint64
			none     bool
		}{
			{"polling, 512-round spin: yields past the threshold", true, 512, false, 512 - 1 - spinYieldRounds, false},
			{"polling, spin ends at the threshold: never yields", true, spinYieldRounds, false, 0, true},
			{"wakeable, arms at once: never yields", false, 0, true, 0, true},
		} {
			t.Run(tr.name+"/"+tc.name, func(t *testing.T) {
				cfg := ContextConfig{TLS: tr.tls, noWakeup: tc.polling}
				p := newPairWith(t, cfg, cfg, WorkerConfig{SpinRounds: tc.spin, MaxSleep: 5 * time.Millisecond, wakeSpin: time.Nanosecond})
				require.Equal(t, !tc.polling, p.b.wakeable)
				pendReceives(t, p, tc.awaiting)
				for i := range 3 {
					asleep(t, p.b)
					rounds, yields := p.b.emptyRounds.Load(), p.b.yields.Load()
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					require.NoError(t, p.b.call(ctx, func() {}))
					cancel()
					asleep(t, p.b)
					rounds, yields = p.b.emptyRounds.Load()-rounds, p.b.yields.Load()-yields
					t.Logf("command %d: %d empty rounds, %d yields", i, rounds, yields)
					require.LessOrEqual(t, yields, rounds, "yields outside empty rounds")
					if tc.none {
						require.Zero(t, yields, "a worker that spun no further than the threshold yielded")
					} else {
						require.GreaterOrEqual(t, yields, tc.least, "a spinning worker kept its core past the threshold")
					}
				}
			})
		}
	}
}

// A receive's post wakes a sleeping worker only when the receive may match at once: when the
// worker holds an unexpected message. Otherwise the message it waits for wakes the worker when
// it lands (the loop runs every queued command before it progresses), so a wake for the post
// only buys the worker an extra sleep and wake of its locked thread: the transport re-posts its
// standing control receive after every control message, and the prefill of 16 concurrent
// 32-token reads woke its worker for that twice a request (docs/benchmarks.md, "Receives that
// wait for their message"). Every armed sleep made 20 s long, each kind of receive, posted to a
// worker asleep armed: with nothing held the post does not wake it and the message, sent
// after, is still received at once; with its message held the post wakes it and completes at
// once. The data is checked either way.
func TestWorker_AReceiveWakesTheLoopOnlyForAHeldMessage(t *testing.T) {
	const sleep, bound = 20 * time.Second, 5 * time.Second
	kinds := []struct {
		name string
		post func(p *ucxPair, dst *Memory, tag uint64) *Request
		got  func(r *Request, dst *Memory) []byte
	}{
		{"TagRecv", func(p *ucxPair, dst *Memory, tag uint64) *Request { return p.ba.TagRecv(dst, 0, 64, tag, ^uint64(0)) },
			func(_ *Request, dst *Memory) []byte { return dst.Bytes()[:64] }},
		{"TagRecvIOV", func(p *ucxPair, dst *Memory, tag uint64) *Request {
			return p.ba.TagRecvIOV(dst, []Segment{{0, 32}, {32, 32}}, tag, ^uint64(0))
		}, func(_ *Request, dst *Memory) []byte { return dst.Bytes()[:64] }},
		{"TagRecvBytes", func(p *ucxPair, _ *Memory, tag uint64) *Request { return p.b.TagRecvBytes(p.ba, 64, tag, ^uint64(0)) },
			func(r *Request, _ *Memory) []byte { return r.Data() }},
	}
	for _, tr := range transports {
		for _, kind := range kinds {
			for _, held := range []bool{false, true} {
				name := tr.name + "/" + kind.name + "/nothing held: no wake"
				if held {
					name = tr.name + "/" + kind.name + "/its message held: a wake"
				}
				t.Run(name, func(t *testing.T) {
					p := newPairWith(t, ContextConfig{TLS: tr.tls}, ContextConfig{TLS: tr.tls}, WorkerConfig{fixedSleep: sleep})
					require.True(t, p.b.wakeable)
					src := alloc(t, p.ctxA, 64)
					dst := alloc(t, p.ctxB, 64)
					// A first message connects the endpoint (over TCP a wireup of several messages).
					waitAll(t, bound, p.ba.TagRecv(dst, 0, 64, 1, ^uint64(0)), p.ab.TagSend(src, 0, 64, 1))
					require.NoError(t, src.FillPattern(0, 64, 0, 9))
					var send *Request
					if held {
						send = p.ab.TagSend(src, 0, 64, 2)
						waitAll(t, bound, send)
					}
					require.Eventually(t, func() bool {
						return p.b.wake.sleeping.Load() && p.b.wake.armed.Load() && p.b.Stats().UnexpectedHeld == map[bool]uint64{false: 0, true: 1}[held]
					}, 10*time.Second, 100*time.Microsecond, "the worker never went to sleep armed with the message held or not")
					before := p.b.wake.wakes.Load()
					start := time.Now()
					recv := kind.post(p, dst, 2)
					woke := p.b.wake.wakes.Load() - before
					if !held {
						send = p.ab.TagSend(src, 0, 64, 2)
					}
					waitAll(t, bound, recv, send) // first: a failure below leaves nothing pending
					require.Less(t, time.Since(start), bound)
					require.Equal(t, src.Bytes()[:64], kind.got(recv, dst))
					if held {
						require.Equal(t, uint64(1), woke, "a receive that may match a held message did not wake the worker")
					} else {
						require.Zero(t, woke, "a receive with nothing to match woke the sleeping worker")
					}
				})
			}
		}
	}
}
