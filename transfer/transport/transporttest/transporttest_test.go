// SPDX-License-Identifier: Apache-2.0

package transporttest

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/mem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeT records what a check reports, so a test can run a check and see it fail.
type fakeT struct {
	mu       sync.Mutex
	errors   []string
	cleanups []func()
}

func (f *fakeT) Helper() {}
func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}
func (f *fakeT) FailNow()            { runtime.Goexit() }
func (f *fakeT) Logf(string, ...any) {}
func (f *fakeT) Cleanup(fn func())   { f.mu.Lock(); f.cleanups = append(f.cleanups, fn); f.mu.Unlock() }
func (f *fakeT) failures() []string  { f.mu.Lock(); defer f.mu.Unlock(); return f.errors }
func (f *fakeT) runCleanups()        { f.mu.Lock(); c := f.cleanups; f.mu.Unlock(); runLIFO(c) }
func runLIFO(fs []func()) {
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
func checkNamed(name string) func(TB, Harness) {
	for _, c := range Checks {
		if c.Name == name {
			return c.Run
		}
	}
	panic("no check " + name)
}

// runCheck runs one check against h with a fakeT and returns what it reported.
func runCheck(name string, h Harness) []string {
	f := &fakeT{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		checkNamed(name)(f, h)
	}()
	<-done
	f.runCleanups()
	return f.failures()
}

// memHarness is the in-memory transport, its control messages bounded to 4 KiB; wrap, when
// set, stands between the suite and each transport.
func memHarness(wrap func(*mem.Transport, transport.Peer) transport.Transport) Harness {
	return Harness{Wait: 2 * time.Second, Pair: func(t TB) (a, b Endpoint) {
		n := mem.NewNetwork()
		n.SetMaxControl(4096)
		ep := func(name transport.Peer) Endpoint {
			m := n.Transport(name)
			var tr transport.Transport = m
			if wrap != nil {
				tr = wrap(m, name)
			}
			return Endpoint{Transport: tr, Peer: name, Buffer: func(n int) []byte {
				b := make([]byte, n)
				m.AllowDirect(b)
				return b
			}}
		}
		return ep("a"), ep("b")
	}}
}

// Each broken transport fails the check that guards what it breaks (and passes nothing it
// should not): the suite can fail.
func TestChecksCatchBrokenTransports(t *testing.T) {
	cases := []struct {
		desc  string
		check string
		wrap  func(*mem.Transport, transport.Peer) transport.Transport
		want  string
	}{
		{"a cancel reported inside Cancel", "CancelUnmatchedReceive",
			func(m *mem.Transport, _ transport.Peer) transport.Transport {
				return &inlineCancel{Transport: m, dones: map[transport.OpID]func(transport.Completion){}}
			},
			"inside a call"},
		{"a send completed inside PostSend", "DataEveryByteOneFinalReport",
			func(m *mem.Transport, _ transport.Peer) transport.Transport { return &syncSend{Transport: m} }, "inside a call"},
		{"every report delivered twice", "DataEveryByteOneFinalReport",
			func(m *mem.Transport, _ transport.Peer) transport.Transport { return &doubleReport{Transport: m} }, "after its final report"},
		{"reports lost after a force close", "ForceCloseReportsEveryOperation",
			func(m *mem.Transport, _ transport.Peer) transport.Transport { return &silentClose{Transport: m} }, "no final report"},
		{"a control room it does not keep", "ControlRoomHonoured",
			func(m *mem.Transport, _ transport.Peer) transport.Transport { return &smallRoom{Transport: m} }, "want ErrControlTooLarge"},
		{"a control message delivered inside SendControl", "ControlMessagesArrive", inlineControlWrap(), "inside a call"},
		{"an IOV receive that leaves out a piece", "DirectIOVEveryByte",
			func(m *mem.Transport, _ transport.Peer) transport.Transport { return &shortIOV{Transport: m} }, "IOV receive reported"},
		{"a get from the wrong address", "RMAGetEveryByte",
			func(m *mem.Transport, _ transport.Peer) transport.Transport { return &skewedGet{Transport: m} }, "other bytes"},
		{"a success that keeps the memory", "DataEveryByteOneFinalReport",
			func(m *mem.Transport, _ transport.Peer) transport.Transport { return &busySuccess{Transport: m} }, "MemoryDone"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			require.Empty(t, runCheck(c.check, memHarness(nil)), "the unbroken transport passes")
			got := runCheck(c.check, memHarness(c.wrap))
			require.NotEmpty(t, got, "the check missed it")
			require.Contains(t, fmt.Sprint(got), c.want)
		})
	}
}

// inlineCancel reports a cancel (MemoryBusy) from inside Cancel.
type inlineCancel struct {
	*mem.Transport
	mu    sync.Mutex
	dones map[transport.OpID]func(transport.Completion)
}

func (w *inlineCancel) PostRecv(from transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	id, err := w.Transport.PostRecv(from, tag, buf, done)
	w.mu.Lock()
	w.dones[id] = done
	w.mu.Unlock()
	return id, err
}

func (w *inlineCancel) Cancel(id transport.OpID) {
	w.mu.Lock()
	done := w.dones[id]
	delete(w.dones, id)
	w.mu.Unlock()
	if done != nil {
		done(transport.Completion{Err: transport.ErrCancelled, Memory: transport.MemoryBusy})
	}
	w.Transport.Cancel(id)
}

// syncSend waits (bounded) for a send's completion and reports it before PostSend returns.
type syncSend struct{ *mem.Transport }

func (w *syncSend) PostSend(to transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	ch := make(chan transport.Completion, 4)
	id, err := w.Transport.PostSend(to, tag, buf, func(c transport.Completion) { ch <- c })
	if err != nil {
		return id, err
	}
	select {
	case c := <-ch:
		done(c)
	case <-time.After(200 * time.Millisecond): // the receive was not posted: report later
		go func() { done(<-ch) }()
	}
	return id, nil
}

// doubleReport delivers every report twice.
type doubleReport struct{ *mem.Transport }

func twice(done func(transport.Completion)) func(transport.Completion) {
	return func(c transport.Completion) { done(c); done(c) }
}

func (w *doubleReport) PostSend(to transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return w.Transport.PostSend(to, tag, buf, twice(done))
}

func (w *doubleReport) PostRecv(from transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return w.Transport.PostRecv(from, tag, buf, twice(done))
}

// silentClose drops every report that comes after Close.
type silentClose struct {
	*mem.Transport
	mu     sync.Mutex
	closed bool
}

func (w *silentClose) gate(done func(transport.Completion)) func(transport.Completion) {
	return func(c transport.Completion) {
		w.mu.Lock()
		closed := w.closed
		w.mu.Unlock()
		if !closed {
			done(c)
		}
	}
}

func (w *silentClose) PostSend(to transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return w.Transport.PostSend(to, tag, buf, w.gate(done))
}

func (w *silentClose) PostRecv(from transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return w.Transport.PostRecv(from, tag, buf, w.gate(done))
}

func (w *silentClose) Close(force bool) error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	return w.Transport.Close(force)
}

// smallRoom claims a bound it does not enforce.
type smallRoom struct{ *mem.Transport }

func (w *smallRoom) ControlRoom() int { return 256 }

// busySuccess reports a successful receive with MemoryBusy, then MemoryDone.
type busySuccess struct{ *mem.Transport }

func (w *busySuccess) PostRecv(from transport.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	return w.Transport.PostRecv(from, tag, buf, func(c transport.Completion) {
		if c.Err == nil {
			busy := c
			busy.Memory = transport.MemoryBusy
			done(busy)
		}
		done(c)
	})
}

// inlineControl hands a control message to the peer's Inbound inside SendControl, as a naive
// in-process transport would.
type inlineControl struct {
	*mem.Transport
	self  transport.Peer
	peers *sync.Map // peer name -> its Inbound
}

// inlineControlWrap returns a wrap whose transports find each other's Inbound.
func inlineControlWrap() func(*mem.Transport, transport.Peer) transport.Transport {
	peers := &sync.Map{}
	return func(m *mem.Transport, self transport.Peer) transport.Transport {
		return &inlineControl{Transport: m, self: self, peers: peers}
	}
}

func (w *inlineControl) Bind(in transport.Inbound) error {
	w.peers.Store(w.self, in)
	return w.Transport.Bind(in)
}

func (w *inlineControl) SendControl(to transport.Peer, msg []byte) error {
	if in, ok := w.peers.Load(to); ok {
		in.(transport.Inbound).OnControl(w.self, msg)
		return nil
	}
	return w.Transport.SendControl(to, msg)
}

// shortIOV receives into all but the last piece of an IOV.
type shortIOV struct{ *mem.Transport }

func (w *shortIOV) PostRecvIOV(from transport.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	return w.Transport.PostRecvIOV(from, tag, iov[:len(iov)-1], done)
}

// skewedGet reads one byte past where it was asked to.
type skewedGet struct{ *mem.Transport }

func (w *skewedGet) PostGet(from transport.Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (transport.OpID, error) {
	return w.Transport.PostGet(from, tag, key, addr-1, dst, done)
}
