// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"time"

	"github.com/kvxfer/kvxfer/transfer"
)

// multi fans every event out to several observers, in order.
type multi []transfer.Observer

var (
	_ transfer.StartObserver = multi(nil)
	_ transfer.PeerObserver  = multi(nil)
	_ transfer.TrustObserver = multi(nil)
)

// Multi returns an Observer that passes every event to each of obs, in the order given (nil
// entries are skipped). The optional StartObserver, PeerObserver and TrustObserver events reach those of obs
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

// OnStart implements transfer.StartObserver.
func (m multi) OnStart(info transfer.StartInfo) {
	for _, o := range m {
		if s, ok := o.(transfer.StartObserver); ok {
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

// OnPeerConnected implements transfer.PeerObserver.
func (m multi) OnPeerConnected(peer transfer.Peer) {
	for _, o := range m {
		if p, ok := o.(transfer.PeerObserver); ok {
			p.OnPeerConnected(peer)
		}
	}
}

// OnPeerLost implements transfer.PeerObserver.
func (m multi) OnPeerLost(peer transfer.Peer, err error) {
	for _, o := range m {
		if p, ok := o.(transfer.PeerObserver); ok {
			p.OnPeerLost(peer, err)
		}
	}
}

// OnHelloRefused implements transfer.TrustObserver.
func (m multi) OnHelloRefused(peer transfer.Peer, reason transfer.HelloRefusal) {
	for _, o := range m {
		if p, ok := o.(transfer.TrustObserver); ok {
			p.OnHelloRefused(peer, reason)
		}
	}
}

// OnAuthRefused implements transfer.TrustObserver.
func (m multi) OnAuthRefused(err *transfer.AuthError) {
	for _, o := range m {
		if p, ok := o.(transfer.TrustObserver); ok {
			p.OnAuthRefused(err)
		}
	}
}
