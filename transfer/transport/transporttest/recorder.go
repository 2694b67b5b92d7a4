// SPDX-License-Identifier: Apache-2.0

package transporttest

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// op is one posted operation and every report it got.
type op struct {
	rec     *recorder
	what    string
	tag     transport.Tag
	id      transport.OpID
	postErr error
	ok      bool // Post returned nil
	reports []transport.Completion
	final   chan struct{} // closed at the first final report
}

// done is the operation's completion callback.
func (o *op) done(c transport.Completion) { o.rec.report(o, c) }

// control is one control message received.
type control struct {
	from transport.Peer
	msg  []byte
}

// recorder is a transport's Inbound and the sink of its completions. It notes every breach
// of the callback rules as it happens; verify reports them.
type recorder struct {
	name string
	mu   sync.Mutex
	// calls says which goroutine is inside a call into either transport of the pair.
	calls    *calls
	ops      []*op
	controls []control
	lost     []transport.Peer
	breaches []string
	changed  chan struct{} // signalled (without blocking) on every report and message
}

// calls is shared by the two recorders of a pair: a callback of either transport must not run
// inside a call into either (the other engine's Inbound inside this one's SendControl, say,
// would take that engine's locks while this one holds its own).
type calls struct {
	mu sync.Mutex
	g  uint64 // the id of the goroutine inside a call, or 0
}

func (c *calls) enter(g uint64) {
	c.mu.Lock()
	c.g = g
	c.mu.Unlock()
}

func (c *calls) leave() {
	c.mu.Lock()
	c.g = 0
	c.mu.Unlock()
}

// inside reports whether the calling goroutine is inside a call into the pair.
func (c *calls) inside() bool {
	c.mu.Lock()
	g := c.g
	c.mu.Unlock()
	return g != 0 && g == goid()
}

func newRecorder(name string, c *calls) *recorder {
	return &recorder{name: name, calls: c, changed: make(chan struct{}, 1)}
}

// inside notes a breach when the callback runs on the goroutine of a call into the
// transport. Called with mu held.
func (r *recorder) insideLocked(what string) {
	if r.calls.inside() {
		r.breaches = append(r.breaches, what+" ran inside a call into a transport (a Post, Cancel or SendControl)")
	}
}

func (r *recorder) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) newOp(what string, tag transport.Tag) *op {
	o := &op{rec: r, what: what, tag: tag, final: make(chan struct{})}
	r.mu.Lock()
	r.ops = append(r.ops, o)
	r.mu.Unlock()
	return o
}

func (r *recorder) posted(o *op, err error) {
	r.mu.Lock()
	o.ok, o.postErr = err == nil, err
	r.mu.Unlock()
}

func (r *recorder) report(o *op, c transport.Completion) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.signal()
	name := fmt.Sprintf("the completion of %s %v (%v, memory %v)", o.what, o.tag, c.Err, c.Memory)
	r.insideLocked(name)
	select {
	case <-o.final:
		r.breaches = append(r.breaches, name+" came after its final report")
		return
	default:
	}
	o.reports = append(o.reports, c)
	if c.Err == nil && c.Memory != transport.MemoryDone {
		r.breaches = append(r.breaches, name+": a success must say MemoryDone")
	}
	if c.Memory != transport.MemoryBusy {
		close(o.final)
	}
}

// OnControl implements transport.Inbound.
func (r *recorder) OnControl(from transport.Peer, msg []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.signal()
	r.insideLocked(fmt.Sprintf("OnControl of a %d-byte message", len(msg)))
	r.controls = append(r.controls, control{from: from, msg: append([]byte(nil), msg...)})
}

// OnPeerLost implements transport.Inbound.
func (r *recorder) OnPeerLost(peer transport.Peer, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.signal()
	r.insideLocked("OnPeerLost")
	r.lost = append(r.lost, peer)
}

// until waits, at most d, for cond (read under mu) to hold.
func (r *recorder) until(d time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-r.changed:
		case <-deadline.C:
			r.mu.Lock()
			defer r.mu.Unlock()
			return cond()
		}
	}
}

// awaitFinal waits, at most d, for o's final report and returns it.
func (o *op) awaitFinal(t TB, d time.Duration) transport.Completion {
	t.Helper()
	select {
	case <-o.final:
	case <-time.After(d): // a bound on something that must happen
		t.Errorf("transport %s: %s %v (op %d): no final report within %v", o.rec.name, o.what, o.tag, o.id, d)
		t.FailNow()
	}
	o.rec.mu.Lock()
	defer o.rec.mu.Unlock()
	return o.reports[len(o.reports)-1]
}

// settle waits, at most d, until every operation whose Post succeeded has its final report:
// the transport was force-closed, so each must have one within its bounded time.
func (r *recorder) settle(t TB, d time.Duration) {
	t.Helper()
	if !r.until(d, func() bool {
		for _, o := range r.ops {
			if o.ok && len(o.reports) == 0 || o.ok && o.reports[len(o.reports)-1].Memory == transport.MemoryBusy {
				return false
			}
		}
		return true
	}) {
		t.Errorf("transport %s: force-closed, but not every operation had its final report within %v", r.name, d)
	}
}

// verify reports every breach of the callback rules.
func (r *recorder) verify(t TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.breaches {
		t.Errorf("transport %s: %s", r.name, b)
	}
	for _, o := range r.ops {
		finals := 0
		for _, c := range o.reports {
			if c.Memory != transport.MemoryBusy {
				finals++
			}
		}
		switch {
		case !o.ok && len(o.reports) > 0:
			t.Errorf("transport %s: %s %v: Post failed (%v) yet it reported %v", r.name, o.what, o.tag, o.postErr, o.reports)
		case o.ok && finals != 1:
			t.Errorf("transport %s: %s %v: %d final reports, want exactly one (reports %v)", r.name, o.what, o.tag, finals, o.reports)
		}
	}
}
