// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"time"

	"github.com/kvxfer/kvxfer/transfer"
)

// multi fans every event out to several observers, in order.
type multi []transfer.Observer

// The optional methods of a transfer.Observer (its documentation lists them), each group as
// this package's observers implement it and Multi looks for it.
type (
	startObserver interface{ OnStart(info transfer.StartInfo) }
	peerObserver  interface {
		OnPeerConnected(peer transfer.Peer)
		OnPeerLost(peer transfer.Peer, err error)
	}
	trustObserver interface {
		OnHelloRefused(peer transfer.Peer, reason string)
		OnAuthRefused(err *transfer.AuthError)
	}
)

var (
	_ startObserver = multi(nil)
	_ peerObserver  = multi(nil)
	_ trustObserver = multi(nil)
)

// Multi returns an Observer that passes every event to each of obs, in the order given (nil
// entries are skipped). The optional events (OnStart, OnPeerConnected, OnPeerLost, OnHelloRefused,
// OnAuthRefused: transfer.Observer lists them) reach those of obs
// that implement them, so Multi(metrics, logs) loses nothing that either would hear alone.
// Config.Observer takes one observer; this is how it takes several.
func Multi(obs ...transfer.Observer) transfer.Observer {
	m := make(multi, 0, len(obs))
	for _, o := range obs {
		if o != nil {
			m = append(m, o)
		}
	}
	return m
}

// OnStart implements transfer.Observer's optional method.
func (m multi) OnStart(info transfer.StartInfo) {
	for _, o := range m {
		if s, ok := o.(startObserver); ok {
			s.OnStart(info)
		}
	}
}

// OnTransition implements transfer.Observer.
func (m multi) OnTransition(id transfer.RequestID, sub int, from, to transfer.State, ev transfer.Event) {
	for _, o := range m {
		o.OnTransition(id, sub, from, to, ev)
	}
}

// OnCancel implements transfer.Observer.
func (m multi) OnCancel(id transfer.RequestID, outcome transfer.CancelOutcome) {
	for _, o := range m {
		o.OnCancel(id, outcome)
	}
}

// OnQuarantine implements transfer.Observer.
func (m multi) OnQuarantine(id transfer.RequestID, sub int, cause error) {
	for _, o := range m {
		o.OnQuarantine(id, sub, cause)
	}
}

// OnPoison implements transfer.Observer.
func (m multi) OnPoison(id transfer.RequestID, slot int, reason string) {
	for _, o := range m {
		o.OnPoison(id, slot, reason)
	}
}

// OnProgress implements transfer.Observer.
func (m multi) OnProgress(id transfer.RequestID, bytes int64, at time.Time) {
	for _, o := range m {
		o.OnProgress(id, bytes, at)
	}
}

// OnPeerConnected implements transfer.Observer's optional method.
func (m multi) OnPeerConnected(peer transfer.Peer) {
	for _, o := range m {
		if p, ok := o.(peerObserver); ok {
			p.OnPeerConnected(peer)
		}
	}
}

// OnPeerLost implements transfer.Observer's optional method.
func (m multi) OnPeerLost(peer transfer.Peer, err error) {
	for _, o := range m {
		if p, ok := o.(peerObserver); ok {
			p.OnPeerLost(peer, err)
		}
	}
}

// OnHelloRefused implements transfer.Observer's optional method.
func (m multi) OnHelloRefused(peer transfer.Peer, reason string) {
	for _, o := range m {
		if p, ok := o.(trustObserver); ok {
			p.OnHelloRefused(peer, reason)
		}
	}
}

// OnAuthRefused implements transfer.Observer's optional method.
func (m multi) OnAuthRefused(err *transfer.AuthError) {
	for _, o := range m {
		if p, ok := o.(trustObserver); ok {
			p.OnAuthRefused(err)
		}
	}
}
