// SPDX-License-Identifier: Apache-2.0

// Package hopstamp records when requests pass named points of the engine and its transport
// (hops), so that kvxbench --hops can say where a short request's time goes, hop by hop, in
// both processes (docs/benchmarks.md). It is off unless a program turns it on: a Mark is then
// one atomic load. On, a Mark takes a lock and a clock read (about 100 ns), and the stamps of
// the two processes of one request join by wall clock (one host, one clock).
package hopstamp

import (
	"sync"
	"sync/atomic"
	"time"
)

// Stamp is one request passing one hop, at a wall-clock time in nanoseconds.
type Stamp struct {
	ID   uint64 `json:"id"`
	Hop  string `json:"hop"`
	Unix int64  `json:"t"`
}

// maxStamps bounds what one process records: a run of kvxbench times at most tens of
// thousands of requests, each a dozen stamps.
const maxStamps = 1 << 20

type recorder struct {
	mu     sync.Mutex
	stamps []Stamp
	last   uint64 // the request last marked by id: where MarkLast's stamps go
	lastAt int64  // when it was marked
}

// lastWindow is how long after the last stamp by id MarkLast's stamps still go to that
// request: long enough for a worker's commands and sleep after a request's last step, short
// enough that an idle worker's periodic wakes (WorkerConfig.MaxSleep, 1 ms) between requests
// are not charged to the one before.
const lastWindow = 500 * time.Microsecond

var on atomic.Pointer[recorder]

// Start turns recording on in this process, dropping what was recorded before.
func Start() { on.Store(&recorder{}) }

// Stop turns recording off and returns what was recorded.
func Stop() []Stamp {
	r := on.Swap(nil)
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stamps
}

// On reports whether recording is on: a caller that builds a hop's name checks it first.
func On() bool { return on.Load() != nil }

// Mark records that request id passed hop now, when recording is on.
func Mark(id uint64, hop string) {
	if r := on.Load(); r != nil {
		r.add(id, hop, true)
	}
}

// MarkLast records hop for the request this process marked last, if it did within lastWindow:
// for points that do not know their request (a UCX worker's wake), which is right only while
// one request runs at a time.
func MarkLast(hop string) {
	if r := on.Load(); r != nil {
		r.add(0, hop, false)
	}
}

func (r *recorder) add(id uint64, hop string, byID bool) {
	t := time.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	if byID {
		r.last, r.lastAt = id, t
	} else if id = r.last; id == 0 || t-r.lastAt > int64(lastWindow) {
		return
	}
	if len(r.stamps) < maxStamps {
		r.stamps = append(r.stamps, Stamp{ID: id, Hop: hop, Unix: t})
	}
}
