// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A short request's ranges read in place are shared by its loop and its lanes' movers through
// one cursor (inPlaceShare): however many take at once, every range is copied exactly once,
// and what each participant reports (the ranges it copied) together is every range.
func TestInPlaceShare_EveryRangeCopiedOnce(t *testing.T) {
	for _, c := range []struct {
		participants, ranges int
	}{{1, 1}, {2, 1}, {2, 16}, {4, 16}, {8, 1000}} {
		t.Run(fmt.Sprintf("%d participants, %d ranges", c.participants, c.ranges), func(t *testing.T) {
			ranges := make([]rmaRegion, c.ranges)
			for i := range ranges {
				ranges[i] = rmaRegion{src: int64(i), dst: int64(i), n: 1}
			}
			copied := make([]atomic.Int32, c.ranges)
			s := &inPlaceShare{ranges: ranges, copyRange: func(g rmaRegion) error {
				copied[g.src].Add(1)
				return nil
			}}
			reported := make([][]rmaRegion, c.participants)
			var wg sync.WaitGroup
			for p := range c.participants {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var err error
					reported[p], err = s.run()
					require.NoError(t, err)
				}()
			}
			wg.Wait()
			seen := make([]int, c.ranges)
			for _, r := range reported {
				for _, g := range r {
					seen[g.src]++
				}
			}
			for i := range ranges {
				require.EqualValues(t, 1, copied[i].Load(), "range %d copied", i)
				require.Equal(t, 1, seen[i], "range %d reported", i)
			}
			got, err := s.run()
			require.NoError(t, err)
			require.Empty(t, got, "a participant that comes after the last range copies nothing")
		})
	}
}

// A range that fails ends its participant's share with the error; the ranges it copied before
// are reported, the failed one is not.
func TestInPlaceShare_AFailedRangeEndsItsParticipant(t *testing.T) {
	bad := fmt.Errorf("refused")
	ranges := []rmaRegion{{0, 0, 1}, {1, 1, 1}, {2, 2, 1}}
	s := &inPlaceShare{ranges: ranges, copyRange: func(g rmaRegion) error {
		if g.src == 1 {
			return bad
		}
		return nil
	}}
	got, err := s.run()
	require.ErrorIs(t, err, bad)
	require.Equal(t, ranges[:1], got)
}

// The loop never waits on a late mover's whole share: a mover that took a range and is slow
// with it holds only that range; the loop, running its own share, copies every other range
// and returns while the mover still copies. Before, a mover that had begun its job (half of a
// 32-token request) owned all of it, and the request waited for that half.
func TestMoverPool_ASlowMoverHoldsOnlyTheRangeItTook(t *testing.T) {
	p := newMoverPool()
	p.limit = 1
	defer p.close()
	src := []byte("0123456789abcdef")
	x := &xfer{eng: &Engine{}, pool: make([]byte, len(src))}
	g := newGate(t)
	ranges := make([]rmaRegion, 8)
	for i := range ranges {
		ranges[i] = rmaRegion{src: int64(2 * i), dst: int64(2 * i), n: 2}
	}
	var first atomic.Bool
	s := &inPlaceShare{ranges: ranges, copyRange: func(r rmaRegion) error {
		if first.CompareAndSwap(false, true) {
			g.stick() // the mover's first range: held until the loop is done
		}
		copy(x.pool[r.dst:r.dst+r.n], src[r.src:r.src+r.n])
		return nil
	}}
	mover := &opRec{share: s}
	p.submit(x, mover)
	waitClosed(t, g.entered, "the mover took its first range and is held in it")

	loop := &opRec{share: s}
	p.runHere(x, loop) // returns while the mover still holds its range
	evs := x.box.Take(nil)
	require.Len(t, evs, 1, "the loop's event; the mover's is not back")
	require.Same(t, loop, evs[0].op)
	require.Equal(t, ranges[1:], loop.batch, "the loop copied every range the mover had not taken")

	g.let()
	eventually(t, func() bool { return x.box.Len() == 1 }, "the mover's event")
	evs = x.box.Take(nil)
	require.Same(t, mover, evs[0].op)
	require.Equal(t, ranges[:1], mover.batch)
	require.Equal(t, src, x.pool, "every byte")
	require.Zero(t, p.fence(context.Background()))
}

// A mover's share taken back by help (no worker began it: the only one is held) copies nothing:
// the loop's share emptied the cursor, so the request waits for no worker at all.
func TestMoverPool_HelpTakesBackAnEmptyShare(t *testing.T) {
	p := newMoverPool()
	p.limit = 1
	defer p.close()
	g := newGate(t)
	p.submit(&xfer{receive: true, mover: gateMover{g}}, &opRec{}) // the only worker, held
	waitClosed(t, g.entered, "the worker held")

	src := []byte("0123456789abcdef")
	x := &xfer{eng: &Engine{}, pool: make([]byte, len(src))}
	s := &inPlaceShare{ranges: []rmaRegion{{0, 0, 8}, {8, 8, 8}}, copyRange: func(r rmaRegion) error {
		copy(x.pool[r.dst:r.dst+r.n], src[r.src:r.src+r.n])
		return nil
	}}
	mover, loop := &opRec{share: s}, &opRec{share: s}
	p.submit(x, mover)
	p.runHere(x, loop)
	p.help(x)
	evs := x.box.Take(nil)
	require.Len(t, evs, 2)
	require.Same(t, loop, evs[0].op)
	require.Len(t, loop.batch, 2)
	require.Same(t, mover, evs[1].op)
	require.Empty(t, mover.batch)
	require.NoError(t, mover.moveErr)
	require.Equal(t, src, x.pool)
}

// standby readies a worker for a copy about to be queued: it waits for one awake (spinning)
// until its window has passed, and the copy queued meanwhile goes to it with no wake; after
// the window it sleeps again. With copies queued or running, or after fence or close, standby
// does nothing: the workers are awake, or none may start.
func TestMoverPool_StandbyWaitsAwakeForTheNextCopy(t *testing.T) {
	t.Run("a copy queued in the window goes to the waiting worker", func(t *testing.T) {
		p := newMoverPool()
		p.standbyFor = time.Minute // the test's window; a worker's, in the engine, is standbySpin
		defer p.close()
		p.standby()
		eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.spinning == 1 }, "a worker waits awake")
		src := []byte("0123456789abcdef")
		x := &xfer{eng: &Engine{}, pool: make([]byte, len(src))}
		p.submit(x, &opRec{buf: src, batch: []rmaRegion{{0, 0, 16}}})
		p.mu.Lock()
		wakes := p.wakes
		p.mu.Unlock()
		require.Zero(t, wakes, "no worker woken for it")
		eventually(t, func() bool { return x.box.Len() == 1 }, "the copy ran")
		require.Equal(t, src, x.pool)
		eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.idle == 1 && p.spinning == 0 },
			"the copy it waited for ended the window: the worker asleep again")
	})
	t.Run("after the window the worker sleeps", func(t *testing.T) {
		p := newMoverPool()
		defer p.close()
		p.standby()
		eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.idle == 1 && p.spinning == 0 }, "the worker asleep again")
	})
	t.Run("ended by its copy's end: the worker sleeps at once", func(t *testing.T) {
		p := newMoverPool()
		p.standbyFor = time.Minute
		defer p.close()
		_, until := p.standby()
		require.NotZero(t, until)
		eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.spinning == 1 }, "a worker waits awake")
		p.endStandby(until)
		eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.idle == 1 && p.spinning == 0 },
			"the worker asleep again long before its minute")
	})
	t.Run("a window another standby extended stays open", func(t *testing.T) {
		p := newMoverPool()
		p.standbyFor = time.Minute
		defer p.close()
		_, first := p.standby()
		time.Sleep(time.Millisecond) // the second window ends later than the first
		_, second := p.standby()
		require.Greater(t, second, first)
		p.endStandby(first)
		p.mu.Lock()
		open, spinning := p.standbyUntil, p.spinning
		p.mu.Unlock()
		require.Equal(t, second, open, "the later window still open")
		require.LessOrEqual(t, spinning, 1)
		p.endStandby(second)
		eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.idle == 1 && p.spinning == 0 }, "ended by its own end")
	})
	t.Run("one standby at a time", func(t *testing.T) {
		p := newMoverPool()
		p.limit = 4
		defer p.close()
		for range 8 {
			p.standby()
		}
		p.mu.Lock()
		running := p.running
		p.mu.Unlock()
		require.Equal(t, 1, running)
	})
	for _, c := range []struct {
		desc  string
		setup func(p *moverPool)
	}{
		{"after fence: nothing", func(p *moverPool) { require.Zero(t, p.fence(context.Background())) }},
		{"after close: nothing", func(p *moverPool) { p.close() }},
		{"a copy running: nothing", func(p *moverPool) {
			g := newGate(t)
			p.submit(&xfer{receive: true, mover: gateMover{g}}, &opRec{})
			waitClosed(t, g.entered, "a worker busy")
		}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			p := newMoverPool()
			p.limit = 4
			defer p.close()
			c.setup(p)
			p.mu.Lock()
			running := p.running
			p.mu.Unlock()
			from, until := p.standby()
			require.Zero(t, until, "no window to end")
			require.Zero(t, from)
			p.mu.Lock()
			defer p.mu.Unlock()
			require.Equal(t, running, p.running, "no worker started")
			require.Zero(t, p.standbyUntil)
		})
	}
}

// standbyLead: the standby window is standbySpin until a lead is known, then twice the leads'
// moving average, never under standbyMin nor over standbySpin.
func TestMoverPool_StandbyWindowFollowsTheLead(t *testing.T) {
	p := newMoverPool()
	defer p.close()
	require.Equal(t, standbySpin, p.standbyFor, "no lead yet")
	p.standbyLead(30 * time.Microsecond)
	require.Equal(t, 60*time.Microsecond, p.standbyFor, "the first lead, twice")
	p.standbyLead(110 * time.Microsecond)
	require.Equal(t, 80*time.Microsecond, p.standbyFor, "an eighth of the way to the new lead: 40 us, twice")
	for range 100 {
		p.standbyLead(time.Millisecond)
	}
	require.Equal(t, standbySpin, p.standbyFor, "long leads: at most standbySpin")
	for range 200 {
		p.standbyLead(time.Microsecond)
	}
	require.Equal(t, standbyMin, p.standbyFor, "short leads: at least standbyMin")
}

// othersActive (what a short read in place asks as it splits its ranges, splitForLanes) is
// true only while another sub-transfer's goroutine than the caller's runs, queued or moving.
func TestEngine_OthersActive(t *testing.T) {
	e := &Engine{}
	e.liveDrivers.Add(1) // the caller's own
	require.False(t, e.othersActive(), "the caller alone")
	e.liveDrivers.Add(1)
	require.True(t, e.othersActive(), "another transfer running")
	e.liveDrivers.Add(-1)
	require.False(t, e.othersActive(), "the other one ended")
}
