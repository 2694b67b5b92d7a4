// SPDX-License-Identifier: Apache-2.0

package bench

// The prefill ends' reports of a round's Sends: each end keeps what it was asked for and
// answers for all of it in one Sent once the decode end asks, after the round's clock stopped
// (scenario.go runs the round).

import (
	"context"
	"fmt"
)

// postedSend is one request the prefill end was asked for: its handle and mover, or why it
// could not be posted.
type postedSend struct {
	id  uint64
	h   pendingXfer // nil where err is set
	m   *timedMover
	err error
}

func (a postedSend) release() {
	if a.h != nil {
		a.h.Release()
	}
}

// report waits for each asked request's Send to end (or ctx's end), releases it, and reports
// them all, in the order asked.
func (p *prefillEnd) report(ctx context.Context, asked []postedSend) *sentReport {
	out := &sentReport{Sends: make([]sentMsg, 0, len(asked))}
	for _, a := range asked {
		s := sentMsg{ID: a.id}
		switch {
		case a.err != nil:
			s.Err = a.err.Error()
		default:
			select {
			case <-a.h.Done():
				s.GatherNs = a.m.gatherNs.Load()
				if err := a.h.Err(); err != nil {
					s.Err = err.Error()
				}
			case <-ctx.Done():
				s.Err = fmt.Sprintf("send %d: %v", a.id, ctx.Err())
			}
		}
		a.release()
		out.Sends = append(out.Sends, s)
	}
	return out
}

// checkSent checks prefill rank r's report of a round against the requests asked of it: each
// reported exactly once, none failed, no gather time below zero. It returns the gather time.
func checkSent(r int, asked []uint64, got []sentMsg) (int64, error) {
	if len(got) != len(asked) {
		return 0, fmt.Errorf("%w: prefill rank %d reported %d sends of the %d asked", errPeerNotKvxbench, r, len(got), len(asked))
	}
	open := make(map[uint64]bool, len(asked))
	for _, id := range asked {
		open[id] = true
	}
	seen := make(map[uint64]bool, len(got))
	var gatherNs int64
	for _, s := range got {
		switch {
		case seen[s.ID]:
			return 0, fmt.Errorf("%w: prefill rank %d reported request %d twice", errPeerNotKvxbench, r, s.ID)
		case !open[s.ID]:
			return 0, fmt.Errorf("%w: prefill rank %d reported request %d, which was not asked of it", errPeerNotKvxbench, r, s.ID)
		case s.Err != "":
			return 0, fmt.Errorf("prefill rank %d: send %d: %s", r, s.ID, s.Err)
		case s.GatherNs < 0:
			return 0, fmt.Errorf("%w: prefill rank %d said request %d gathered for %d ns", errPeerNotKvxbench, r, s.ID, s.GatherNs)
		}
		seen[s.ID] = true
		gatherNs += s.GatherNs
	}
	return gatherNs, nil
}
