// SPDX-License-Identifier: Apache-2.0

package transporttest

import (
	"bytes"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// TB is what a check needs of its test: *testing.T has it, and so does the recorder this
// package's own tests run the checks against, to see them fail on a broken transport.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	FailNow()
	Logf(format string, args ...any)
	Cleanup(func())
}

// Endpoint is one transport of a pair under test, not yet bound.
type Endpoint struct {
	Transport transport.Transport
	// Peer is how the other transport of the pair names this one.
	Peer transport.Peer
	// Buffer returns n bytes this transport may read and write in place of a caller's
	// buffer, distinct from every other buffer it returned (UCX: a part of its staging
	// memory; the in-memory transport: any Go slice).
	Buffer func(n int) []byte
}

// Harness makes what a check runs on.
type Harness struct {
	// Pair returns two fresh transports that can reach each other. The check binds them,
	// and closes them (forcibly) before it ends.
	Pair func(t TB) (a, b Endpoint)
	// Wait bounds each wait for something that must happen: a completion, a control
	// message. Default 10s.
	Wait time.Duration
}

// Check is one property of the Transport contract.
type Check struct {
	Name string
	Run  func(t TB, h Harness)
}

// Checks are the properties every transport must have: see each one's function.
var Checks = []Check{
	{"ControlMessagesArrive", checkControlMessagesArrive},
	{"DataEveryByteOneFinalReport", checkDataEveryByte},
	{"CancelUnmatchedReceive", checkCancelUnmatchedReceive},
	{"CancelAfterTheEndDoesNothing", checkCancelAfterTheEnd},
	{"ForceCloseReportsEveryOperation", checkForceClose},
	{"ControlRoomHonoured", checkControlRoom},
	{"DirectIOVEveryByte", checkDirectIOV},
	{"RMAGetEveryByte", checkRMAGet},
}

// Run runs every check against h, each as a subtest.
func Run(t *testing.T, h Harness) {
	for _, c := range Checks {
		t.Run(c.Name, func(t *testing.T) { c.Run(t, h) })
	}
}

func (h Harness) wait() time.Duration {
	if h.Wait > 0 {
		return h.Wait
	}
	return 10 * time.Second
}

// side is one bound transport of a pair with what it reported.
type side struct {
	Endpoint
	rec  *recorder
	name string
}

// pair binds a fresh pair. Both are closed when the check ends, whatever happened.
func (h Harness) pair(t TB) (a, b *side) {
	t.Helper()
	ea, eb := h.Pair(t)
	c := &calls{}
	a = &side{Endpoint: ea, name: "a", rec: newRecorder("a", c)}
	b = &side{Endpoint: eb, name: "b", rec: newRecorder("b", c)}
	for _, s := range []*side{a, b} {
		if err := s.Transport.Bind(s.rec); err != nil {
			t.Errorf("transport %s: Bind: %v", s.name, err)
			t.FailNow()
		}
	}
	t.Cleanup(func() {
		_ = a.Transport.Close(true)
		_ = b.Transport.Close(true)
	})
	return a, b
}

// finish force-closes both transports (the contract's point after which every posted
// operation has its final report and no callback comes any more) and checks every report
// the pair made.
func finish(t TB, h Harness, sides ...*side) {
	t.Helper()
	for _, s := range sides {
		if err := s.Transport.Close(true); err != nil {
			t.Errorf("transport %s: Close(true): %v", s.name, err)
		}
	}
	for _, s := range sides {
		s.rec.settle(t, h.wait())
		s.rec.verify(t)
	}
}

// call runs f as a call into s's transport: a callback of either transport of the pair that
// runs on this goroutine meanwhile ran inside the call, which the contract forbids.
func (s *side) call(f func()) {
	s.rec.calls.enter(goid())
	defer s.rec.calls.leave()
	f()
}

// postRecv posts a receive on s and tracks it.
func (s *side) postRecv(t TB, from transport.Peer, tag transport.Tag, buf []byte) *op {
	t.Helper()
	o := s.rec.newOp("receive", tag)
	var err error
	s.call(func() { o.id, err = s.Transport.PostRecv(from, tag, buf, o.done) })
	s.rec.posted(o, err)
	if err != nil {
		t.Errorf("transport %s: PostRecv(%v): %v", s.name, tag, err)
		t.FailNow()
	}
	return o
}

// postSend posts a send on s and tracks it.
func (s *side) postSend(t TB, to transport.Peer, tag transport.Tag, buf []byte) *op {
	t.Helper()
	o := s.rec.newOp("send", tag)
	var err error
	s.call(func() { o.id, err = s.Transport.PostSend(to, tag, buf, o.done) })
	s.rec.posted(o, err)
	if err != nil {
		t.Errorf("transport %s: PostSend(%v): %v", s.name, tag, err)
		t.FailNow()
	}
	return o
}

func (s *side) cancel(id transport.OpID) { s.call(func() { s.Transport.Cancel(id) }) }

func (s *side) sendControl(to transport.Peer, msg []byte) (err error) {
	s.call(func() { err = s.Transport.SendControl(to, msg) })
	return err
}

// goid is the calling goroutine's id, read from its stack header ("goroutine 7 [...").
func goid() uint64 {
	var b [64]byte
	n := runtime.Stack(b[:], false)
	f := bytes.Fields(b[:n])
	if len(f) < 2 {
		return 0
	}
	id, _ := strconv.ParseUint(string(f[1]), 10, 64)
	return id
}

// pattern fills b with bytes that depend on seed.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
}
