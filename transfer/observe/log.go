// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/transfer"
)

// logObserver is NewLogObserver's observer.
type logObserver struct {
	log *zap.Logger

	mu   sync.Mutex
	live map[transfer.RequestID]transfer.StartInfo // until the request is terminal; bounded
}

var (
	_ transfer.Observer = (*logObserver)(nil)
	_ startObserver     = (*logObserver)(nil)
	_ peerObserver      = (*logObserver)(nil)
	_ trustObserver     = (*logObserver)(nil)
)

// NewLogObserver returns an observer that logs the engine's lifecycle through an injected
// *zap.Logger, with the request id on every line:
//
//	debug  request accepted (direction, peers, bytes), every state transition of a request
//	       and of its sub-transfers (from, to, event), cancel outcomes, peer connects
//	warn   quarantine (with the cause), slot poison (with the reason), peer lost (with the
//	       error)
//
// Chunk progress is not logged: at thousands of chunks a second it would drown everything
// else, and the metrics count it. The engine itself logs a few events with the peer's name
// (its quarantine warning, for one); this observer adds the rest, so a request's whole life
// can be followed by filtering on its id. Quarantine and poison lines also name the peer and
// the request's size, remembered from its start: the first things an operator asks.
//
// It writes to log (zap.NewNop() if nil). Give it a named logger (log.Named("kvxfer")) to
// tell its lines apart. Use one per engine: it remembers
// requests by id, and two engines of one process may both serve a request id.
//
// Besides transfer.Observer's methods it has all its optional ones (OnStart, OnPeerConnected,
// OnPeerLost, OnHelloRefused, OnAuthRefused), which Multi and the engine find by type assertion.
func NewLogObserver(log *zap.Logger) transfer.Observer {
	if log == nil {
		log = zap.NewNop()
	}
	return &logObserver{log: log, live: make(map[transfer.RequestID]transfer.StartInfo)}
}

// remember keeps info for the quarantine and poison lines, up to defaultMaxTracked requests.
func (l *logObserver) remember(info transfer.StartInfo) {
	l.mu.Lock()
	if len(l.live) < defaultMaxTracked {
		l.live[info.ID] = info
	}
	l.mu.Unlock()
}

// requestFields returns the request id and, when its start was seen, the peer of sub (all
// peers when sub is unknown) and the request's size.
func (l *logObserver) requestFields(id transfer.RequestID, sub int) []zap.Field {
	fields := []zap.Field{requestField(id)}
	l.mu.Lock()
	info, ok := l.live[id]
	l.mu.Unlock()
	if !ok {
		return fields
	}
	if sub >= 0 && sub < len(info.Peers) {
		fields = append(fields, zap.String("peer", info.Peers[sub].Short()))
	} else {
		fields = append(fields, zap.Strings("peers", peerStrings(info.Peers)))
	}
	return append(fields, zap.String("direction", direction(info)), zap.Int64("bytes", info.Bytes))
}

func peerStrings(peers []transfer.Peer) []string {
	out := make([]string, len(peers))
	for i, p := range peers {
		out[i] = p.Short()
	}
	return out
}

func requestField(id transfer.RequestID) zap.Field { return zap.Uint64("request", uint64(id)) }

// OnStart implements transfer.Observer's optional method.
func (l *logObserver) OnStart(info transfer.StartInfo) {
	l.remember(info)
	if ce := l.log.Check(zap.DebugLevel, "transfer accepted"); ce != nil {
		ce.Write(requestField(info.ID), zap.String("direction", direction(info)),
			zap.Strings("peers", peerStrings(info.Peers)), zap.Int64("bytes", info.Bytes))
	}
}

// OnTransition implements transfer.Observer. sub is -1 for the request as a whole.
func (l *logObserver) OnTransition(id transfer.RequestID, sub int, from, to transfer.State, ev transfer.Event) {
	if sub == -1 && to.Terminal() { // after quarantine and poison, which come before it
		l.mu.Lock()
		delete(l.live, id)
		l.mu.Unlock()
	}
	if ce := l.log.Check(zap.DebugLevel, "transfer state"); ce != nil {
		ce.Write(requestField(id), zap.Int("sub", sub), zap.Stringer("from", from), zap.Stringer("to", to),
			zap.Stringer("event", ev))
	}
}

// OnCancel implements transfer.Observer.
func (l *logObserver) OnCancel(id transfer.RequestID, outcome transfer.CancelOutcome) {
	if ce := l.log.Check(zap.DebugLevel, "transfer cancel"); ce != nil {
		ce.Write(requestField(id), zap.Stringer("outcome", outcome), zap.Bool("free_now", outcome.FreeNow()))
	}
}

// OnQuarantine implements transfer.Observer.
func (l *logObserver) OnQuarantine(id transfer.RequestID, sub int, cause error) {
	l.log.Warn("transfer quarantined: memory pinned until the transport lets go",
		append(l.requestFields(id, sub), zap.Int("sub", sub), zap.NamedError("reason", cause))...)
}

// OnPoison implements transfer.Observer.
func (l *logObserver) OnPoison(id transfer.RequestID, slot int, reason string) {
	l.log.Warn("staging slot poisoned: out of circulation for good",
		append(l.requestFields(id, -1), zap.Int("slot", slot), zap.String("reason", reason))...)
}

// OnProgress implements transfer.Observer; it logs nothing (see NewLogObserver).
func (l *logObserver) OnProgress(transfer.RequestID, int64, time.Time) {}

// OnPeerConnected implements transfer.Observer's optional method.
func (l *logObserver) OnPeerConnected(peer transfer.Peer) {
	l.log.Debug("peer connected", zap.String("peer", peer.Short()))
}

// OnPeerLost implements transfer.Observer's optional method.
func (l *logObserver) OnPeerLost(peer transfer.Peer, err error) {
	l.log.Warn("peer lost", zap.String("peer", peer.Short()), zap.NamedError("reason", err))
}

// OnHelloRefused implements transfer.Observer's optional method.
func (l *logObserver) OnHelloRefused(peer transfer.Peer, reason string) {
	l.log.Warn("hello proof refused", zap.String("peer", peer.Short()), zap.String("reason", reason))
}

// OnAuthRefused implements transfer.Observer's optional method.
func (l *logObserver) OnAuthRefused(err *transfer.AuthError) {
	l.log.Warn("unauthenticated peer message refused", zap.String("peer", err.Peer.Short()), zap.String("what", err.What),
		zap.Stringer("reason", err.Reason))
}
