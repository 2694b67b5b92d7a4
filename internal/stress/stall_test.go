// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// The wedge check credits a handle with the time its process stalled during the handle's
// life, and with nothing else: a stall before the start, or none at all, leaves the bound as
// it was, and a handle that ended is never wedged. Every time here is in the past, so no
// wait sleeps.
func TestStallCredit_OnlyTheProcessStallsOfTheHandlesLife(t *testing.T) {
	now := time.Now()
	start, by := now.Add(-10*time.Second), now.Add(-5*time.Second)
	never := make(chan struct{})
	tests := []struct {
		desc       string
		stalls     []stall
		ch         <-chan struct{}
		wantOK     bool
		wantCredit time.Duration
	}{
		{desc: "no stall: wedged at its bound", ch: never},
		{desc: "an outcome: never wedged", ch: closedChan(), wantOK: true},
		{desc: "a stall before the start: no credit", ch: never,
			stalls: []stall{{end: start.Add(-time.Second), d: 3 * time.Second}}},
		{desc: "stalls in its life: credited, still wedged past them", ch: never,
			stalls:     []stall{{end: start.Add(2 * time.Second), d: time.Second}, {end: now.Add(-time.Second), d: 2 * time.Second}},
			wantCredit: 3 * time.Second},
		{desc: "a stall across the start: only its part after the start", ch: never,
			stalls:     []stall{{end: start.Add(time.Second), d: 4 * time.Second}},
			wantCredit: time.Second},
		{desc: "a stall shorter than the slack: no credit", ch: never,
			stalls: []stall{{end: now.Add(-time.Second), d: stallSlack / 2}}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			m := &stallMeter{}
			for _, s := range tc.stalls {
				m.record(s.end, s.d)
			}
			ok, credit := m.waitCredited(tc.ch, start, by)
			require.Equal(t, tc.wantOK, ok)
			require.Equal(t, tc.wantCredit, credit)
		})
	}
}

// A checker that wakes from a stall before the meter does (goroutines resume in any order)
// still counts it: the time since the meter last woke, beyond its tick, is a stall in progress.
// A meter that woke just now adds nothing.
func TestStallMeter_CountsTheStallStillInProgress(t *testing.T) {
	now := time.Now()
	start := now.Add(-10 * time.Second)
	tests := []struct {
		desc    string
		lastAgo time.Duration
		want    time.Duration
	}{
		{desc: "the meter woke a tick ago: nothing in progress", lastAgo: stallTick},
		{desc: "the meter last woke 3s ago", lastAgo: 3 * time.Second, want: 3*time.Second - stallTick},
		{desc: "in progress since before the start: only its part after it", lastAgo: time.Minute, want: 10 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			m := &stallMeter{}
			m.record(now.Add(-5*time.Second), time.Second) // one stall recorded, in the handle's life
			m.last.Store(now.Add(-tc.lastAgo).UnixNano())
			require.Equal(t, time.Second+tc.want, m.sinceAt(start, now))
		})
	}
}

// The ring keeps the newest stalls: once it wrapped, since still sums only those after t.
func TestStallMeter_SinceAfterTheRingWrapped(t *testing.T) {
	m := &stallMeter{}
	t0 := time.Now().Add(-time.Hour)
	for i := range stallRing + 10 {
		m.record(t0.Add(time.Duration(i)*time.Millisecond), 10*time.Microsecond)
	}
	require.Equal(t, 5*10*time.Microsecond, m.since(t0.Add(time.Duration(stallRing+4)*time.Millisecond)))
	total, longest, _ := m.figures()
	require.Equal(t, time.Duration(stallRing+10)*10*time.Microsecond, total)
	require.Equal(t, 10*time.Microsecond, longest)
}

// A stall of the soak's own process longer than a transfer's outcome bound is a breach that
// says so (the transfers then in flight are credited with it, not called wedged); a shorter
// one, however long past the grace, is the host's and is not.
func TestStallLongerThanAnOutcomeBoundIsABreachOfItsOwn(t *testing.T) {
	cfg := Config{TransferTimeout: 3 * time.Second, QueueTimeout: 3 * time.Second, Grace: 2 * time.Second}
	bound := (&soak{cfg: cfg}).doneBound(cfg.TransferTimeout)
	tests := []struct {
		desc   string
		d      time.Duration
		breach bool
	}{
		{desc: "past the grace, within the bound", d: 5 * time.Second},
		{desc: "past the bound", d: bound + time.Second, breach: true},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			s := &soak{cfg: cfg, log: zap.NewNop()}
			m := &stallMeter{}
			stop := s.watchStalls(m)
			m.record(time.Now(), tc.d)
			stop()
			m.record(time.Now(), time.Hour) // after the watch: heard by no one
			if tc.breach {
				require.Len(t, s.breach, 1)
				require.Contains(t, s.breach[0], "this process stalled 9.1s")
			} else {
				require.Empty(t, s.breach)
			}
		})
	}
}

// A handle past its outcome bound is told apart as late (its Done closed after all, by the
// quiescence bound) or stuck (still open then), so a breach says which the engine has to
// explain. Every time here is in the past, so no wait sleeps.
func TestLateNote_TellsALateOutcomeFromAStuckOne(t *testing.T) {
	bound := time.Now().Add(-2 * time.Second)
	until := bound.Add(time.Second)
	require.Contains(t, lateNote(closedChan(), bound, until), "late, not stuck")
	require.Equal(t, "; Done still open 1s past the bound: stuck", lateNote(make(chan struct{}), bound, until))
}
