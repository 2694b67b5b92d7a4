// SPDX-License-Identifier: Apache-2.0

package transporttest

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// checkControlMessagesArrive: a control message arrives once, from the sender's name, with
// the bytes it had when SendControl returned (the transport copies it), and OnControl does
// not run inside SendControl.
func checkControlMessagesArrive(t TB, h Harness) {
	a, b := h.pair(t)
	msg := []byte("kvx control message")
	if err := a.sendControl(b.Peer, msg); err != nil {
		t.Errorf("SendControl: %v", err)
		t.FailNow()
	}
	want := string(msg)
	copy(msg, "XXXXXXXXXXXXXXXXXXX") // the transport copied msg before SendControl returned
	if !b.rec.until(h.wait(), func() bool { return len(b.rec.controls) > 0 }) {
		t.Errorf("transport b: no control message within %v", h.wait())
		t.FailNow()
	}
	finish(t, h, a, b)
	if n := len(b.rec.controls); n != 1 {
		t.Errorf("transport b: %d control messages, want 1", n)
	}
	if c := b.rec.controls[0]; c.from != a.Peer || string(c.msg) != want {
		t.Errorf("transport b: control message %q from %q, want %q from %q", c.msg, c.from, want, a.Peer)
	}
}

// checkDataEveryByte: a send and its receive (the receive posted first, then the send
// first) each report exactly once, finally, with MemoryDone and the size, every byte lands,
// and no completion runs inside the Post that caused it.
func checkDataEveryByte(t TB, h Harness) {
	a, b := h.pair(t)
	for i, n := range []int{1, 4096, 1 << 20} {
		for _, recvFirst := range []bool{true, false} {
			tag := transport.Tag{Request: transport.RequestID(100 + i), Seq: 1, Nonce: 7}
			if !recvFirst {
				tag.Seq = 2
			}
			src, dst := a.Buffer(n), b.Buffer(n)
			pattern(src, byte(n))
			pattern(dst, 0xAA)
			var s, r *op
			if recvFirst {
				r = b.postRecv(t, a.Peer, tag, dst)
				s = a.postSend(t, b.Peer, tag, src)
			} else {
				s = a.postSend(t, b.Peer, tag, src)
				r = b.postRecv(t, a.Peer, tag, dst)
			}
			what := fmt.Sprintf("%d bytes, receive posted first: %v", n, recvFirst)
			for _, o := range []*op{s, r} {
				c := o.awaitFinal(t, h.wait())
				if c.Err != nil || c.Memory != transport.MemoryDone || c.Bytes != n {
					t.Errorf("%s: %s reported %v, memory %v, %d bytes; want success, MemoryDone, %d bytes", what, o.what, c.Err, c.Memory, c.Bytes, n)
				}
			}
			if !bytes.Equal(src, dst) {
				t.Errorf("%s: the received bytes differ from the sent ones", what)
			}
		}
	}
	finish(t, h, a, b)
}

// checkCancelUnmatchedReceive: a receive nothing matches, cancelled, reports once, finally,
// with ErrCancelled and MemoryDone, without running inside Cancel, and its buffer is
// untouched; a second Cancel, and a Cancel of an id never given out, do nothing.
func checkCancelUnmatchedReceive(t TB, h Harness) {
	a, b := h.pair(t)
	buf := b.Buffer(4096)
	pattern(buf, 0x5A)
	want := append([]byte(nil), buf...)
	r := b.postRecv(t, a.Peer, transport.Tag{Request: 200, Seq: 1}, buf)
	b.cancel(r.id)
	c := r.awaitFinal(t, h.wait())
	if !errors.Is(c.Err, transport.ErrCancelled) || c.Memory != transport.MemoryDone {
		t.Errorf("a cancelled unmatched receive reported %v, memory %v; want ErrCancelled, MemoryDone", c.Err, c.Memory)
	}
	b.cancel(r.id)
	b.cancel(r.id + 1<<32)
	if !bytes.Equal(buf, want) {
		t.Errorf("a cancelled receive's buffer changed")
	}
	finish(t, h, a, b)
}

// checkCancelAfterTheEnd: cancelling operations that already had their final report does
// nothing: no further report.
func checkCancelAfterTheEnd(t TB, h Harness) {
	a, b := h.pair(t)
	tag := transport.Tag{Request: 300, Seq: 1}
	src, dst := a.Buffer(512), b.Buffer(512)
	r := b.postRecv(t, a.Peer, tag, dst)
	s := a.postSend(t, b.Peer, tag, src)
	r.awaitFinal(t, h.wait())
	s.awaitFinal(t, h.wait())
	b.cancel(r.id)
	a.cancel(s.id)
	finish(t, h, a, b)
}

// checkForceClose: Close(true) gives every outstanding operation its final report
// (MemoryDone or MemoryUnknown) within its bounded time, and afterwards every method returns
// ErrClosed, with no callback for the refused posts.
func checkForceClose(t TB, h Harness) {
	a, b := h.pair(t)
	var ops []*op
	for i := range 4 {
		ops = append(ops, b.postRecv(t, a.Peer, transport.Tag{Request: 400, Seq: uint32(i)}, b.Buffer(4096)))
	}
	ops = append(ops, b.postSend(t, a.Peer, transport.Tag{Request: 401}, b.Buffer(4096)))
	late := [][]byte{b.Buffer(64), b.Buffer(64)} // for the posts after Close
	if err := b.Transport.Close(true); err != nil {
		t.Errorf("Close(true): %v", err)
	}
	for _, o := range ops {
		c := o.awaitFinal(t, h.wait())
		if c.Memory != transport.MemoryDone && c.Memory != transport.MemoryUnknown {
			t.Errorf("%s %v after a force close: memory %v", o.what, o.tag, c.Memory)
		}
	}
	refused := []struct {
		what string
		post func(done func(transport.Completion)) (transport.OpID, error)
	}{
		{"PostRecv", func(d func(transport.Completion)) (transport.OpID, error) {
			return b.Transport.PostRecv(a.Peer, transport.Tag{Request: 402}, late[0], d)
		}},
		{"PostSend", func(d func(transport.Completion)) (transport.OpID, error) {
			return b.Transport.PostSend(a.Peer, transport.Tag{Request: 403}, late[1], d)
		}},
	}
	for _, p := range refused {
		o := b.rec.newOp(p.what+" after Close", transport.Tag{})
		var err error
		b.call(func() { o.id, err = p.post(o.done) })
		b.rec.posted(o, err)
		if !errors.Is(err, transport.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", p.what, err)
		}
	}
	if err := b.sendControl(a.Peer, []byte("after close")); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("SendControl after Close: %v, want ErrClosed", err)
	}
	finish(t, h, a, b)
}

// checkControlRoom: a transport that bounds its control messages (ControlBound) delivers a
// message of ControlRoom bytes and refuses one byte more with a *ControlSizeError matching
// ErrControlTooLarge, sending nothing. A transport without the bound, or with one over 1 MiB,
// is not tried.
func checkControlRoom(t TB, h Harness) {
	a, b := h.pair(t)
	cb, ok := a.Transport.(transport.ControlBound)
	if !ok {
		t.Logf("the transport does not bound its control messages")
		finish(t, h, a, b)
		return
	}
	room := cb.ControlRoom()
	if room <= 0 {
		t.Errorf("ControlRoom() = %d: a transport takes some control message", room)
		t.FailNow()
	}
	if room > 1<<20 {
		t.Logf("ControlRoom() = %d: too large a message to try; bound it in the harness to check it", room)
		finish(t, h, a, b)
		return
	}
	fits := make([]byte, room)
	pattern(fits, 3)
	if err := a.sendControl(b.Peer, fits); err != nil {
		t.Errorf("a control message of ControlRoom() = %d bytes: %v", room, err)
	}
	err := a.sendControl(b.Peer, make([]byte, room+1))
	var se *transport.ControlSizeError
	switch {
	case !errors.Is(err, transport.ErrControlTooLarge):
		t.Errorf("a control message of ControlRoom()+1 = %d bytes: %v, want ErrControlTooLarge", room+1, err)
	case !errors.As(err, &se) || se.Bytes != room+1 || se.Room != room:
		t.Errorf("a control message of %d bytes: %v, want a *ControlSizeError naming %d bytes and room %d", room+1, err, room+1, room)
	}
	// Messages from one sender arrive in order: once the marker sent after the refused
	// message is in, that one would be too had it gone.
	marker := []byte("marker")
	if err := a.sendControl(b.Peer, marker); err != nil {
		t.Errorf("SendControl: %v", err)
		t.FailNow()
	}
	if !b.rec.until(h.wait(), func() bool {
		for _, c := range b.rec.controls {
			if bytes.Equal(c.msg, marker) {
				return true
			}
		}
		return false
	}) {
		t.Errorf("the marker message did not arrive within %v", h.wait())
	}
	finish(t, h, a, b)
	got := 0
	for _, c := range b.rec.controls {
		switch {
		case len(c.msg) == room+1:
			t.Errorf("the refused control message of %d bytes arrived", room+1)
		case bytes.Equal(c.msg, fits):
			got++
		}
	}
	if got != 1 {
		t.Errorf("the control message of ControlRoom() bytes arrived %d times, want once", got)
	}
}

// checkDirectIOV: a transport with the one-copy path (DirectTransport) moves an IOV send into
// an IOV receive cut differently, every byte, each operation reporting once, finally, with
// MemoryDone and the total size. Buffers Direct refuses (a harness that gives none it
// accepts) are not tried.
func checkDirectIOV(t TB, h Harness) {
	a, b := h.pair(t)
	da, okA := a.Transport.(transport.DirectTransport)
	db, okB := b.Transport.(transport.DirectTransport)
	const n = 3*4096 + 100
	src, dst := a.Buffer(n), b.Buffer(n)
	if !okA || !okB || !da.Direct(src) || !db.Direct(dst) {
		t.Logf("the transport has no direct path for the harness's buffers")
		finish(t, h, a, b)
		return
	}
	pattern(src, 0x3C)
	pattern(dst, 0)
	tag := transport.Tag{Request: 500, Seq: 1, Nonce: 9}
	r := b.rec.newOp("IOV receive", tag)
	var err error
	b.call(func() {
		r.id, err = db.PostRecvIOV(a.Peer, tag, [][]byte{dst[:100], dst[100:5000], dst[5000:]}, r.done)
	})
	b.rec.posted(r, err)
	if err != nil {
		t.Errorf("PostRecvIOV: %v", err)
		t.FailNow()
	}
	s := a.rec.newOp("IOV send", tag)
	a.call(func() {
		s.id, err = da.PostSendIOV(b.Peer, tag, [][]byte{src[:4096], src[4096 : 2*4096], src[2*4096:]}, s.done)
	})
	a.rec.posted(s, err)
	if err != nil {
		t.Errorf("PostSendIOV: %v", err)
		t.FailNow()
	}
	for _, o := range []*op{s, r} {
		c := o.awaitFinal(t, h.wait())
		if c.Err != nil || c.Memory != transport.MemoryDone || c.Bytes != n {
			t.Errorf("%s reported %v, memory %v, %d bytes; want success, MemoryDone, %d bytes", o.what, c.Err, c.Memory, c.Bytes, n)
		}
	}
	if !bytes.Equal(src, dst) {
		t.Errorf("the IOV receive holds other bytes than the IOV send's")
	}
	finish(t, h, a, b)
}

// checkRMAGet: a transport with RMA gets (RMATransport) reads a range of the peer's pool, named
// by the peer's RMAKey, into a local buffer: every byte, one final report with MemoryDone.
// Buffers Direct refuses are not tried. A transport that says it serves no RMA
// (internal/transportimpl.RMAServing) refuses both calls at once, with an error and no report.
func checkRMAGet(t TB, h Harness) {
	a, b := h.pair(t)
	ra, okA := a.Transport.(transport.RMATransport)
	rb, okB := b.Transport.(transport.RMATransport)
	const n, off = 8192, 512
	pool, dst := a.Buffer(n), b.Buffer(n-off)
	if s, ok := a.Transport.(transportimpl.RMAServing); ok && !s.ServesRMA() && okB && rb.Direct(dst) {
		if _, _, err := ra.RMAKey(pool); err == nil {
			t.Errorf("RMAKey succeeded on a transport that serves no RMA")
		}
		tag := transport.Tag{Request: 600, Seq: 1}
		g := b.rec.newOp("get", tag)
		var err error
		b.call(func() { g.id, err = rb.PostGet(a.Peer, tag, nil, 0, dst, g.done) })
		b.rec.posted(g, err)
		if s, ok := rb.(transportimpl.RMAServing); ok && !s.ServesRMA() && err == nil {
			t.Errorf("PostGet succeeded on a transport that serves no RMA")
		}
		finish(t, h, a, b)
		return
	}
	if !okA || !okB || !ra.Direct(pool) || !rb.Direct(dst) {
		t.Logf("the transport has no RMA gets for the harness's buffers")
		finish(t, h, a, b)
		return
	}
	pattern(pool, 0x71)
	addr, key, err := ra.RMAKey(pool)
	if err != nil {
		t.Errorf("RMAKey: %v", err)
		t.FailNow()
	}
	tag := transport.Tag{Request: 600, Seq: 1}
	g := b.rec.newOp("get", tag)
	b.call(func() { g.id, err = rb.PostGet(a.Peer, tag, key, addr+off, dst, g.done) })
	b.rec.posted(g, err)
	if err != nil {
		t.Errorf("PostGet: %v", err)
		t.FailNow()
	}
	c := g.awaitFinal(t, h.wait())
	if c.Err != nil || c.Memory != transport.MemoryDone {
		t.Errorf("the get reported %v, memory %v; want success, MemoryDone", c.Err, c.Memory)
	}
	if !bytes.Equal(pool[off:], dst) {
		t.Errorf("the get read other bytes than the peer's pool holds")
	}
	finish(t, h, a, b)
}
