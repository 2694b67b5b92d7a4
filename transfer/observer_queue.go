// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"context"
	"time"

	"github.com/kvxfer/kvxfer/transfer/internal/queue"
)

// observerQueue hands a caller's Observer its events on a goroutine of its own, in the order
// the engine made them, so no caller callback runs under a lock that Cancel, Status or a
// completion needs: a slow observer delays only itself. A handle's Done and Quiesced close
// through the same queue, so an observer has heard every move of a handle before its caller
// wakes on them (a slow observer delays those signals, never the transfers), except after a
// Cancel that answered FreeNow, which closes them at once (Handle.signalNowLocked). The queue
// holds no goroutine while it is empty.
type observerQueue struct {
	user  Observer
	q     queue.Queue[func()]
	start bool // user is a startObserver
	peers bool // user is a peerObserver
	trust bool // user is a trustObserver
}

func newObserverQueue(user Observer) *observerQueue {
	_, start := user.(startObserver)
	_, peers := user.(peerObserver)
	_, trust := user.(trustObserver)
	return &observerQueue{user: user, start: start, peers: peers, trust: trust}
}

func (o *observerQueue) push(f func()) {
	if o.q.Push(f) {
		go o.run()
	}
}

// run delivers until it finds the queue empty; the next push starts another.
func (o *observerQueue) run() {
	var batch []func()
	for {
		if batch = o.q.Take(batch); len(batch) == 0 {
			return
		}
		for i, f := range batch {
			f()
			batch[i] = nil
		}
	}
}

// wait returns once everything queued so far has been delivered, or ctx ends.
func (o *observerQueue) wait(ctx context.Context) error {
	delivered := make(chan struct{})
	o.signal(delivered)
	select {
	case <-delivered:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// signal closes ch after every event queued before it has been delivered.
func (o *observerQueue) signal(ch chan struct{}) { o.push(func() { close(ch) }) }

// OnTransition implements Observer.
func (o *observerQueue) OnTransition(id RequestID, sub int, from, to State, ev Event) {
	o.push(func() { o.user.OnTransition(id, sub, from, to, ev) })
}

// OnCancel implements Observer.
func (o *observerQueue) OnCancel(id RequestID, outcome CancelOutcome) {
	o.push(func() { o.user.OnCancel(id, outcome) })
}

// OnQuarantine implements Observer.
func (o *observerQueue) OnQuarantine(id RequestID, sub int, cause error) {
	o.push(func() { o.user.OnQuarantine(id, sub, cause) })
}

// OnPoison implements Observer.
func (o *observerQueue) OnPoison(id RequestID, slot int, reason string) {
	o.push(func() { o.user.OnPoison(id, slot, reason) })
}

// OnProgress implements Observer.
func (o *observerQueue) OnProgress(id RequestID, bytes int64, at time.Time) {
	o.push(func() { o.user.OnProgress(id, bytes, at) })
}

// OnStart implements startObserver for a user that is one.
func (o *observerQueue) OnStart(info StartInfo) {
	if o.start {
		o.push(func() { o.user.(startObserver).OnStart(info) })
	}
}

// OnPeerConnected implements peerObserver for a user that is one.
func (o *observerQueue) OnPeerConnected(peer Peer) {
	if o.peers {
		o.push(func() { o.user.(peerObserver).OnPeerConnected(peer) })
	}
}

// OnPeerLost implements peerObserver for a user that is one.
func (o *observerQueue) OnPeerLost(peer Peer, err error) {
	if o.peers {
		o.push(func() { o.user.(peerObserver).OnPeerLost(peer, err) })
	}
}

// OnHelloRefused implements trustObserver for a user that is one.
func (o *observerQueue) OnHelloRefused(peer Peer, reason string) {
	if o.trust {
		o.push(func() { o.user.(trustObserver).OnHelloRefused(peer, reason) })
	}
}

// OnAuthRefused implements trustObserver for a user that is one.
func (o *observerQueue) OnAuthRefused(err *AuthError) {
	if o.trust {
		o.push(func() { o.user.(trustObserver).OnAuthRefused(err) })
	}
}
