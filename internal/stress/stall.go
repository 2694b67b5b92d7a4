// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// A stall is time this process's goroutines were due to run and did not: on a host with more
// runnable threads than cores (the shared CI VM runs at a load of 20 to 30 on 2 cores), the
// kernel or Go's scheduler can leave every goroutine of the process waiting for a second or
// more. A transfer cannot end while its engine cannot run (neither its deadline timer nor its
// observer's queue, which closes Done, gets a core), so the wedge check does not count that
// time against the transfer: a handle is wedged when it has no outcome within its bound
// plus the time this process stalled since the handle started (stallMeter.since), and that
// credit is named in the breach when it was given. A transfer stuck while its process runs
// gets no credit and is still reported at its bound.
//
// stallMeter measures stalls with one goroutine that sleeps stallTick at a time: whatever a
// wake-up is late beyond stallSlack is a stall, kept (end time and length) in a ring long
// enough to cover any handle's bounds.
type stallMeter struct {
	mu      sync.Mutex
	ring    [stallRing]stall
	n       int // stalls recorded, ever
	total   time.Duration
	longest time.Duration
	longAt  time.Time
	onLong  func(end time.Time, d time.Duration) // hears each stall over stallLong (setOnLong)
	// last is when the meter last woke (unix nanoseconds; 0 before its first): a checker that
	// wakes from a stall before the meter does counts the stall still in progress from it.
	last atomic.Int64
}

type stall struct {
	end time.Time
	d   time.Duration
}

const (
	stallTick  = 10 * time.Millisecond
	stallSlack = 5 * time.Millisecond
	stallRing  = 1 << 14 // at most 100 stalls a second: over 2 minutes, longer than any bound
	stallLong  = 500 * time.Millisecond
)

var (
	stalls = &stallMeter{}

	stallsMu    sync.Mutex
	stallsUsers int
	stallsStop  chan struct{}
	stallsDone  chan struct{}
)

// processStalls is this process's stall meter. It measures while a run holds it (useStalls);
// between runs it keeps its figures and counts nothing in progress.
func processStalls() *stallMeter { return stalls }

// useStalls has the meter run until the returned release is called; the meter runs while
// anyone holds it (one goroutine, one sleep per stallTick), and stops with the last release,
// so a run leaves no goroutine behind.
func useStalls() (release func()) {
	stallsMu.Lock()
	defer stallsMu.Unlock()
	if stallsUsers == 0 {
		stallsStop, stallsDone = make(chan struct{}), make(chan struct{})
		go stalls.run(stallsStop, stallsDone)
	}
	stallsUsers++
	var once sync.Once
	return func() {
		once.Do(func() {
			stallsMu.Lock()
			defer stallsMu.Unlock()
			if stallsUsers--; stallsUsers == 0 {
				close(stallsStop)
				<-stallsDone
			}
		})
	}
}

func (m *stallMeter) run(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	defer m.last.Store(0) // stopped: no stall is in progress
	prev := time.Now()
	m.last.Store(prev.UnixNano())
	t := time.NewTicker(stallTick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := time.Now()
		if late := now.Sub(prev) - stallTick; late > stallSlack {
			m.record(now, late)
		}
		m.last.Store(now.UnixNano())
		prev = now
	}
}

// record notes a stall of d that ended at end.
func (m *stallMeter) record(end time.Time, d time.Duration) {
	m.mu.Lock()
	m.ring[m.n%stallRing] = stall{end: end, d: d}
	m.n++
	m.total += d
	if d > m.longest {
		m.longest, m.longAt = d, end
	}
	onLong := m.onLong
	m.mu.Unlock()
	if d > stallLong && onLong != nil {
		onLong(end, d)
	}
}

// setOnLong has f hear each stall longer than stallLong (the soak logs them, so a breach can
// be read against them).
func (m *stallMeter) setOnLong(f func(end time.Time, d time.Duration)) {
	m.mu.Lock()
	m.onLong = f
	m.mu.Unlock()
}

// since is how long this process stalled after t (the part of a stall that began before t
// is not counted), the stall still in progress included: when the process resumes, its
// goroutines wake in any order, and a checker that runs before the meter has recorded the
// stall it just came out of must count it too.
func (m *stallMeter) since(t time.Time) time.Duration {
	return m.sinceAt(t, time.Now())
}

func (m *stallMeter) sinceAt(t, now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sum time.Duration
	if l := m.last.Load(); l != 0 {
		last := time.Unix(0, l)
		if ongoing := now.Sub(last) - stallTick; ongoing > stallSlack {
			sum += min(ongoing, now.Sub(t))
		}
	}
	for i := 1; i <= min(m.n, stallRing); i++ {
		s := m.ring[(m.n-i)%stallRing]
		if !s.end.After(t) {
			break // the ring is in end order
		}
		sum += min(s.d, s.end.Sub(t))
	}
	return sum
}

// figures returns the total and the longest stall so far, and when the longest ended.
func (m *stallMeter) figures() (total, longest time.Duration, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.total, m.longest, m.longAt
}

// waitCredited waits for ch to close until by, then, as long as this process stalled since
// start by more than the credit given so far, for that much longer (a few rounds at most, each
// for the stall measured meanwhile). It reports whether ch closed and the credit given.
func waitCredited(ch <-chan struct{}, start, by time.Time) (bool, time.Duration) {
	return processStalls().waitCredited(ch, start, by)
}

func (m *stallMeter) waitCredited(ch <-chan struct{}, start, by time.Time) (bool, time.Duration) {
	var given time.Duration
	for range 8 {
		if waitUntil(ch, by) {
			return true, given
		}
		more := m.since(start) - given
		if more < stallSlack {
			return false, given
		}
		given += more
		by = by.Add(more)
	}
	return waitUntil(ch, by), given
}

// lateNote tells a late outcome from a stuck one, for a handle that missed its outcome bound
// (credit included): it waits for ch until until at most and says whether Done closed after
// all (late: the process was slow in a way the stall meter does not count, or the outcome came
// past its bound) or is still open then (stuck: a wedge of the engine to explain).
func lateNote(ch <-chan struct{}, bound, until time.Time) string {
	if waitUntil(ch, until) {
		return fmt.Sprintf("; Done closed within %v past the bound: late, not stuck", max(time.Since(bound), 0).Round(time.Millisecond))
	}
	return fmt.Sprintf("; Done still open %v past the bound: stuck", until.Sub(bound).Round(time.Millisecond))
}

// creditNote names the stall credit a breach was given, if any.
func creditNote(credit time.Duration) string {
	if credit == 0 {
		return ""
	}
	return fmt.Sprintf(" (%v of it this process stalled)", credit.Round(time.Millisecond))
}

// watchStalls logs each stall of this process over stallLong while the soak runs, and makes
// one longer than a whole transfer's outcome bound (doneBound of TransferTimeout) a breach of
// its own: no goroutine of the process ran for that long, which the host's load alone has
// not come near here (4.8 s at most at a load of 22 on 2 cores), so the process may have
// frozen itself (a call holding every thread); the soak says what it measured instead of
// calling the transfers then in flight wedged. Shorter stalls are the host's: credited,
// logged and reported (longest and total), not breaches. It returns the function that stops
// the watch.
func (s *soak) watchStalls(m *stallMeter) func() {
	bound := s.doneBound(s.cfg.TransferTimeout)
	m.setOnLong(func(end time.Time, d time.Duration) {
		s.log.Warn("this process stalled", zap.Duration("for", d), zap.Time("until", end))
		if d > bound {
			s.addBreach(fmt.Sprintf("this process stalled %v (until %s): no goroutine of it ran for longer than a "+
				"transfer's outcome bound %v; handles in flight then were credited with it, not called wedged",
				d.Round(time.Millisecond), end.UTC().Format("15:04:05.000"), bound))
		}
	})
	return func() { m.setOnLong(nil) }
}

// closedChan is a channel already closed: a wait on it is bounded by its own timeout alone.
func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
