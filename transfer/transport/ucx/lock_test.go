// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// TestUCXTransport_ConnectHoldsNoLock: making an endpoint is a round trip to the worker (up to
// CloseTimeout when it is busy). While one is under way, the transport's other work goes on:
// a control message to a peer already reached, a post to it, its completion, and a Cancel.
func TestUCXTransport_ConnectHoldsNoLock(t *testing.T) {
	a, b, ra, _ := newUCXPair(t, "posix,cma,self", "")
	require.NoError(t, a.SendControl(b.Self(), []byte("reach b first")))
	c, err := newTransport(Config{TLS: "posix,cma,self", StagingBytes: 1 << 20, CloseTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close(true)) }()
	require.NoError(t, c.Bind(nopInbound{}))

	inConnect, letGo := make(chan struct{}), make(chan struct{})
	a.mu.Lock()
	a.beforeConnect = func() { close(inConnect); <-letGo }
	a.mu.Unlock()
	connected := make(chan error, 1)
	go func() { connected <- a.SendControl(c.Self(), []byte("to a new peer")) }()
	<-inConnect

	others := make(chan error, 1)
	go func() {
		if err := a.SendControl(b.Self(), []byte("to b, meanwhile")); err != nil {
			others <- err
			return
		}
		id, err := post(t, ra, func(d func(transport.Completion)) (transport.OpID, error) {
			return a.PostRecv(b.Self(), transport.Tag{Request: 77}, a.StagingMemory()[:64], d)
		})
		if err == nil {
			a.Cancel(id)
		}
		others <- err
	}()
	select {
	case err := <-others:
		require.NoError(t, err)
	case <-time.After(10 * time.Second): // a bound on something that must happen
		close(letGo)
		t.Fatal("the transport's lock was held across a connect")
	}
	require.Eventually(t, func() bool { ra.mu.Lock(); defer ra.mu.Unlock(); return len(ra.reports) > 0 },
		5*time.Second, time.Millisecond, "the cancelled receive completed while the connect was under way")
	close(letGo)
	require.NoError(t, <-connected)
}
