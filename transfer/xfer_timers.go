// SPDX-License-Identifier: Apache-2.0

package transfer

import "time"

// timers are a transfer's deadlines (zero: not set), all served by one runtime timer: thousands
// of idle transfers then cost the runtime one timer each, not five.
type timers struct {
	deadline   time.Time // the transfer's deadline (Timeout)
	retry      time.Time // a receiver's next request, while nothing moved
	grace      time.Time // an abort's CancelGrace, then quarantine
	quarantine time.Time // QuarantineTimeout, then poison
	poll       time.Time // a streaming Send's next look at its ready signals
	wake       *time.Timer
	armedAt    time.Time
}

// arm points the one timer at the earliest time set, if that changed.
func (t *timers) arm() {
	var next time.Time
	for _, at := range []time.Time{t.deadline, t.retry, t.grace, t.quarantine, t.poll} {
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	if next.Equal(t.armedAt) {
		return
	}
	t.armedAt = next
	switch {
	case next.IsZero():
		if t.wake != nil {
			t.wake.Stop()
		}
	case t.wake == nil:
		t.wake = time.NewTimer(time.Until(next))
	default:
		t.wake.Reset(time.Until(next)) // since Go 1.23 a Reset timer never delivers a stale tick
	}
}

// C is the channel the timer fires on, nil while nothing is set.
func (t *timers) C() <-chan time.Time {
	if t.wake == nil || t.armedAt.IsZero() {
		return nil
	}
	return t.wake.C
}

// fired notes that the timer fired: the next arm must set it again.
func (t *timers) fired() { t.armedAt = time.Time{} }

func (t *timers) stop() {
	if t.wake != nil {
		t.wake.Stop()
	}
}

// due reports whether t is set and has passed, and clears it if so.
func due(t *time.Time, now time.Time) bool {
	if t.IsZero() || now.Before(*t) {
		return false
	}
	*t = time.Time{}
	return true
}
